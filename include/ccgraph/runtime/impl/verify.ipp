// ccgraph/runtime/impl/verify.ipp: the non-template functions of
// <ccgraph/runtime/verify.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/runtime/verify.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::vector<collective_entry> collective_entries(const graph& g, int rank) {
  std::vector<collective_entry> out;
  for (const node* n : g.nodes()) {
    if (!n->is_collective()) continue;
    if (auto* b = std::get_if<ops::batch_isend_irecv>(&n->kind())) {
      for (const auto& t : ops::p2p_transfers(*b, rank, *n->group())) {
        const ops::signature sig(t.op, {}, t.pair);
        out.push_back({sig.ranks, sig.str(), static_cast<std::int64_t>(out.size()), site_str(n->source())});
      }
      continue;
    }
    std::vector<tensor_meta> in;
    for (auto& a : n->args()) in.push_back(a.src->meta(a.index));
    const ops::signature sig(*n->collective(), in, *n->group());
    out.push_back({sig.ranks, sig.str(), static_cast<std::int64_t>(out.size()), site_str(n->source())});
  }
  return out;
}

CCGRAPH_DECL std::vector<std::uint8_t> serialize_entries(const std::vector<collective_entry>& es) {
  std::vector<std::uint8_t> out;
  auto put = [&](std::int64_t v) {
    const std::size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, &v, sizeof v);
  };
  put(static_cast<std::int64_t>(es.size()));
  for (const auto& e : es) {
    put(static_cast<std::int64_t>(e.ranks.size()));
    for (int r : e.ranks) put(r);
    put(static_cast<std::int64_t>(e.text.size()));
    out.insert(out.end(), e.text.begin(), e.text.end());
    put(static_cast<std::int64_t>(e.site.size()));
    out.insert(out.end(), e.site.begin(), e.site.end());
  }
  return out;
}

CCGRAPH_DECL std::vector<collective_entry> deserialize_entries(const std::uint8_t* p, std::int64_t size, int rank) {
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
    auto get_text = [&](std::string& into) {
      const std::int64_t len = get();
      CCGRAPH_CHECK(len >= 0 && at + len <= size, "verify_collective_order: malformed sequence from rank ", rank);
      into.assign(reinterpret_cast<const char*>(p + at), static_cast<std::size_t>(len));
      at += len;
    };
    get_text(es[i].text);
    get_text(es[i].site);
  }
  return es;
}

CCGRAPH_DECL std::vector<const collective_entry*> with_peer(const std::vector<collective_entry>& seq, int peer) {
  std::vector<const collective_entry*> out;
  for (const auto& e : seq)
    if (std::find(e.ranks.begin(), e.ranks.end(), peer) != e.ranks.end()) out.push_back(&e);
  return out;
}

}  // namespace detail

CCGRAPH_DECL void verify_collective_order(const graph& g, rank_context& ctx) {
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
      return detail::concat("rank ", r, " issues ", s[k]->text, " (its collective #", s[k]->index, ")",
                            s[k]->site.empty() ? "" : " at " + s[k]->site);
    return detail::concat("rank ", r, " issues no more collectives with rank ", peer, " (it has ", s.size(), ")");
  };
  CCGRAPH_THROW(collective_mismatch_error, "verify_collective_order: ranks ", a, " and ", b,
                " differ at their collective #", k, " with each other: ", side(a, b, sa), " but ",
                side(b, a, sb));
}

}  // namespace ccgraph
