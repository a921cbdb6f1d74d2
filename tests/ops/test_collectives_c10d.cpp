// tests/ops/test_collectives_c10d.cpp: the rest of c10d's collectives in
// ccgraph/ops/collectives.hpp (reduce, gather, scatter, barrier, the list forms of all_gather
// and all_to_all) on the threads backend, every dtype against values computed by hand, their
// errors, and traced graphs running equal to eager.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/runtime/verify.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace c10d_test {

/// Rank `r`'s value at element i: (r + 2 i) mod 4 + 1 ([1, 4]: sums and products of up to 4
/// ranks are exact in every dtype but bool, where it is the parity).
template <class T>
T value_of(int r, std::int64_t i) {
  const int x = static_cast<int>((r + 2 * i) % 4 + 1);
  if constexpr (std::is_same_v<T, bool>) return x % 2 == 1;
  else return static_cast<T>(x);
}

template <class T>
cg::tensor<T> tensor_of(int r, const cg::shape_t& shape) {
  std::vector<T> v;
  for (std::int64_t i = 0; i < cg::numel_of(shape); ++i) v.push_back(value_of<T>(r, i));
  return cg::tensor<T>::from(v, shape);
}

/// The reduction over ranks 0..n-1 of element i, by hand (sum, product, max on the values).
template <class T>
T reduced(cg::reduce_op op, int n, std::int64_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    bool any = false, all = true;
    for (int r = 0; r < n; ++r) any = any || value_of<bool>(r, i), all = all && value_of<bool>(r, i);
    return op == cg::reduce_op::product ? all : any;
  } else {
    double acc = op == cg::reduce_op::product ? 1 : op == cg::reduce_op::max ? -1e9 : 0;
    for (int r = 0; r < n; ++r) {
      const double v = static_cast<double>(static_cast<cg::compute_t<T>>(value_of<T>(r, i)));
      acc = op == cg::reduce_op::product ? acc * v : op == cg::reduce_op::max ? std::max(acc, v) : acc + v;
    }
    return static_cast<T>(acc);
  }
}

}  // namespace c10d_test

using namespace c10d_test;

TEST_CASE("reduce.every_dtype_and_op") {
  for (int n : {1, 2, 3, 4})
    for (cg::dtype d : every_dtype)
      for (cg::reduce_op op : {cg::reduce_op::sum, cg::reduce_op::product, cg::reduce_op::max})
        cg::visit_dtype(d, [&](auto tag) {
          using T = decltype(tag);
          run(n, [&](cg::rank_context& ctx) {
            const int r = ctx.rank(), dst = n - 1;
            const cg::shape_t shape{2, 3};
            auto got = cg::reduce(tensor_of<T>(r, shape), dst, op, iota_ranks(n)).to_vector();
            for (std::int64_t i = 0; i < 6; ++i)
              CHECK(got[static_cast<std::size_t>(i)] == (r == dst ? reduced<T>(op, n, i) : value_of<T>(r, i)));
          });
        });
}

TEST_CASE("reduce.errors") {
  run(2, [](cg::rank_context&) {
    CHECK(contains(error_of([] { (void)cg::reduce(cg::zeros<float>({2}), 5, "sum", std::vector<int>{0, 1}); }),
                   "reduce: dst rank 5 is not a member of group [0, 1]"));
    CHECK(contains(error_of([] { (void)cg::reduce(cg::zeros<float>({2}), 0, "band", std::vector<int>{0, 1}); }),
                   "reduce: reduce op band needs an integer or bool tensor, got f32"));
  });
}

TEST_CASE("gather.every_dtype") {
  for (int n : {1, 2, 3, 4})
    for (cg::dtype d : every_dtype)
      cg::visit_dtype(d, [&](auto tag) {
        using T = decltype(tag);
        run(n, [&](cg::rank_context& ctx) {
          const int r = ctx.rank(), dst = n / 2;
          auto got = cg::gather(tensor_of<T>(r, {3}), dst, iota_ranks(n));
          if (r != dst) {
            CHECK(got.empty());
            return;
          }
          REQUIRE(static_cast<int>(got.size()) == n);
          for (int k = 0; k < n; ++k) CHECK(got[static_cast<std::size_t>(k)].to_vector() == tensor_of<T>(k, {3}).to_vector());
        });
      });
}

TEST_CASE("scatter.every_dtype") {
  for (int n : {1, 2, 3, 4})
    for (cg::dtype d : every_dtype)
      cg::visit_dtype(d, [&](auto tag) {
        using T = decltype(tag);
        run(n, [&](cg::rank_context& ctx) {
          const int r = ctx.rank(), src = 0;
          // Only src's values matter: the others pass zeros of the same shape.
          auto t = r == src ? tensor_of<T>(7, {2 * n, 2}) : cg::zeros<T>({2 * n, 2});
          auto got = cg::scatter(t, src, iota_ranks(n));
          CHECK(got.shape() == cg::shape_t{2, 2});
          std::vector<T> want;
          for (std::int64_t i = 0; i < 4; ++i) want.push_back(value_of<T>(7, 4 * r + i));
          CHECK(got.to_vector() == want);
        });
      });
}

TEST_CASE("scatter.gather.errors") {
  run(2, [](cg::rank_context&) {
    const cg::group w = std::vector<int>{0, 1};
    CHECK(contains(error_of([&] { (void)cg::scatter(cg::zeros<float>({3}), 0, w); }),
                   "scatter: dim 0 (size 3) must be a multiple of group_size 2"));
    CHECK(contains(error_of([&] { (void)cg::scatter(cg::zeros<float>({2}), 4, w); }),
                   "scatter: src rank 4 is not a member of group [0, 1]"));
    CHECK(contains(error_of([&] { (void)cg::gather(cg::zeros<float>({2}), 3, w); }),
                   "gather: dst rank 3 is not a member of group [0, 1]"));
  });
  // Members whose tensors differ in shape fail on both ends of the transfer, not hang.
  std::vector<std::string> errs(2);
  try {
    cg::run_threads(2, [&](cg::rank_context& ctx) {
      try {
        for (auto& t : cg::gather(cg::zeros<float>({ctx.rank() + 1}), 0, std::vector<int>{0, 1})) t.wait();
      } catch (const std::exception& e) {
        errs[static_cast<std::size_t>(ctx.rank())] = e.what();
        throw;
      }
    }, threads_opts(std::chrono::seconds(5)));
  } catch (const std::exception&) {
  }
  for (auto& e : errs) CHECK_MESSAGE(contains(e, "transfer of f32[2] from rank 1 to rank 0"), e);
}

TEST_CASE("all_gather.list.every_dtype") {
  for (int n : {1, 2, 3})
    for (cg::dtype d : every_dtype)
      cg::visit_dtype(d, [&](auto tag) {
        using T = decltype(tag);
        run(n, [&](cg::rank_context& ctx) {
          auto got = cg::all_gather(tensor_of<T>(ctx.rank(), {2, 2}), iota_ranks(n));
          REQUIRE(static_cast<int>(got.size()) == n);
          for (int k = 0; k < n; ++k) CHECK(got[static_cast<std::size_t>(k)].to_vector() == tensor_of<T>(k, {2, 2}).to_vector());
        });
      });
}

TEST_CASE("all_to_all.list.uneven_shapes") {
  // Rank r sends rank j a tensor of j + r + 1 rows: the output list's shapes follow.
  for (int n : {1, 2, 3, 4})
    for (cg::dtype d : every_dtype)
      cg::visit_dtype(d, [&](auto tag) {
        using T = decltype(tag);
        run(n, [&](cg::rank_context& ctx) {
          const int r = ctx.rank();
          std::vector<cg::tensor<T>> ins, likes;
          for (int j = 0; j < n; ++j) {
            ins.push_back(tensor_of<T>(10 * r + j, {j + r + 1, 2}));
            likes.push_back(cg::zeros<T>({j + r + 1, 2}));
          }
          auto got = cg::all_to_all(likes, ins, iota_ranks(n));
          REQUIRE(static_cast<int>(got.size()) == n);
          for (int j = 0; j < n; ++j) CHECK(got[static_cast<std::size_t>(j)].to_vector() == tensor_of<T>(10 * j + r, {j + r + 1, 2}).to_vector());
        });
      });
  run(2, [](cg::rank_context& ctx) {
    const std::vector<cg::tensor<float>> two{cg::zeros<float>({1}), cg::zeros<float>({1})};
    CHECK(contains(error_of([&] { (void)cg::all_to_all(two, {two[0]}, std::vector<int>{0, 1}); }),
                   "all_to_all: input_tensor_list has 1 tensors for group_size 2"));
    const std::vector<cg::tensor<float>> other{cg::zeros<float>({2}), cg::zeros<float>({2})};
    CHECK(contains(error_of([&] { (void)cg::all_to_all(other, two, std::vector<int>{0, 1}); }),
                   "all_to_all: rank " + std::to_string(ctx.rank()) + " sends itself [1] but expects [2]"));
  });
}

TEST_CASE("barrier.holds_every_rank_until_all_arrive") {
  std::atomic<int> arrived{0};
  std::vector<int> seen(3, -1);
  run(3, [&](cg::rank_context& ctx) {
    if (ctx.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ++arrived;
    cg::barrier(iota_ranks(3));
    seen[static_cast<std::size_t>(ctx.rank())] = arrived.load();
  });
  CHECK(seen == std::vector<int>{3, 3, 3});
}

TEST_CASE("c10d_rest.traced.equal_to_eager_and_verified") {
  run(3, [](cg::rank_context& ctx) {
    const cg::group w = iota_ranks(3);
    auto program = [&](auto x) {
      auto red = cg::reduce(x, 1, "sum", w);
      auto sc = cg::scatter(cg::eval(red * 2.0f), 1, w);
      auto parts = cg::gather(sc, 0, w);
      auto ag = cg::all_gather(sc, w);
      auto y = cg::eval(ag[0] + ag[2] + sc);
      for (auto& p : parts) y = cg::eval(y + p);
      return y;
    };
    const auto x = cg::uniform<float>({6, 2}, -1, 1, 5 + static_cast<std::uint64_t>(ctx.rank()));
    const auto eager = program(x).to_vector();
    auto g = cg::trace(program, cg::input<float>({6, 2}));
    cg::verify_collective_order(g, ctx);
    CHECK(cg::compile(g, ctx)(x).to_vector() == eager);
    auto s = cg::schedule(g, {"bucket_collectives", "overlap"});
    cg::verify_collective_order(s, ctx);
    CHECK(cg::compile(s, ctx)(x).to_vector() == eager);
  });
}
