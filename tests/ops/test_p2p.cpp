// tests/ops/test_p2p.cpp: point-to-point of ccgraph/ops/collectives.hpp (isend/irecv,
// batch_isend_irecv, send, recv) on the threads backend: every dtype against values computed by
// hand, batches whose ranks list their transfers in different orders, mismatches (shape, dtype,
// peer, a send nobody receives) failing on every rank within the timeout, and traced graphs
// that keep the transfers in order, pass the verifier and run equal to eager.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/runtime/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace p2p_test {

/// Rank `r`'s data for tag `k`: element i is (r * 7 + k * 3 + i) mod 5, which every dtype holds
/// exactly (bool: its parity).
template <class T>
std::vector<T> data_of(int r, int k, std::int64_t n) {
  std::vector<T> v;
  for (std::int64_t i = 0; i < n; ++i) {
    const int x = static_cast<int>((r * 7 + k * 3 + i) % 5);
    if constexpr (std::is_same_v<T, bool>) v.push_back(x % 2 == 1);
    else v.push_back(static_cast<T>(x));
  }
  return v;
}

template <class T>
cg::tensor<T> tensor_of(int r, int k, const cg::shape_t& shape) {
  return cg::tensor<T>::from(data_of<T>(r, k, cg::numel_of(shape)), shape);
}

std::vector<int> world_of(int n) { return iota_ranks(n); }

/// Each rank's error message (empty where it threw none) after `fn` runs on `n` ranks with a
/// short timeout; also checks the whole run ended well within the timeout's double.
template <class F>
std::vector<std::string> errors_on(int n, F fn, std::chrono::milliseconds timeout = std::chrono::seconds(3)) {
  std::vector<std::string> out(static_cast<std::size_t>(n));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    cg::run_threads(n, [&](cg::rank_context& ctx) {
      try {
        fn(ctx);
      } catch (const std::exception& e) {
        out[static_cast<std::size_t>(ctx.rank())] = e.what();
        throw;
      }
    }, threads_opts(timeout));
  } catch (const std::exception&) {
  }
  CHECK(seconds_since(t0) < 2.0 * std::chrono::duration<double>(timeout).count() + 1.0);
  return out;
}

}  // namespace p2p_test

using namespace p2p_test;

TEST_CASE("p2p.ring.every_dtype") {
  for (int n : {2, 3, 4}) {
    for (cg::dtype d : every_dtype) {
      cg::visit_dtype(d, [&](auto tag) {
        using T = decltype(tag);
        run(n, [&](cg::rank_context& ctx) {
          const int r = ctx.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
          const cg::shape_t shape{3, 2};
          auto got = cg::batch_isend_irecv({cg::isend(tensor_of<T>(r, 0, shape), next),
                                            cg::irecv(cg::zeros<T>(shape), prev)},
                                           world_of(n));
          REQUIRE(got.size() == 1);
          CHECK(got[0].shape() == shape);
          CHECK(got[0].to_vector() == data_of<T>(prev, 0, 6));
        });
      });
    }
  }
}

TEST_CASE("p2p.send_recv.blocking_in_program_order") {
  // A chain 0 -> 1 -> 2 -> 3, each rank adding its rank: what a pipeline does.
  run(4, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    const cg::group w = world_of(4);
    auto x = r == 0 ? cg::full<float>({4}, 1.0f) : cg::recv(cg::zeros<float>({4}), r - 1, w);
    auto y = (x + static_cast<float>(r)).eval();
    if (r < 3) cg::send(y, r + 1, w);
    else CHECK(y.to_vector() == std::vector<float>(4, 1.0f + 1 + 2 + 3));
  });
}

TEST_CASE("p2p.batch.order_within_a_batch_does_not_matter") {
  // Rank 0 lists (send, send, recv), rank 1 (recv, recv, send) in reverse: both sends from 0
  // still arrive in order, and the exchange completes (as one NCCL group does).
  run(2, [](cg::rank_context& ctx) {
    const cg::group w = world_of(2);
    const int r = ctx.rank();
    const auto a = tensor_of<std::int64_t>(r, 1, {5}), b = tensor_of<std::int64_t>(r, 2, {2});
    if (r == 0) {
      auto got = cg::batch_isend_irecv({cg::isend(a, 1), cg::isend(b, 1), cg::irecv(cg::zeros<std::int64_t>({3}), 1)}, w);
      CHECK(got[0].to_vector() == data_of<std::int64_t>(1, 3, 3));
    } else {
      auto got = cg::batch_isend_irecv({cg::isend(tensor_of<std::int64_t>(1, 3, {3}), 0),
                                        cg::irecv(cg::zeros<std::int64_t>({5}), 0), cg::irecv(cg::zeros<std::int64_t>({2}), 0)},
                                       w);
      REQUIRE(got.size() == 2);
      CHECK(got[0].to_vector() == data_of<std::int64_t>(0, 1, 5));
      CHECK(got[1].to_vector() == data_of<std::int64_t>(0, 2, 2));
    }
  });
}

TEST_CASE("p2p.batch.all_pairs_exchange_world4") {
  // Every rank exchanges with every other rank in one batch, listing peers in a rank-dependent
  // order: the pairs' global order keeps it from deadlocking.
  run(4, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    std::vector<cg::p2p_op<cg::tensor<float>>> ops;
    std::vector<int> peers;
    for (int k = 1; k < 4; ++k) peers.push_back((r + k) % 4);
    for (int p : peers) ops.push_back(cg::isend(tensor_of<float>(r, p, {2}), p));
    for (auto it = peers.rbegin(); it != peers.rend(); ++it) ops.push_back(cg::irecv(cg::zeros<float>({2}), *it));
    auto got = cg::batch_isend_irecv(ops, world_of(4));
    REQUIRE(got.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) CHECK(got[i].to_vector() == data_of<float>(peers[2 - i], r, 2));
  });
}

TEST_CASE("p2p.tagged_group_and_subgroup") {
  run(3, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    if (r == 2) return;
    const cg::group g{std::vector<int>{0, 1}, "pp"};
    if (r == 0) cg::send(cg::full<double>({2}, 2.5), 1, g);
    else CHECK(cg::recv(cg::zeros<double>({2}), 0, g).to_vector() == std::vector<double>{2.5, 2.5});
  });
}

TEST_CASE("p2p.errors.bad_peer_at_issue") {
  run(2, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    CHECK(contains(error_of([&] { cg::send(cg::zeros<float>({1}), r, world_of(2)); }),
                   "batch_isend_irecv: Invalid destination rank: destination rank " + std::to_string(r) +
                       " should not be the same as the rank of the current process"));
    CHECK(contains(error_of([&] { (void)cg::recv(cg::zeros<float>({1}), 5, world_of(2)); }),
                   "batch_isend_irecv: peer rank 5 of irecv at index 0 is not a member of group [0, 1]"));
    CHECK(contains(error_of([&] { (void)cg::recv(cg::zeros<float>({1}), 1, std::vector<int>{0}); }),
                   "is not a member of group [0]"));
  });
}

TEST_CASE("p2p.errors.shape_mismatch_on_both_ranks") {
  auto errs = errors_on(2, [](cg::rank_context& ctx) {
    if (ctx.rank() == 0) cg::send(cg::zeros<float>({4}), 1, world_of(2));
    else (void)cg::recv(cg::zeros<float>({3}), 0, world_of(2));
  });
  for (auto& e : errs) {
    CHECK(contains(e, "transfer of f32[4] from rank 0 to rank 1"));
    CHECK(contains(e, "transfer of f32[3] from rank 0 to rank 1"));
  }
}

TEST_CASE("p2p.errors.one_direction_in_two_orders_is_refused") {
  // Rank 1 sends b then a; rank 0 receives a then b. NCCL matches a peer's transfers in order, so
  // the sizes would cross: both ranks get the mismatch instead.
  auto errs = errors_on(2, [](cg::rank_context& ctx) {
    const auto a = cg::zeros<float>({5, 3}), b = cg::zeros<float>({7});
    if (ctx.rank() == 0)  // the received tensors are pending: their wait reports the failure
      for (const auto& t : cg::batch_isend_irecv({cg::irecv(a, 1), cg::irecv(b, 1)}, world_of(2))) cg::wait_tensor(t);
    else
      (void)cg::batch_isend_irecv({cg::isend(b, 0), cg::isend(a, 0)}, world_of(2));
  });
  for (std::size_t r = 0; r < errs.size(); ++r) {
    INFO("rank " << r << ": " << errs[r]);
    CHECK(contains(errs[r], "collective mismatch"));
    CHECK(contains(errs[r], "transfer of f32[7] from rank 1 to rank 0"));
    CHECK(contains(errs[r], "transfer of f32[5, 3] from rank 1 to rank 0"));
  }
}

TEST_CASE("p2p.errors.dtype_mismatch_on_both_ranks") {
  auto errs = errors_on(2, [](cg::rank_context& ctx) {
    if (ctx.rank() == 0) cg::send(cg::zeros<float>({4}), 1, world_of(2));
    else (void)cg::recv(cg::zeros<std::int32_t>({4}), 0, world_of(2));
  });
  for (auto& e : errs) {
    CHECK(contains(e, "collective mismatch"));
    CHECK(contains(e, "transfer of i32[4] from rank 0 to rank 1"));
  }
}

TEST_CASE("p2p.errors.send_without_recv_fails_both_ranks") {
  // Rank 1 returns without receiving: rank 0's send fails at once, not at the timeout.
  auto errs = errors_on(2, [](cg::rank_context& ctx) {
    if (ctx.rank() == 0) cg::send(cg::zeros<float>({4}), 1, world_of(2));
  }, std::chrono::seconds(30));
  CHECK(contains(errs[0], "transfer of f32[4] from rank 0 to rank 1"));
  CHECK(contains(errs[0], "rank 1 returned from its function without issuing it"));
}

TEST_CASE("p2p.errors.wrong_peer_fails_every_involved_rank") {
  // Rank 0 sends to 1, but rank 1 receives from 2 and rank 2 waits for rank 0: a cycle of
  // waits every rank hears about (a deadlock or a rank that returned), never a hang.
  auto errs = errors_on(3, [](cg::rank_context& ctx) {
    const cg::group w = world_of(3);
    if (ctx.rank() == 0) cg::send(cg::zeros<float>({2}), 1, w);
    if (ctx.rank() == 1) (void)cg::recv(cg::zeros<float>({2}), 2, w);
    if (ctx.rank() == 2) (void)cg::recv(cg::zeros<float>({2}), 0, w);
  });
  for (auto& e : errs) CHECK(!e.empty());
  CHECK((contains(errs[0], "collective mismatch") || contains(errs[0], "aborted")));
}

TEST_CASE("p2p.errors.both_send_first_is_a_mismatch_not_a_hang") {
  // Two blocking sends facing each other would deadlock; the pair's first transfer disagrees
  // about its direction, so both ranks fail at issue.
  auto errs = errors_on(2, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    cg::send(cg::zeros<float>({2}), 1 - r, world_of(2));
    (void)cg::recv(cg::zeros<float>({2}), 1 - r, world_of(2));
  });
  for (auto& e : errs) {
    CHECK(contains(e, "transfer of f32[2] from rank 0 to rank 1"));
    CHECK(contains(e, "transfer of f32[2] from rank 1 to rank 0"));
  }
}

TEST_CASE("p2p.errors.timeout_names_the_transfer") {
  // Rank 1 is busy elsewhere (sleeping) past the timeout: rank 0's send times out naming it.
  auto errs = errors_on(2, [](cg::rank_context& ctx) {
    if (ctx.rank() == 0) cg::send(cg::zeros<float>({2}), 1, world_of(2));
    else std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }, std::chrono::milliseconds(200));
  CHECK(contains(errs[0], "timed out"));
  CHECK(contains(errs[0], "batch_isend_irecv"));
}

// ---- traced graphs ----

namespace p2p_test {
/// A two-stage pipeline step: rank 0 computes and sends, rank 1 receives, computes, sends back.
auto pipeline_program(int rank) {
  return [rank](auto x) {
    const cg::group w = world_of(2);
    if (rank == 0) {
      auto h = cg::eval(x * 2.0f);
      cg::send(h, 1, w);
      return cg::recv(h, 1, w);
    }
    auto h = cg::recv(x, 0, w);
    auto y = cg::eval(h + 1.0f);
    auto got = cg::batch_isend_irecv({cg::isend(y, 0)}, w);
    (void)got;
    return cg::eval(y * 3.0f);
  };
}
}  // namespace p2p_test

TEST_CASE("p2p.traced.in_order_verified_and_equal_to_eager") {
  run(2, [](cg::rank_context& ctx) {
    const int r = ctx.rank();
    auto program = pipeline_program(r);
    const auto x = cg::full<float>({2, 3}, static_cast<float>(r + 1));
    const auto eager = program(x).to_vector();
    auto g = cg::trace(program, cg::input<float>({2, 3}));
    std::vector<std::string> seq;
    for (auto& s : cg::op_sequence(g))
      if (s == "batch_isend_irecv" || s == "wait_tensor") seq.push_back(s);
    // Rank 0: the send (no output, no wait), then the receive and its wait; rank 1 the reverse.
    const std::string b = "batch_isend_irecv", w = "wait_tensor";
    CHECK(seq == (r == 0 ? std::vector<std::string>{b, b, w} : std::vector<std::string>{b, w, b}));
    const std::string text = cg::to_string(g);
    CHECK(contains(text, r == 0 ? "ops=[isend(f32[2, 3], peer=1)]" : "ops=[irecv(f32[2, 3], peer=0)]"));
    cg::verify_collective_order(g, ctx);
    CHECK(cg::compile(g, ctx)(x).to_vector() == eager);
    for (const auto& passes : std::vector<std::vector<std::string>>{{"sink_waits", "raise_comms"},
                                                                     {"bucket_collectives", "overlap"}}) {
      auto s = cg::schedule(g, passes);
      std::vector<std::string> order;
      for (auto& o : cg::op_sequence(s))
        if (o == "batch_isend_irecv") order.push_back(o);
      CHECK(order.size() == 2);
      cg::verify_collective_order(s, ctx);
      CHECK(cg::compile(s, ctx)(x).to_vector() == eager);
    }
  });
}

TEST_CASE("p2p.traced.verifier_names_a_mismatched_transfer") {
  std::vector<std::string> errs(2);
  run(2, [&](cg::rank_context& ctx) {
    const int r = ctx.rank();
    auto program = [r](auto x) {
      if (r == 0) cg::send(x, 1, world_of(2));
      else return cg::recv(cg::eval(cg::cat({x, x}, 0)), 0, world_of(2));
      return cg::eval(x + 0.0f);
    };
    auto g = cg::trace(program, cg::input<float>({2}));
    try {
      cg::verify_collective_order(g, ctx);
    } catch (const cg::collective_mismatch_error& e) {
      errs[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (auto& e : errs) {
    CHECK(contains(e, "transfer of f32[2] from rank 0 to rank 1"));
    CHECK(contains(e, "transfer of f32[4] from rank 0 to rank 1"));
  }
}
