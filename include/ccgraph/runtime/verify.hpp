// ccgraph/runtime/verify.hpp: verify_collective_order, the cross-rank safety check. Every rank
// passes the graph it is about to run; the ranks exchange their sequences of collectives through
// the backend and all reach the same verdict, so a program that would hang or mismatch at run
// time (a rank-dependent shape, an extra collective, a pass that looked at rank-local data) is
// reported before it runs, naming the first difference.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {
namespace detail {

/// One collective as verify_collective_order compares it: its group's (global) ranks, the
/// call-shaped text of its ops::signature (equal texts for equal signatures, "?" where ranks may
/// legitimately differ), and its position among its rank's collectives.
struct collective_entry {
  std::vector<int> ranks;
  std::string text;
  std::int64_t index = 0;
};

/// The collectives of `g`, run by `rank`, in program order; a batch of point-to-point
/// transfers as its transfers, each over its pair (ops::p2p_transfers), as the backends match them.
inline std::vector<collective_entry> collective_entries(const graph& g, int rank) {
  std::vector<collective_entry> out;
  for (const node* n : g.nodes()) {
    if (!n->is_collective()) continue;
    if (auto* b = std::get_if<ops::batch_isend_irecv>(&n->kind())) {
      for (const auto& t : ops::p2p_transfers(*b, rank, *n->group())) {
        const ops::signature sig(t.op, {}, t.pair);
        out.push_back({sig.ranks, sig.str(), static_cast<std::int64_t>(out.size())});
      }
      continue;
    }
    std::vector<tensor_meta> in;
    for (auto& a : n->args()) in.push_back(a.src->meta(a.index));
    const ops::signature sig(*n->collective(), in, *n->group());
    out.push_back({sig.ranks, sig.str(), static_cast<std::int64_t>(out.size())});
  }
  return out;
}

/// Bytes of a sequence: per entry the rank count, the ranks, the text length and the text
/// (native 64-bit integers: every rank of one world runs this same code on one kind of host).
inline std::vector<std::uint8_t> serialize_entries(const std::vector<collective_entry>& es) {
  std::vector<std::uint8_t> out;
  auto put = [&](std::int64_t v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  };
  put(static_cast<std::int64_t>(es.size()));
  for (const auto& e : es) {
    put(static_cast<std::int64_t>(e.ranks.size()));
    for (int r : e.ranks) put(r);
    put(static_cast<std::int64_t>(e.text.size()));
    out.insert(out.end(), e.text.begin(), e.text.end());
  }
  return out;
}

/// The inverse of serialize_entries on `size` bytes at `p` (rank `rank`'s, for errors).
inline std::vector<collective_entry> deserialize_entries(const std::uint8_t* p, std::int64_t size, int rank) {
  std::int64_t at = 0;
  auto get = [&]() {
    CCGRAPH_CHECK(at + 8 <= size, "verify_collective_order: malformed sequence from rank ", rank);
    std::int64_t v;
    std::memcpy(&v, p + at, sizeof v);
    at += 8;
    return v;
  };
  std::vector<collective_entry> es(static_cast<std::size_t>(get()));
  for (std::size_t i = 0; i < es.size(); ++i) {
    es[i].index = static_cast<std::int64_t>(i);
    es[i].ranks.resize(static_cast<std::size_t>(get()));
    for (int& r : es[i].ranks) r = static_cast<int>(get());
    const std::int64_t len = get();
    CCGRAPH_CHECK(len >= 0 && at + len <= size, "verify_collective_order: malformed sequence from rank ", rank);
    es[i].text.assign(reinterpret_cast<const char*>(p + at), static_cast<std::size_t>(len));
    at += len;
  }
  return es;
}

/// `seq`'s collectives whose group contains rank `peer`.
inline std::vector<const collective_entry*> with_peer(const std::vector<collective_entry>& seq, int peer) {
  std::vector<const collective_entry*> out;
  for (const auto& e : seq)
    if (std::find(e.ranks.begin(), e.ranks.end(), peer) != e.ranks.end()) out.push_back(&e);
  return out;
}

}  // namespace detail

/// Checks that the graphs every rank of `ctx`'s world passes issue matching collectives: for
/// each pair of ranks (a, b), the k-th collective a issues in a group containing b must be the
/// k-th one b issues in a group containing a, equal as ops::signature defines (op, attributes,
/// group, input dtypes and shapes; all_to_all_single's split sizes may differ). Groups that do
/// not contain both (MPMD subgroups, collectives of other ranks) are not compared. Collective:
/// every rank of the world must call it. The sequences travel as all_gathers over the world on
/// the calling rank's backend, so every rank sees all of them and reaches the same verdict; on a
/// difference every rank throws ccgraph::collective_mismatch_error naming the pair of ranks,
/// the position and both collectives of the earliest difference (smallest position, then the
/// lowest pair).
inline void verify_collective_order(const graph& g, rank_context& ctx) {
  detail::rank_scope scope(ctx);
  const int world = ctx.world_size();
  const std::vector<std::uint8_t> mine = detail::serialize_entries(detail::collective_entries(g, ctx.rank()));

  // On the rank's device, so that it runs on the nccl backend as on threads.
  const auto len = tensor<std::int64_t>::from({static_cast<std::int64_t>(mine.size())}, {1}).to(ctx.device());
  const std::vector<std::int64_t> lens = all_gather_tensor(len, 0, ctx.world()).to_vector();
  const std::int64_t width = *std::max_element(lens.begin(), lens.end());
  std::vector<std::uint8_t> padded = mine;
  padded.resize(static_cast<std::size_t>(width), 0);
  const auto bytes = tensor<std::uint8_t>::from(padded, {width}).to(ctx.device());
  const std::vector<std::uint8_t> all = all_gather_tensor(bytes, 0, ctx.world()).to_vector();

  std::vector<std::vector<detail::collective_entry>> seqs;
  for (int r = 0; r < world; ++r)
    seqs.push_back(detail::deserialize_entries(all.data() + static_cast<std::ptrdiff_t>(r) * width,
                                               lens[static_cast<std::size_t>(r)], r));

  // The earliest difference over all pairs.
  struct difference {
    int a, b;
    std::size_t k;
  };
  std::optional<difference> first;
  for (int a = 0; a < world; ++a)
    for (int b = a + 1; b < world; ++b) {
      const auto sa = detail::with_peer(seqs[static_cast<std::size_t>(a)], b);
      const auto sb = detail::with_peer(seqs[static_cast<std::size_t>(b)], a);
      for (std::size_t k = 0; k < std::max(sa.size(), sb.size()); ++k) {
        if (k < sa.size() && k < sb.size() && sa[k]->text == sb[k]->text) continue;
        if (!first || k < first->k) first = difference{a, b, k};
        break;
      }
    }
  if (!first) return;

  const int a = first->a, b = first->b;
  const std::size_t k = first->k;
  const auto sa = detail::with_peer(seqs[static_cast<std::size_t>(a)], b);
  const auto sb = detail::with_peer(seqs[static_cast<std::size_t>(b)], a);
  auto side = [&](int r, int peer, const std::vector<const detail::collective_entry*>& s) {
    if (k < s.size())
      return detail::concat("rank ", r, " issues ", s[k]->text, " (its collective #", s[k]->index, ")");
    return detail::concat("rank ", r, " issues no more collectives with rank ", peer, " (it has ", s.size(), ")");
  };
  CCGRAPH_THROW(collective_mismatch_error, "verify_collective_order: ranks ", a, " and ", b,
                " differ at their collective #", k, " with each other: ", side(a, b, sa), " but ",
                side(b, a, sb));
}

}  // namespace ccgraph
