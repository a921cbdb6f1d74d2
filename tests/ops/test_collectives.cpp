// tests/ops/test_collectives.cpp: the functional collectives of ccgraph/ops/collectives.hpp,
// checked against a sequential reference computed from every rank's input.
//
// Every rank's input is a pure function of (shape, seed, rank), so each rank can rebuild every
// peer's input and compute the expected result on its own. Data is small and integer-valued
// where exactness matters (so floats reduce exactly); integers and bool are compared exactly,
// floats with a tolerance fitting their precision. Dtypes are iterated at run time through
// cg::visit_dtype, so each checker is instantiated once per element type.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/group/device_mesh.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/runtime/threads.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using cg::shape_t;
using i64 = std::int64_t;
template <class T>
using vec = std::vector<T>;
template <class T>
using vecs = std::vector<std::vector<T>>;

constexpr cg::dtype all_dtypes[] = {cg::dtype::f32, cg::dtype::f64, cg::dtype::i32,
                                    cg::dtype::i64, cg::dtype::u8,  cg::dtype::boolean,
                                    cg::dtype::bf16, cg::dtype::f16};
constexpr cg::reduce_op all_ops[] = {cg::reduce_op::sum, cg::reduce_op::avg, cg::reduce_op::product,
                                     cg::reduce_op::min, cg::reduce_op::max, cg::reduce_op::band,
                                     cg::reduce_op::bor, cg::reduce_op::bxor};
constexpr int worlds[] = {1, 2, 3, 4, 8};

/// Calls `f(T{})` for every element type, chosen at run time.
template <class F>
void for_each_dtype(F&& f) {
  for (cg::dtype d : all_dtypes) cg::visit_dtype(d, f);
}

/// Rank `rank`'s input: small integers ([-3, 3], u8 [0, 3], bool a coin), a pure function of
/// (shape, seed, rank).
template <class T>
cg::tensor<T> make_input(const shape_t& shape, std::uint64_t seed, int rank) {
  const std::uint64_t s = seed * 1000003u + static_cast<std::uint64_t>(rank) * 7919u + 17u;
  if constexpr (std::is_same_v<T, bool>)
    return cg::uniform<bool>(shape, 0.0, 1.0, s);
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return cg::uniform<i64>(shape, 0.0, 4.0, s).template to<T>();
  else
    return cg::uniform<i64>(shape, -3.0, 4.0, s).template to<T>();
}

/// Every member's input, in group order.
template <class T>
vecs<T> inputs_of(const std::vector<int>& ranks, const shape_t& shape, std::uint64_t seed) {
  vecs<T> all;
  for (int r : ranks) all.push_back(make_input<T>(shape, seed, r).to_vector());
  return all;
}

// ---- the sequential reference ----

/// Accumulation type of the reference: the type itself for integers and bool (so u8 wraps mod
/// 256 as it does in PyTorch), double for floating types.
template <class T>
using ref_acc_t = std::conditional_t<std::is_integral_v<T>, T, double>;

template <class T>
ref_acc_t<T> widen(T v) {
  if constexpr (std::is_integral_v<T>) return v;
  else return static_cast<double>(static_cast<cg::compute_t<T>>(v));
}

template <class T>
double as_double(T v) {
  return static_cast<double>(static_cast<cg::compute_t<T>>(v));
}

/// True when c10d accepts `op` on element type T.
template <class T>
bool op_valid(cg::reduce_op op) {
  if (cg::is_bitwise(op) && cg::is_floating(cg::dtype_v<T>)) return false;
  if (std::is_same_v<T, bool> && op == cg::reduce_op::avg) return false;
  return true;
}

/// The error text a rejected (op, T) pair gives.
template <class T>
std::string op_error(const char* what, cg::reduce_op op) {
  if (std::is_same_v<T, bool>)
    return cg::detail::concat(what, ": reduce op avg is not supported for bool tensors");
  return cg::detail::concat(what, ": reduce op ", op, " needs an integer or bool tensor, got ",
                            cg::dtype_v<T>);
}

/// out[i] = ins[0][i] op ins[1][i] op ... in order; bool as c10d/NCCL (sum/max = or,
/// product/min = and); avg is the sum divided by the count (truncating for integers).
template <class T>
vec<T> ref_reduce(const vecs<T>& ins, cg::reduce_op op) {
  using A = ref_acc_t<T>;
  using R = cg::reduce_op;
  vec<T> out(ins.front().size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    A acc = widen<T>(ins[0][i]);
    for (std::size_t k = 1; k < ins.size(); ++k) {
      const A b = widen<T>(ins[k][i]);
      if constexpr (std::is_same_v<A, bool>) {
        if (op == R::sum || op == R::max || op == R::bor) acc = acc || b;
        else if (op == R::bxor) acc = acc != b;
        else acc = acc && b;
      } else {
        using K = cg::reduce_kind;
        switch (op.kind()) {
          case K::sum:
          case K::avg: acc = static_cast<A>(acc + b); break;
          case K::product: acc = static_cast<A>(acc * b); break;
          case K::min: acc = std::min(acc, b); break;
          case K::max: acc = std::max(acc, b); break;
          case K::premul_sum: FAIL("premul_sum has its own tests (test_collectives_premul_complex.cpp)"); break;
          case K::band:
          case K::bor:
          case K::bxor:
            if constexpr (std::is_integral_v<A>) {
              acc = static_cast<A>(op == R::band ? (acc & b) : op == R::bor ? (acc | b) : (acc ^ b));
            }
            break;
        }
      }
    }
    if constexpr (!std::is_same_v<A, bool>)
      if (op == R::avg) acc = static_cast<A>(acc / static_cast<A>(ins.size()));
    out[i] = cg::detail::cast<T>(acc);
  }
  return out;
}

/// Concatenation of equally shaped row-major blocks along `dim`.
template <class T>
vec<T> ref_concat(const vecs<T>& parts, const shape_t& part_shape, int dim) {
  i64 outer = 1, inner = 1;
  for (int d = 0; d < static_cast<int>(part_shape.size()); ++d)
    (d < dim ? outer : inner) *= part_shape[static_cast<std::size_t>(d)];
  vec<T> out;
  for (i64 o = 0; o < outer; ++o)
    for (auto& p : parts)
      for (i64 i = 0; i < inner; ++i) out.push_back(p[static_cast<std::size_t>(o * inner + i)]);
  return out;
}

/// Elements [start, start+len) along `dim` of a row-major array of `shape`.
template <class T>
vec<T> ref_slice(const vec<T>& v, const shape_t& shape, int dim, i64 start, i64 len) {
  i64 outer = 1, row = 1;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (d < dim) outer *= shape[static_cast<std::size_t>(d)];
    if (d > dim) row *= shape[static_cast<std::size_t>(d)];
  }
  const i64 size = shape[static_cast<std::size_t>(dim)];
  vec<T> out;
  for (i64 o = 0; o < outer; ++o)
    for (i64 i = (o * size + start) * row; i < (o * size + start + len) * row; ++i)
      out.push_back(v[static_cast<std::size_t>(i)]);
  return out;
}

/// Transpose of a row-major [r, c] array.
template <class T>
vec<T> ref_transpose(const vec<T>& v, i64 r, i64 c) {
  vec<T> out;
  for (i64 j = 0; j < c; ++j)
    for (i64 i = 0; i < r; ++i) out.push_back(v[static_cast<std::size_t>(i * c + j)]);
  return out;
}

/// Relative tolerance of comparisons: 0 (exact) for integers and bool.
template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  else if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, cg::bf16>) return 1.0 / 64;
  else if constexpr (std::is_same_v<T, cg::f16>) return 2e-3;
  else return 0.0;
}

/// "" when `got` matches `want`, else where and how they differ.
template <class T>
std::string mismatch(const vec<T>& got, const vec<T>& want) {
  if (got.size() != want.size())
    return cg::detail::concat("size ", got.size(), " instead of ", want.size());
  const double tol = tolerance<T>();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = as_double<T>(got[i]), w = as_double<T>(want[i]);
    const bool ok = tol == 0.0 ? g == w : std::abs(g - w) <= tol * (1.0 + std::abs(w));
    if (!ok)
      return cg::detail::concat("element ", i, " of ", got.size(), " is ", g, ", expected ", w);
  }
  return "";
}

/// Prefix naming the case in failure messages.
std::string where(const cg::rank_context& ctx, cg::dtype dt, const std::string& what) {
  return cg::detail::concat("[rank ", ctx.rank(), "/", ctx.world_size(), " ", dt, " ", what, "] ");
}

std::string upper(std::string_view s) {
  std::string u(s);
  for (auto& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return u;
}

/// Checks `t`'s shape and values (waiting if it is pending); `msg` says which case failed.
/// A function, not a macro: the assertions are instantiated once per dtype, not per call.
template <class T>
void check_tensor(const cg::tensor<T>& t, const vec<T>& want, const shape_t& shape,
                  const std::string& msg) {
  CHECK_MESSAGE(t.shape() == shape, msg, "shape ", cg::shape_str(t.shape()));
  const std::string err = mismatch(t.to_vector(), want);
  CHECK_MESSAGE(err.empty(), msg, err);
}

/// Checks that a collective left its input `t` as it was (`before`).
template <class T>
void check_unchanged(const cg::tensor<T>& t, const vec<T>& before, const std::string& msg) {
  CHECK_MESSAGE(mismatch(t.to_vector(), before).empty(), msg, "input modified");
}

// Non-template checks, so that the per-dtype checkers below instantiate no assertion code.

/// Checks that `f` throws a cg::error whose message contains `part`.
void check_throws(const std::function<void()>& f, const std::string& part, const std::string& msg) {
  std::string got = "nothing was thrown";
  bool ours = false;
  try {
    f();
  } catch (const cg::error& e) {
    got = e.what();
    ours = true;
  } catch (const std::exception& e) {
    got = std::string("not a cg::error: ") + e.what();
  }
  CHECK_MESSAGE((ours && got.find(part) != std::string::npos), msg, "expected an error containing '",
                part, "'; got: ", got);
}

/// CHECK(cond) with the case's description.
void check_that(bool cond, const std::string& msg, const char* what) { CHECK_MESSAGE(cond, msg, what); }

// ---- sweeps: one checker per collective, instantiated once per dtype ----

template <class T>
void check_all_reduce(cg::rank_context& ctx, cg::reduce_op op, std::uint64_t seed) {
  const shape_t shape{3, 5};
  const auto msg = where(ctx, cg::dtype_v<T>, cg::detail::concat("all_reduce ", op));
  auto in = make_input<T>(shape, seed, ctx.rank());
  const auto before = in.to_vector();
  if (!op_valid<T>(op)) {
    check_throws([&] { cg::all_reduce(in, op, ctx.world()); }, op_error<T>("all_reduce", op), msg);
    return;
  }
  // The op as the enum and as an upper-case name: both spellings are the same op.
  auto r = seed % 2 ? cg::all_reduce(in, op, ctx.world())
                    : cg::all_reduce(in, upper(cg::to_string(op)), ctx.world());
  check_that(r.pending_work() != nullptr, msg, "result not pending");
  const auto want = ref_reduce(inputs_of<T>(iota_ranks(ctx.world_size()), shape, seed), op);
  check_tensor(r, want, shape, msg);
  check_unchanged(in, before, msg);
}

void sweep_all_reduce(cg::reduce_op op) {
  for (int n : worlds)
    run(n, [&](cg::rank_context& ctx) {
      std::uint64_t seed = 100 + static_cast<std::uint64_t>(n);
      for_each_dtype([&](auto tag) { check_all_reduce<decltype(tag)>(ctx, op, seed++); });
    });
}

template <class T>
void check_reduce_scatter(cg::rank_context& ctx, cg::reduce_op op, std::int64_t dim,
                          std::uint64_t seed) {
  const int n = ctx.world_size(), me = ctx.rank();
  const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
  shape_t shape{2, 3, 2};
  shape[static_cast<std::size_t>(d)] *= n;
  const auto msg = where(ctx, cg::dtype_v<T>, cg::detail::concat("reduce_scatter_tensor ", op, " dim ", dim));
  auto in = make_input<T>(shape, seed, me);
  const auto before = in.to_vector();
  if (!op_valid<T>(op)) {
    check_throws([&] { cg::reduce_scatter_tensor(in, op, dim, ctx.world()); },
                 op_error<T>("reduce_scatter_tensor", op), msg);
    return;
  }
  auto r = cg::reduce_scatter_tensor(in, op, dim, ctx.world());
  if (d == 0) check_that(r.pending_work() != nullptr, msg, "result not pending");  // dim != 0 may wait
  const auto full = ref_reduce(inputs_of<T>(iota_ranks(n), shape, seed), op);
  const i64 len = shape[static_cast<std::size_t>(d)] / n;
  shape_t out_shape = shape;
  out_shape[static_cast<std::size_t>(d)] = len;
  check_tensor(r, ref_slice(full, shape, d, me * len, len), out_shape, msg);
  check_unchanged(in, before, msg);
}

void sweep_reduce_scatter(cg::reduce_op op) {
  for (int n : worlds)
    run(n, [&](cg::rank_context& ctx) {
      std::uint64_t seed = 200 + static_cast<std::uint64_t>(n);
      for (std::int64_t dim : {0, 1, -1})
        for_each_dtype([&](auto tag) { check_reduce_scatter<decltype(tag)>(ctx, op, dim, seed++); });
    });
}

}  // namespace

// ================================ all_reduce ================================

TEST_CASE("all_reduce.sum") { sweep_all_reduce(cg::reduce_op::sum); }
TEST_CASE("all_reduce.avg") { sweep_all_reduce(cg::reduce_op::avg); }
TEST_CASE("all_reduce.product") { sweep_all_reduce(cg::reduce_op::product); }
TEST_CASE("all_reduce.min") { sweep_all_reduce(cg::reduce_op::min); }
TEST_CASE("all_reduce.max") { sweep_all_reduce(cg::reduce_op::max); }
TEST_CASE("all_reduce.band") { sweep_all_reduce(cg::reduce_op::band); }
TEST_CASE("all_reduce.bor") { sweep_all_reduce(cg::reduce_op::bor); }
TEST_CASE("all_reduce.bxor") { sweep_all_reduce(cg::reduce_op::bxor); }

TEST_CASE("all_reduce.u8_wraps_mod_256") {
  run(3, [](cg::rank_context& ctx) {
    auto in = cg::full<std::uint8_t>({4}, static_cast<std::uint8_t>(200 + ctx.rank()));
    // 200 + 201 + 202 = 603 = 2 * 256 + 91
    CHECK(cg::all_reduce(in, "sum", ctx.world()).to_vector() == vec<std::uint8_t>(4, 91));
    // avg wraps first, then divides (NCCL's sum-then-divide): 91 / 3 = 30
    CHECK(cg::all_reduce(in, "avg", ctx.world()).to_vector() == vec<std::uint8_t>(4, 30));
    // 200 * 201 * 202 = 8120400 = 31720 * 256 + 80
    CHECK(cg::all_reduce(in, "product", ctx.world()).to_vector() == vec<std::uint8_t>(4, 80));
  });
}

TEST_CASE("all_reduce.int32_int64_wrap_like_nccl") {
  // Signed sums and products that overflow wrap modulo 2^32 / 2^64 (two's complement), as NCCL's
  // do, instead of being undefined behaviour (UBSan checks the build of this test).
  using i32 = std::int32_t;
  static constexpr i32 max32 = std::numeric_limits<i32>::max();
  static constexpr i64 max64 = std::numeric_limits<i64>::max();
  run(3, [](cg::rank_context& ctx) {
    auto r32 = [&](i32 v, const char* op) { return cg::all_reduce(cg::full<i32>({2}, v), op, ctx.world()).to_vector(); };
    auto r64 = [&](i64 v, const char* op) { return cg::all_reduce(cg::full<i64>({2}, v), op, ctx.world()).to_vector(); };
    // 3 (2^31 - 1) = 2^32 + 2^31 - 3, which is 2^31 - 3 modulo 2^32.
    CHECK(r32(max32, "sum") == vec<i32>(2, 2147483645));
    CHECK(r32(std::numeric_limits<i32>::min(), "sum") == vec<i32>(2, std::numeric_limits<i32>::min()));  // 3 (-2^31)
    CHECK(r32(1 << 16, "product") == vec<i32>(2, 0));  // 2^48
    CHECK(r32(max32, "product") == vec<i32>(2, max32));  // (2^31 - 1)^3 is 2^31 - 1 modulo 2^32
    CHECK(r64(max64, "sum") == vec<i64>(2, max64 - 2));  // 3 (2^63 - 1) = 2^64 + 2^63 - 3
    CHECK(r64(i64{1} << 32, "product") == vec<i64>(2, 0));  // 2^96
    CHECK(r64(-3, "product") == vec<i64>(2, -27));          // no wrap: ordinary negatives stay exact
    // avg divides the wrapped sum: (2^63 - 3) / 3.
    CHECK(r64(max64, "avg") == vec<i64>(2, (max64 - 2) / 3));
    CHECK(r32(max32, "avg") == vec<i32>(2, 2147483645 / 3));
  });
}

TEST_CASE("all_reduce.u8_avg_on_256_ranks") {
  // The rank count does not fit u8: it used to become 0 and divide by zero.
  constexpr int n = 256;
  std::atomic<int> wrong{0};
  run(n, [&](cg::rank_context& ctx) {
    auto in = cg::full<std::uint8_t>({2}, ctx.rank() < 2 ? std::uint8_t{200} : std::uint8_t{0});
    // 400 wraps to 144, divided by 256 ranks: 0. Max and sum too.
    if (cg::all_reduce(in, "avg", ctx.world()).to_vector() != vec<std::uint8_t>(2, 0)) ++wrong;
    if (cg::all_reduce(in, "sum", ctx.world()).to_vector() != vec<std::uint8_t>(2, 144)) ++wrong;
  });
  CHECK(wrong == 0);
}

TEST_CASE("all_reduce.bool_follows_nccl") {
  run(2, [](cg::rank_context& ctx) {
    const bool mine = ctx.rank() == 0;  // rank 0: true, rank 1: false
    auto in = cg::full<bool>({2}, mine);
    auto reduce = [&](const char* op) { return cg::all_reduce(in, op, ctx.world()).to_vector(); };
    CHECK(reduce("sum") == vec<bool>{true, true});       // or
    CHECK(reduce("max") == vec<bool>{true, true});       // or
    CHECK(reduce("bor") == vec<bool>{true, true});
    CHECK(reduce("product") == vec<bool>{false, false}); // and
    CHECK(reduce("min") == vec<bool>{false, false});     // and
    CHECK(reduce("band") == vec<bool>{false, false});
    CHECK(reduce("bxor") == vec<bool>{true, true});
    CHECK_THROWS_WITH_AS(cg::all_reduce(in, "avg", ctx.world()),
                         "all_reduce: reduce op avg is not supported for bool tensors", cg::error);
  });
}

TEST_CASE("all_reduce.bitwise_on_floats_is_an_error") {
  run(2, [](cg::rank_context& ctx) {
    for (const char* op : {"band", "bor", "bxor"}) {
      CHECK_THROWS_WITH_AS(cg::all_reduce(cg::ones<float>({2}), op, ctx.world()),
                           doctest::Contains(cg::detail::concat("reduce op ", op,
                                                                " needs an integer or bool tensor, got f32")
                                                 .c_str()),
                           cg::error);
      CHECK_THROWS_WITH_AS(cg::all_reduce(cg::ones<cg::bf16>({2}), op, ctx.world()),
                           doctest::Contains("got bf16"), cg::error);
    }
    // The world is still usable afterwards: nothing was issued.
    CHECK(cg::all_reduce(cg::ones<float>({2}), "sum", ctx.world()).to_vector() == vec<float>{2, 2});
  });
}

TEST_CASE("all_reduce.real_valued_floats") {
  for (int n : {2, 3, 8})
    run(n, [](cg::rank_context& ctx) {
      for_each_dtype([&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_integral_v<T>) {
          const shape_t shape{257};
          auto input = [&](int r) { return cg::uniform<T>(shape, -1.0, 1.0, 50 + static_cast<std::uint64_t>(r)); };
          vecs<T> all;
          for (int r = 0; r < ctx.world_size(); ++r) all.push_back(input(r).to_vector());
          for (auto op : {cg::reduce_op::sum, cg::reduce_op::avg, cg::reduce_op::min, cg::reduce_op::max}) {
            auto r = cg::all_reduce(input(ctx.rank()), op, ctx.world());
            check_tensor(r, ref_reduce(all, op), shape,
                         where(ctx, cg::dtype_v<T>, cg::detail::concat("all_reduce ", op)));
          }
        }
      });
    });
}

// ============================ reduce_scatter_tensor ============================

TEST_CASE("reduce_scatter_tensor.sum") { sweep_reduce_scatter(cg::reduce_op::sum); }
TEST_CASE("reduce_scatter_tensor.avg") { sweep_reduce_scatter(cg::reduce_op::avg); }
TEST_CASE("reduce_scatter_tensor.product") { sweep_reduce_scatter(cg::reduce_op::product); }
TEST_CASE("reduce_scatter_tensor.min") { sweep_reduce_scatter(cg::reduce_op::min); }
TEST_CASE("reduce_scatter_tensor.max") { sweep_reduce_scatter(cg::reduce_op::max); }
TEST_CASE("reduce_scatter_tensor.band") { sweep_reduce_scatter(cg::reduce_op::band); }
TEST_CASE("reduce_scatter_tensor.bor") { sweep_reduce_scatter(cg::reduce_op::bor); }
TEST_CASE("reduce_scatter_tensor.bxor") { sweep_reduce_scatter(cg::reduce_op::bxor); }

// ============================== all_gather_tensor ==============================

namespace {
template <class T>
void check_all_gather(cg::rank_context& ctx, std::int64_t dim, std::uint64_t seed) {
  const shape_t shape{2, 3, 2};
  const int n = ctx.world_size();
  const int d = static_cast<int>(dim < 0 ? dim + 3 : dim);
  const auto msg = where(ctx, cg::dtype_v<T>, cg::detail::concat("all_gather_tensor dim ", dim));
  auto in = make_input<T>(shape, seed, ctx.rank());
  const auto before = in.to_vector();
  auto r = cg::all_gather_tensor(in, dim, ctx.world());
  if (d == 0) check_that(r.pending_work() != nullptr, msg, "result not pending");
  shape_t out_shape = shape;
  out_shape[static_cast<std::size_t>(d)] *= n;
  check_tensor(r, ref_concat(inputs_of<T>(iota_ranks(n), shape, seed), shape, d), out_shape, msg);
  check_unchanged(in, before, msg);
}
}  // namespace

TEST_CASE("all_gather_tensor.dims_dtypes_worlds") {
  for (int n : worlds)
    run(n, [&](cg::rank_context& ctx) {
      std::uint64_t seed = 300;
      for (std::int64_t dim : {0, 1, -1})
        for_each_dtype([&](auto tag) { check_all_gather<decltype(tag)>(ctx, dim, seed++); });
    });
}

TEST_CASE("all_gather_tensor.reduce_scatter_tensor.zero_sized_dims") {
  // Gathering or scattering on dim != 0 chunks a dimension; an empty one still gives
  // group_size (empty) chunks, as torch.chunk does, so the shapes come out right.
  run(2, [](cg::rank_context& ctx) {
    CHECK(cg::all_gather_tensor(cg::ones<float>({0, 3}), 1, ctx.world()).shape() == shape_t{0, 6});
    CHECK(cg::all_gather_tensor(cg::ones<float>({2, 0}), 1, ctx.world()).shape() == shape_t{2, 0});
    CHECK(cg::all_gather_tensor(cg::ones<float>({0, 3}), 0, ctx.world()).shape() == shape_t{0, 3});
    CHECK(cg::reduce_scatter_tensor(cg::ones<float>({4, 0}), "sum", 1, ctx.world()).shape() == shape_t{4, 0});
    CHECK(cg::reduce_scatter_tensor(cg::ones<float>({0, 4}), "sum", 1, ctx.world()).shape() == shape_t{0, 2});
    CHECK(cg::reduce_scatter_tensor(cg::ones<float>({0, 4}), "sum", 0, ctx.world()).shape() == shape_t{0, 4});
    const auto outs = cg::reduce_scatter_tensor_coalesced(
        std::vector<cg::tensor<float>>{cg::ones<float>({3, 0}), cg::ones<float>({2, 2})}, "sum", {1, 1},
        ctx.world());
    CHECK(outs[0].shape() == shape_t{3, 0});
    CHECK(outs[1].to_vector() == vec<float>{2, 2});
  });
}

// ============================== all_to_all_single ==============================

namespace {
/// rows[i][j]: how many rows rank i sends to rank j (zeros included), the same on every rank.
std::vector<std::vector<i64>> split_matrix(int n, int salt) {
  std::vector<std::vector<i64>> s(static_cast<std::size_t>(n), std::vector<i64>(static_cast<std::size_t>(n)));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      s[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = (3 * i + 2 * j + salt) % 4;
  return s;
}

/// Checks all_to_all_single (functional, and in place when `in_place`) for the split matrix
/// `s`, or the even split when `s` is empty.
template <class T>
void check_all_to_all(cg::rank_context& ctx, const std::vector<std::vector<i64>>& s,
                      std::uint64_t seed, bool in_place) {
  const int n = ctx.world_size(), me = ctx.rank();
  const i64 cols = 3;
  auto rows_sent = [&](int i, int j) -> i64 {
    return s.empty() ? 2 : s[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)];
  };
  auto in_shape = [&](int i) {
    i64 r = 0;
    for (int j = 0; j < n; ++j) r += rows_sent(i, j);
    return shape_t{r, cols};
  };
  std::optional<vec<i64>> out_splits, in_splits;
  if (!s.empty()) {
    out_splits.emplace();
    in_splits.emplace();
    for (int j = 0; j < n; ++j) {
      out_splits->push_back(rows_sent(j, me));
      in_splits->push_back(rows_sent(me, j));
    }
  }
  // Expected: from each peer j, the rows j sends to me, in group order.
  vec<T> want;
  i64 out_rows = 0;
  for (int j = 0; j < n; ++j) {
    i64 start = 0;
    for (int k = 0; k < me; ++k) start += rows_sent(j, k);
    const auto peer = make_input<T>(in_shape(j), seed, j).to_vector();
    const auto rows = ref_slice(peer, in_shape(j), 0, start, rows_sent(j, me));
    want.insert(want.end(), rows.begin(), rows.end());
    out_rows += rows_sent(j, me);
  }
  const shape_t out_shape{out_rows, cols};
  const auto msg = where(ctx, cg::dtype_v<T>, s.empty() ? "all_to_all_single even" : "all_to_all_single uneven");
  auto in = make_input<T>(in_shape(me), seed, me);
  const auto before = in.to_vector();
  if (in_place) {
    auto out = cg::full<T>(out_shape, T(1));
    auto r = cg::all_to_all_single_(out, in, out_splits, in_splits, ctx.world());
    check_that(r.storage() == out.storage(), msg, "does not return its output");
    check_tensor(out, want, out_shape, msg);
  } else {
    auto r = cg::all_to_all_single(in, out_splits, in_splits, ctx.world());
    check_that(r.pending_work() != nullptr, msg, "result not pending");
    check_tensor(r, want, out_shape, msg);
  }
  check_unchanged(in, before, msg);
}
}  // namespace

TEST_CASE("all_to_all_single.even") {
  for (int n : worlds)
    run(n, [&](cg::rank_context& ctx) {
      std::uint64_t seed = 400;
      for_each_dtype([&](auto tag) { check_all_to_all<decltype(tag)>(ctx, {}, seed++, false); });
    });
}

TEST_CASE("all_to_all_single.uneven_splits") {
  for (int n : worlds)
    run(n, [&](cg::rank_context& ctx) {
      std::uint64_t seed = 500;
      for (int salt = 0; salt < 3; ++salt) {
        const auto s = split_matrix(ctx.world_size(), salt);
        for_each_dtype([&](auto tag) { check_all_to_all<decltype(tag)>(ctx, s, seed++, false); });
      }
    });
}

TEST_CASE("all_to_all_single.zero_sized_splits") {
  for (int n : {1, 2, 3, 4}) {
    run(n, [&](cg::rank_context& ctx) {
      const int w = ctx.world_size();
      // Rank 0 sends nothing and receives nothing: its input and output are [0, 3].
      std::vector<std::vector<i64>> s(static_cast<std::size_t>(w), std::vector<i64>(static_cast<std::size_t>(w), 1));
      for (int j = 0; j < w; ++j) s[0][static_cast<std::size_t>(j)] = s[static_cast<std::size_t>(j)][0] = 0;
      check_all_to_all<float>(ctx, s, 7, false);
      check_all_to_all<std::int64_t>(ctx, s, 8, false);
      // Nobody sends anything.
      const std::vector<std::vector<i64>> zeros(static_cast<std::size_t>(w), std::vector<i64>(static_cast<std::size_t>(w), 0));
      check_all_to_all<cg::bf16>(ctx, zeros, 9, false);
    });
  }
}

// ================================== broadcast ==================================

TEST_CASE("broadcast.each_src") {
  for (int n : worlds)
    run(n, [&](cg::rank_context& ctx) {
      for_each_dtype([&](auto tag) {
        using T = decltype(tag);
        const shape_t shape{2, 3};
        auto in = make_input<T>(shape, 600, ctx.rank());
        const auto before = in.to_vector();
        for (int src = 0; src < ctx.world_size(); ++src) {
          auto r = cg::broadcast(in, src, ctx.world());
          check_that(r.pending_work() != nullptr, "broadcast", "result not pending");
          check_tensor(r, make_input<T>(shape, 600, src).to_vector(), shape,
                       where(ctx, cg::dtype_v<T>, cg::detail::concat("broadcast src ", src)));
        }
        check_unchanged(in, before, "broadcast");
      });
    });
}

// ================================ permute_tensor ================================

namespace {
template <class T>
void check_permute(cg::rank_context& ctx, const std::vector<int>& src_dst, std::uint64_t seed) {
  const shape_t shape{2, 3};
  const int me = ctx.rank();
  int from = -1;  // the rank whose data lands here
  for (int i = 0; i < static_cast<int>(src_dst.size()); ++i)
    if (src_dst[static_cast<std::size_t>(i)] == me) from = i;
  auto in = make_input<T>(shape, seed, me);
  const auto before = in.to_vector();
  auto r = cg::permute_tensor(in, src_dst, ctx.world());
  check_that(r.pending_work() != nullptr, "permute_tensor", "result not pending");
  check_tensor(r, make_input<T>(shape, seed, from).to_vector(), shape,
               where(ctx, cg::dtype_v<T>, "permute_tensor " + cg::list_str(src_dst)));
  check_unchanged(in, before, "permute_tensor");
}
}  // namespace

TEST_CASE("permute_tensor.rotation_and_random") {
  for (int n : worlds)
    run(n, [&](cg::rank_context& ctx) {
      const int w = ctx.world_size();
      std::vector<int> rotation(static_cast<std::size_t>(w));
      for (int i = 0; i < w; ++i) rotation[static_cast<std::size_t>(i)] = (i + 1) % w;
      std::vector<int> random = iota_ranks(w);
      std::mt19937 gen(static_cast<unsigned>(w));  // the same permutation on every rank
      std::shuffle(random.begin(), random.end(), gen);
      std::uint64_t seed = 700;
      for_each_dtype([&](auto tag) {
        check_permute<decltype(tag)>(ctx, rotation, seed++);
        check_permute<decltype(tag)>(ctx, random, seed++);
      });
    });
}

// ============================== coalesced forms ===============================

namespace {
template <class T>
void check_one_launch(const std::vector<cg::tensor<T>>& outs, const std::string& msg) {
  check_that(!outs.empty() && outs.front().pending_work() != nullptr, msg, "results not pending");
  for (auto& o : outs)
    check_that(o.pending_work() == outs.front().pending_work(), msg, "outputs of several launches");
}

template <class T>
void check_coalesced(cg::rank_context& ctx, cg::reduce_op op, std::uint64_t seed, int which) {
  const int n = ctx.world_size(), me = ctx.rank();
  const auto ranks = iota_ranks(n);
  const auto msg = where(ctx, cg::dtype_v<T>, cg::detail::concat("coalesced ", op));
  if (which == 0) {  // all_reduce_coalesced
    const std::vector<shape_t> shapes{{5}, {2, 3}, {1}};
    std::vector<cg::tensor<T>> ins;
    for (std::size_t i = 0; i < shapes.size(); ++i) ins.push_back(make_input<T>(shapes[i], seed + i, me));
    if (!op_valid<T>(op)) {
      check_throws([&] { cg::all_reduce_coalesced(ins, op, ctx.world()); },
                   op_error<T>("all_reduce_coalesced", op), msg);
    } else {
      auto outs = cg::all_reduce_coalesced(ins, op, ctx.world());
      if (outs.size() != shapes.size()) return check_that(false, msg, "wrong number of outputs");
      check_one_launch(outs, msg + "all_reduce_coalesced: ");
      for (std::size_t i = 0; i < shapes.size(); ++i)
        check_tensor(outs[i], ref_reduce(inputs_of<T>(ranks, shapes[i], seed + i), op), shapes[i],
                     msg + "all_reduce_coalesced #" + std::to_string(i) + ": ");
    }
  }
  if (which == 1) {  // reduce_scatter_tensor_coalesced, scattering on dims 0, 1 and -1
    const std::vector<shape_t> shapes{{2 * i64{n}, 3}, {2, 3 * i64{n}}, {1, 2, i64{n}}};
    const std::vector<i64> dims{0, 1, -1};
    std::vector<cg::tensor<T>> ins;
    for (std::size_t i = 0; i < shapes.size(); ++i) ins.push_back(make_input<T>(shapes[i], seed + 10 + i, me));
    if (!op_valid<T>(op)) {
      check_throws([&] { cg::reduce_scatter_tensor_coalesced(ins, op, dims, ctx.world()); },
                   op_error<T>("reduce_scatter_tensor_coalesced", op), msg);
    } else {
      auto outs = cg::reduce_scatter_tensor_coalesced(ins, op, dims, ctx.world());
      if (outs.size() != shapes.size()) return check_that(false, msg, "wrong number of outputs");
      check_one_launch(outs, msg + "reduce_scatter_tensor_coalesced: ");
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        const int d = static_cast<int>(dims[i] < 0 ? dims[i] + static_cast<i64>(shapes[i].size()) : dims[i]);
        const auto full = ref_reduce(inputs_of<T>(ranks, shapes[i], seed + 10 + i), op);
        const i64 len = shapes[i][static_cast<std::size_t>(d)] / n;
        shape_t out_shape = shapes[i];
        out_shape[static_cast<std::size_t>(d)] = len;
        check_tensor(outs[i], ref_slice(full, shapes[i], d, me * len, len), out_shape,
                     msg + "reduce_scatter_tensor_coalesced #" + std::to_string(i) + ": ");
      }
    }
  }
  if (which == 2) {  // all_gather_into_tensor_coalesced (no op)
    const std::vector<shape_t> shapes{{2}, {1, 3}, {3, 2}};
    std::vector<cg::tensor<T>> ins;
    for (std::size_t i = 0; i < shapes.size(); ++i) ins.push_back(make_input<T>(shapes[i], seed + 20 + i, me));
    std::vector<vec<T>> before;
    for (auto& t : ins) before.push_back(t.to_vector());
    auto outs = cg::all_gather_into_tensor_coalesced(ins, ctx.world());
    if (outs.size() != shapes.size()) return check_that(false, msg, "wrong number of outputs");
    check_one_launch(outs, msg + "all_gather_into_tensor_coalesced: ");
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      shape_t out_shape = shapes[i];
      out_shape[0] *= n;
      check_tensor(outs[i], ref_concat(inputs_of<T>(ranks, shapes[i], seed + 20 + i), shapes[i], 0),
                   out_shape, msg + "all_gather_into_tensor_coalesced #" + std::to_string(i) + ": ");
      check_unchanged(ins[i], before[i], msg);
    }
  }
}
}  // namespace

namespace {
/// Runs `check<T>(ctx, op, seed, which)` for every world size, op (or just sum) and dtype.
#define CCGRAPH_TEST_SWEEP(check, which, every_op)                                        \
  for (int n : worlds)                                                                   \
    run(n, [&](cg::rank_context& ctx) {                                                  \
      std::uint64_t seed = 800;                                                          \
      for (auto op : all_ops) {                                                          \
        if (!(every_op) && op != cg::reduce_op::sum) continue;                           \
        for_each_dtype([&](auto tag) {                                                   \
          check<decltype(tag)>(ctx, op, seed, which);                                    \
          seed += 100;                                                                   \
        });                                                                              \
      }                                                                                  \
    })
}  // namespace

// One launch for all tensors: every output shares one pending completion.
TEST_CASE("all_reduce_coalesced.ops_dtypes_worlds") { CCGRAPH_TEST_SWEEP(check_coalesced, 0, true); }
TEST_CASE("reduce_scatter_tensor_coalesced.ops_dtypes_worlds") { CCGRAPH_TEST_SWEEP(check_coalesced, 1, true); }
TEST_CASE("all_gather_into_tensor_coalesced.dtypes_worlds") { CCGRAPH_TEST_SWEEP(check_coalesced, 2, false); }

// ================================= wait_tensor =================================

TEST_CASE("wait_tensor.noop_and_pending") {
  // Not pending, and no rank context needed: a no-op returning the same tensor.
  auto t = cg::tensor<float>::from({1, 2, 3}, {3});
  const auto& w = cg::wait_tensor(t);
  CHECK(&w == &t);
  CHECK(t.to_vector() == vec<float>{1, 2, 3});
  CHECK(t.pending_work() == nullptr);

  run(3, [](cg::rank_context& ctx) {
    auto r = cg::all_reduce(cg::full<std::int32_t>({4}, ctx.rank() + 1), "sum", ctx.world());
    auto view = r.narrow(0, 1, 2);
    CHECK(r.pending_work() != nullptr);
    const auto& waited = cg::wait_tensor(r);
    CHECK(&waited == &r);
    CHECK_FALSE(r.is_pending());
    CHECK(r.pending_work() == nullptr);  // a wait drops the completion
    CHECK(r.to_vector() == vec<std::int32_t>(4, 6));
    CHECK_FALSE(view.is_pending());       // the view shares the (now finished) completion
    CHECK(cg::wait_tensor(view).to_vector() == vec<std::int32_t>(2, 6));
    cg::wait_tensor(r);                   // waiting twice is fine
  });
}

// ================================ in-place forms ================================

namespace {
template <class T>
void check_in_place(cg::rank_context& ctx, cg::reduce_op op, std::uint64_t seed, int which) {
  const int n = ctx.world_size(), me = ctx.rank();
  const auto ranks = iota_ranks(n);
  const auto msg = where(ctx, cg::dtype_v<T>, cg::detail::concat("in-place ", op));
  if (which == 0) {  // all_reduce_ on a contiguous tensor and on a transposed view
    const shape_t shape{3, 4};
    auto t = make_input<T>(shape, seed, me);
    if (!op_valid<T>(op)) {
      check_throws([&] { cg::all_reduce_(t, op, ctx.world()); }, op_error<T>("all_reduce", op), msg);
    } else {
      const auto want = ref_reduce(inputs_of<T>(ranks, shape, seed), op);
      auto r = cg::all_reduce_(t, op, ctx.world());
      check_that(r.storage() == t.storage() && !t.is_pending(), msg, "all_reduce_ result");
      check_tensor(t, want, shape, msg + "all_reduce_: ");
      // Through a transposed (non-contiguous) view: the base sees the reduced values.
      auto base = make_input<T>(shape, seed, me);
      auto view = base.transpose(0, 1);
      cg::all_reduce_(view, op, ctx.world());
      check_tensor(base, want, shape, msg + "all_reduce_ on a view: ");
      check_tensor(view, ref_transpose(want, 3, 4), (shape_t{4, 3}), msg + "all_reduce_ view: ");
    }
  }
  if (which == 1) {  // reduce_scatter_tensor_
    const shape_t shape{2 * i64{n}, 3};
    auto in = make_input<T>(shape, seed + 1, me);
    const auto before = in.to_vector();
    auto out = cg::full<T>({2, 3}, T(1));
    if (!op_valid<T>(op)) {
      check_throws([&] { cg::reduce_scatter_tensor_(out, in, op, ctx.world()); },
                   op_error<T>("reduce_scatter_tensor", op), msg);
    } else {
      const auto full = ref_reduce(inputs_of<T>(ranks, shape, seed + 1), op);
      auto r = cg::reduce_scatter_tensor_(out, in, op, ctx.world());
      check_that(r.storage() == out.storage(), msg, "reduce_scatter_tensor_ result");
      check_tensor(out, ref_slice(full, shape, 0, 2 * me, 2), (shape_t{2, 3}), msg + "reduce_scatter_tensor_: ");
      check_unchanged(in, before, msg);
    }
  }
  if (which == 2) {  // all_gather_into_tensor (no op)
    const shape_t shape{2, 3};
    auto in = make_input<T>(shape, seed + 2, me);
    auto out = cg::full<T>({2 * i64{n}, 3}, T(1));
    auto r = cg::all_gather_into_tensor(out, in, ctx.world());
    check_that(r.storage() == out.storage(), msg, "all_gather_into_tensor result");
    check_tensor(out, ref_concat(inputs_of<T>(ranks, shape, seed + 2), shape, 0),
                 (shape_t{2 * i64{n}, 3}), msg + "all_gather_into_tensor: ");
  }
}
}  // namespace

TEST_CASE("all_reduce_.ops_dtypes_worlds") { CCGRAPH_TEST_SWEEP(check_in_place, 0, true); }
TEST_CASE("reduce_scatter_tensor_.ops_dtypes_worlds") { CCGRAPH_TEST_SWEEP(check_in_place, 1, true); }
TEST_CASE("all_gather_into_tensor.dtypes_worlds") { CCGRAPH_TEST_SWEEP(check_in_place, 2, false); }

TEST_CASE("all_to_all_single_.even_and_uneven") {
  for (int n : worlds)
    run(n, [&](cg::rank_context& ctx) {
      std::uint64_t seed = 1000;
      const auto s = split_matrix(ctx.world_size(), 1);
      for_each_dtype([&](auto tag) {
        check_all_to_all<decltype(tag)>(ctx, {}, seed++, true);
        check_all_to_all<decltype(tag)>(ctx, s, seed++, true);
      });
    });
}

// ================================== subgroups ==================================

TEST_CASE("subgroup.only_members_call") {
  // Ranks {1, 3} of 4 reduce among themselves while {0, 2} do the same concurrently.
  run(4, [](cg::rank_context& ctx) {
    const int me = ctx.rank();
    const std::vector<int> mine = me % 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 2};
    const int idx = me / 2;  // index in the group
    for_each_dtype([&](auto tag) {
      using T = decltype(tag);
      const auto msg = where(ctx, cg::dtype_v<T>, "subgroup " + cg::list_str(mine));
      const shape_t shape{4, 3};
      auto in = make_input<T>(shape, 1100, me);
      const auto all = inputs_of<T>(mine, shape, 1100);
      auto op = std::is_same_v<T, bool> ? cg::reduce_op::bor : cg::reduce_op::sum;
      check_tensor(cg::all_reduce(in, op, cg::group{mine}), ref_reduce(all, op), shape, msg + "all_reduce: ");
      check_tensor(cg::all_gather_tensor(in, 1, cg::group{mine}), ref_concat(all, shape, 1),
                   (shape_t{4, 6}), msg + "all_gather_tensor: ");
      check_tensor(cg::reduce_scatter_tensor(in, op, 0, cg::group{mine}),
                   ref_slice(ref_reduce(all, op), shape, 0, 2 * idx, 2), (shape_t{2, 3}),
                   msg + "reduce_scatter_tensor: ");
      check_tensor(cg::broadcast(in, mine[1], cg::group{mine}), all[1], shape, msg + "broadcast: ");
      // Group-local indices: member 0 sends to member 1 and back.
      check_tensor(cg::permute_tensor(in, {1, 0}, cg::group{mine}), all[static_cast<std::size_t>(1 - idx)],
                   shape, msg + "permute_tensor: ");
      check_tensor(cg::all_to_all_single(in, std::nullopt, std::nullopt, cg::group{mine}),
                   ref_concat(vecs<T>{ref_slice(all[0], shape, 0, 2 * idx, 2),
                                      ref_slice(all[1], shape, 0, 2 * idx, 2)},
                              shape_t{2, 3}, 0),
                   (shape_t{4, 3}), msg + "all_to_all_single: ");
    });
  });
}

TEST_CASE("subgroup.tagged_groups_over_the_same_ranks") {
  // FSDP's shape: all_gathers on one tagged group and reduce_scatters on another over the same
  // ranks, interleaved with collectives of the untagged world group. Each tag is its own group
  // with its own sequence of collectives; all give the untagged results.
  run(3, [](cg::rank_context& ctx) {
    const int me = ctx.rank();
    const std::vector<int> all{0, 1, 2};
    const cg::group ag{all, "fsdp_ag"}, rs{all, "fsdp_rs"};
    const shape_t shape{6, 2};
    for (int step = 0; step < 3; ++step) {
      const auto msg = "step " + std::to_string(step) + ": ";
      auto in = make_input<float>(shape, 1300 + static_cast<std::uint64_t>(step), me);
      const auto ins = inputs_of<float>(all, shape, 1300 + static_cast<std::uint64_t>(step));
      auto gathered = cg::all_gather_tensor(in, 0, ag);     // pending while the others run
      auto scattered = cg::reduce_scatter_tensor(in, "sum", 0, rs);
      auto reduced = cg::all_reduce(in, "max", ctx.world());
      check_tensor(scattered, ref_slice(ref_reduce(ins, cg::reduce_op::sum), shape, 0, 2 * me, 2), (shape_t{2, 2}),
                   msg + "reduce_scatter_tensor: ");
      check_tensor(gathered, ref_concat(ins, shape, 0), (shape_t{18, 2}), msg + "all_gather_tensor: ");
      check_tensor(reduced, ref_reduce(ins, cg::reduce_op::max), shape, msg + "all_reduce: ");
    }
  });
}

TEST_CASE("subgroup.every_form_gives_the_same_result") {
  // Real-valued floats, so that any difference in member order would show in the bits.
  run(4, [](cg::rank_context& ctx) {
    const int me = ctx.rank();
    const bool odd = me % 2;
    ctx.register_group("odd", {3, 1});
    ctx.register_group("even", {0, 2});
    const cg::device_mesh mesh({2, 2}, std::vector<std::string>{"dp", "tp"});  // dp groups: {0, 2} and {1, 3}
    const std::vector<int> mine = odd ? std::vector<int>{1, 3} : std::vector<int>{0, 2};
    const std::vector<cg::group> forms{
        cg::group{mine},
        cg::group{odd ? std::vector<int>{3, 1} : std::vector<int>{2, 0}},  // order does not matter
        cg::group{std::vector<std::vector<int>>{{0, 2}, {1, 3}}},          // MPMD
        cg::group{mesh, 0},
        cg::group{mesh, "dp"},
        cg::group{odd ? "odd" : "even"},
        // Ranks of one group may use different forms for the same collective.
        me < 2 ? cg::group{mine} : cg::group{mesh, "dp"},
    };
    auto in = cg::uniform<float>({6, 4}, -1.0, 1.0, 1200 + static_cast<std::uint64_t>(me));
    std::vector<float> want;
    {
      std::vector<vec<float>> all;
      for (int r : mine) all.push_back(cg::uniform<float>({6, 4}, -1.0, 1.0, 1200 + static_cast<std::uint64_t>(r)).to_vector());
      want = ref_reduce(all, cg::reduce_op::sum);
    }
    std::vector<std::vector<float>> results, gathers;
    for (auto& g : forms) {
      CHECK(ctx.resolve(g, "test").ranks == mine);
      CHECK(ctx.resolve(g, "test").name == (odd ? "odd" : "even"));
      results.push_back(cg::all_reduce(in, "sum", g).to_vector());
      gathers.push_back(cg::all_gather_tensor(in, 0, g).to_vector());
    }
    for (std::size_t i = 0; i < forms.size(); ++i) {
      CHECK_MESSAGE(mismatch(results[i], want).empty(), "form ", i);
      CHECK_MESSAGE(std::memcmp(results[i].data(), results[0].data(), results[0].size() * sizeof(float)) == 0,
                    "form ", i, " differs bitwise from form 0");
      CHECK_MESSAGE(gathers[i] == gathers[0], "form ", i);
    }
  });
}

TEST_CASE("subgroup.world_forms_agree") {
  run(4, [](cg::rank_context& ctx) {
    const int me = ctx.rank();
    ctx.register_group("everyone", {0, 1, 2, 3});
    const cg::device_mesh mesh2d({2, 2});
    const cg::device_mesh mesh1d({4}, {"x"});
    const std::vector<cg::group> forms{
        ctx.world(),
        cg::group{"0"},
        cg::group{std::string("0")},
        cg::group{std::vector<int>{3, 2, 1, 0}},
        cg::group{std::vector<std::vector<int>>{{0, 1, 2, 3}}},
        cg::group{mesh2d},
        cg::group{mesh1d, 0},
        cg::group{mesh1d, "x"},
        cg::group{"everyone"},
    };
    auto in = cg::uniform<double>({5}, -1.0, 1.0, 1300 + static_cast<std::uint64_t>(me));
    std::vector<vec<double>> all;
    for (int r = 0; r < 4; ++r) all.push_back(cg::uniform<double>({5}, -1.0, 1.0, 1300 + static_cast<std::uint64_t>(r)).to_vector());
    const auto want = ref_reduce(all, cg::reduce_op::avg);
    for (std::size_t i = 0; i < forms.size(); ++i) {
      const auto gi = ctx.resolve(forms[i], "test");
      CHECK(gi.name == "0");  // the world's canonical name wins over "everyone"
      CHECK(gi.ranks == iota_ranks(4));
      const auto got = cg::all_reduce(in, cg::reduce_op::avg, forms[i]).to_vector();
      CHECK_MESSAGE(mismatch(got, want).empty(), "form ", i);
    }
  });
}

TEST_CASE("subgroup.mesh_dims_2x4") {
  // On a 2x4 mesh, dim 0 groups are the columns {c, c+4}, dim 1 groups the rows.
  run(8, [](cg::rank_context& ctx) {
    const int me = ctx.rank();
    const cg::device_mesh mesh({2, 4}, std::vector<std::string>{"dp", "tp"});
    auto in = cg::full<std::int64_t>({2}, i64{1} << me);
    const i64 col = (i64{1} << (me % 4)) | (i64{1} << (me % 4 + 4));
    const i64 row = me < 4 ? 0x0f : 0xf0;
    CHECK(cg::all_reduce(in, "sum", cg::group{mesh, "dp"}).to_vector() == vec<i64>(2, col));
    CHECK(cg::all_reduce(in, "sum", cg::group{mesh, 1}).to_vector() == vec<i64>(2, row));
    CHECK(cg::all_reduce(in, "bor", cg::group{mesh}).to_vector() == vec<i64>(2, 0xff));
  });
}

// ============================ pending results and views ============================

TEST_CASE("pending.views_do_not_wait") {
  // Rank 1 issues its half of the all_reduce only after rank 0 has made its views, so rank 0's
  // result is certainly pending while it does; a view that waited would block until the
  // deadline below and then find the result no longer pending.
  std::atomic<bool> views_made{false};
  run(2, [&](cg::rank_context& ctx) {
    auto in = cg::arange<float>(12).reshape({3, 4});
    if (ctx.rank() == 1) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!views_made.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      cg::all_reduce(in, "sum", ctx.world()).wait();
      return;
    }
    auto r = cg::all_reduce(in, "sum", ctx.world());
    CHECK(r.is_pending());
    auto flat = r.reshape({12});
    auto chunks = r.chunk(3, 0);
    auto narrow = r.narrow(1, 1, 2);
    auto tr = r.transpose(0, 1);
    auto flat2 = r.view({2, 6});
    CHECK(flat.is_pending());
    CHECK(chunks.size() == 3);
    for (auto& c : chunks) CHECK(c.is_pending());
    CHECK(narrow.is_pending());
    CHECK(tr.is_pending());
    CHECK(flat2.is_pending());
    CHECK(flat.pending_work() == r.pending_work());
    CHECK(r.is_pending());
    views_made = true;
    std::vector<float> want(12);
    for (int i = 0; i < 12; ++i) want[static_cast<std::size_t>(i)] = 2.f * static_cast<float>(i);
    // Using a view waits and gives the right values; the other views see the same data.
    CHECK(tr.to_vector() == ref_transpose(want, 3, 4));
    CHECK(flat.to_vector() == want);
    CHECK(flat2.to_vector() == want);
    CHECK(chunks[1].to_vector() == ref_slice(want, {3, 4}, 0, 1, 1));
    CHECK(narrow.to_vector() == ref_slice(want, {3, 4}, 1, 1, 2));
    CHECK(r.to_vector() == want);
  });
}

TEST_CASE("pending.results_carry_work_and_chain") {
  run(3, [](cg::rank_context& ctx) {
    auto in = cg::full<std::int32_t>({2, 2}, ctx.rank() + 1);
    auto a = cg::all_reduce(in, "sum", ctx.world());            // 6
    auto b = cg::all_reduce(a, "sum", ctx.world());             // 18, issued on a pending input
    auto c = cg::all_gather_tensor(b.reshape({4}), 0, ctx.world());  // a view of a pending tensor
    CHECK(a.pending_work() != nullptr);
    CHECK(b.pending_work() != nullptr);
    CHECK(c.pending_work() != nullptr);
    CHECK(c.to_vector() == vec<std::int32_t>(12, 18));
    CHECK(a.to_vector() == vec<std::int32_t>(4, 6));
    CHECK(in.to_vector() == vec<std::int32_t>(4, ctx.rank() + 1));
  });
}

// ============================ property: random shapes ============================

namespace {
struct random_case {
  int world = 1;
  cg::dtype dt = cg::dtype::f32;
  cg::reduce_op op = cg::reduce_op::sum;
  shape_t shape;
  int gather_dim = 0;
  int scatter_dim = 0;  // its size is a multiple of world
  bool transpose = false;  // pass a non-contiguous input
  std::vector<std::vector<i64>> splits;
  std::uint64_t seed = 0;
};

random_case draw(std::mt19937_64& gen) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  random_case c;
  c.world = pick(1, 5);
  c.dt = all_dtypes[pick(0, 7)];
  do c.op = all_ops[pick(0, 7)];
  while ((cg::is_bitwise(c.op) && cg::is_floating(c.dt)) || (c.dt == cg::dtype::boolean && c.op == cg::reduce_op::avg));
  const int ndim = pick(1, 3);
  for (int d = 0; d < ndim; ++d) c.shape.push_back(pick(0, 4));
  c.gather_dim = pick(-ndim, ndim - 1);
  c.scatter_dim = pick(0, ndim - 1);
  c.shape[static_cast<std::size_t>(c.scatter_dim)] = c.world * pick(0, 2);
  c.transpose = ndim >= 2 && pick(0, 1);
  c.splits.assign(static_cast<std::size_t>(c.world), std::vector<i64>(static_cast<std::size_t>(c.world)));
  for (auto& row : c.splits)
    for (auto& v : row) v = pick(0, 3);
  c.seed = gen();
  return c;
}

template <class T>
void check_random_case(cg::rank_context& ctx, const random_case& c) {
  const int n = ctx.world_size(), me = ctx.rank();
  const auto ranks = iota_ranks(n);
  const auto msg = where(ctx, cg::dtype_v<T>,
                         cg::detail::concat("random ", c.op, " ", cg::shape_str(c.shape), " gather ",
                                            c.gather_dim, " scatter ", c.scatter_dim,
                                            c.transpose ? " transposed" : ""));
  // The logical input of rank r (a transposed view of a [s1, s0, ...] tensor when requested).
  auto input = [&](int r) {
    if (!c.transpose) return make_input<T>(c.shape, c.seed, r);
    shape_t st = c.shape;
    std::swap(st[0], st[1]);
    return make_input<T>(st, c.seed, r).transpose(0, 1);
  };
  vecs<T> all;
  for (int r : ranks) all.push_back(input(r).to_vector());
  const auto in = input(me);
  const auto full = ref_reduce(all, c.op);
  check_tensor(cg::all_reduce(in, c.op, ctx.world()), full, c.shape, msg + "all_reduce: ");

  const int gd = c.gather_dim < 0 ? c.gather_dim + static_cast<int>(c.shape.size()) : c.gather_dim;
  shape_t gshape = c.shape;
  gshape[static_cast<std::size_t>(gd)] *= n;
  check_tensor(cg::all_gather_tensor(in, c.gather_dim, ctx.world()), ref_concat(all, c.shape, gd), gshape,
               msg + "all_gather_tensor: ");

  const i64 len = c.shape[static_cast<std::size_t>(c.scatter_dim)] / n;
  shape_t sshape = c.shape;
  sshape[static_cast<std::size_t>(c.scatter_dim)] = len;
  check_tensor(cg::reduce_scatter_tensor(in, c.op, c.scatter_dim, ctx.world()),
               ref_slice(full, c.shape, c.scatter_dim, me * len, len), sshape, msg + "reduce_scatter_tensor: ");

  // Uneven all_to_all on dim 0 of a [rows, rest...] input built from the split matrix.
  shape_t ashape = c.shape;
  i64 row = 1;
  for (std::size_t d = 1; d < ashape.size(); ++d) row *= ashape[d];
  auto a2a_input = [&](int r) {
    ashape[0] = std::accumulate(c.splits[static_cast<std::size_t>(r)].begin(),
                                c.splits[static_cast<std::size_t>(r)].end(), i64{0});
    return make_input<T>(ashape, c.seed + 1, r);
  };
  vec<i64> out_splits, in_splits = c.splits[static_cast<std::size_t>(me)];
  vec<T> want;
  for (int j = 0; j < n; ++j) {
    const auto& sj = c.splits[static_cast<std::size_t>(j)];
    out_splits.push_back(sj[static_cast<std::size_t>(me)]);
    const i64 start = std::accumulate(sj.begin(), sj.begin() + me, i64{0});
    const auto peer = a2a_input(j).to_vector();
    want.insert(want.end(), peer.begin() + start * row, peer.begin() + (start + sj[static_cast<std::size_t>(me)]) * row);
  }
  shape_t oshape = ashape;
  oshape[0] = std::accumulate(out_splits.begin(), out_splits.end(), i64{0});
  check_tensor(cg::all_to_all_single(a2a_input(me), out_splits, in_splits, ctx.world()), want, oshape,
               msg + "all_to_all_single: ");
}
}  // namespace

TEST_CASE("property.random_shapes_ranks_dtypes") {
  std::mt19937_64 gen(20240601);
  for (int iter = 0; iter < 40; ++iter) {
    const random_case c = draw(gen);
    CAPTURE(iter);
    run(c.world, [&](cg::rank_context& ctx) {
      cg::visit_dtype(c.dt, [&](auto tag) { check_random_case<decltype(tag)>(ctx, c); });
    });
  }
}

// ==================================== errors ====================================

TEST_CASE("errors.reduce_scatter_non_divisible") {
  run(2, [](cg::rank_context& ctx) {
    auto t = cg::ones<float>({4, 5});
    CHECK_THROWS_WITH_AS(cg::reduce_scatter_tensor(t, "sum", 1, ctx.world()),
                         "reduce_scatter_tensor: dim 1 (size 5) must be a multiple of group_size 2",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::reduce_scatter_tensor(cg::ones<float>({3}), "sum", 0, ctx.world()),
                         "reduce_scatter_tensor: dim 0 (size 3) must be a multiple of group_size 2",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::reduce_scatter_tensor(t, "sum", 2, ctx.world()),
                         doctest::Contains("dim 2 is out of range for a tensor of rank 2"), cg::error);
    // A 0-d tensor has no dim to scatter.
    CHECK_THROWS_WITH_AS(cg::reduce_scatter_tensor(cg::ones<float>({}), "sum", 0, ctx.world()),
                         doctest::Contains("reduce_scatter_tensor"), cg::error);
    // in place: the input's dim 0
    auto out = cg::ones<float>({2, 5});
    CHECK_THROWS_WITH_AS(cg::reduce_scatter_tensor_(out, cg::ones<float>({3, 5}), "sum", ctx.world()),
                         "reduce_scatter_tensor: dim 0 (size 3) must be a multiple of group_size 2",
                         cg::error);
    // The world is still usable: nothing was issued.
    CHECK(cg::reduce_scatter_tensor(t, "sum", 0, ctx.world()).to_vector() == vec<float>(10, 2.f));
  });
}

TEST_CASE("errors.coalesced_name_the_tensor_index") {
  run(2, [](cg::rank_context& ctx) {
    const std::vector<cg::tensor<float>> ts{cg::ones<float>({4, 2}), cg::ones<float>({4, 5})};
    CHECK_THROWS_WITH_AS(cg::reduce_scatter_tensor_coalesced(ts, "sum", {0, 1}, ctx.world()),
                         "reduce_scatter_tensor_coalesced: dim 1 (size 5) must be a multiple of "
                         "group_size 2 for tensor at index 1",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::reduce_scatter_tensor_coalesced(ts, "sum", {0}, ctx.world()),
                         "reduce_scatter_tensor_coalesced: 1 scatter dims for 2 tensors", cg::error);
    // all_gather has nothing to divide; a 0-d tensor is what it rejects.
    const std::vector<cg::tensor<float>> gs{cg::ones<float>({2}), cg::ones<float>({})};
    CHECK_THROWS_WITH_AS(cg::all_gather_into_tensor_coalesced(gs, ctx.world()),
                         doctest::Contains("for tensor at index 1"), cg::error);
    CHECK_THROWS_WITH_AS(cg::all_gather_into_tensor_coalesced(gs, ctx.world()),
                         doctest::Contains("all_gather_into_tensor_coalesced: the input must have at "
                                           "least one dimension"),
                         cg::error);
  });
}

TEST_CASE("errors.all_to_all_single_splits") {
  run(2, [](cg::rank_context& ctx) {
    auto t = cg::ones<float>({4, 2});
    using splits = std::optional<std::vector<i64>>;
    CHECK_THROWS_WITH_AS(cg::all_to_all_single(t, splits{{2, 2}}, std::nullopt, ctx.world()),
                         doctest::Contains("must either be specified together"), cg::error);
    CHECK_THROWS_WITH_AS(cg::all_to_all_single(t, std::nullopt, splits{{2, 2}}, ctx.world()),
                         doctest::Contains("must either be specified together"), cg::error);
    CHECK_THROWS_WITH_AS(cg::all_to_all_single(t, splits{{2, 2}}, splits{{1, 2}}, ctx.world()),
                         "all_to_all_single: input_split_sizes [1, 2] sum to 3 but the input's dim 0 "
                         "has size 4",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::all_to_all_single(t, splits{{2, 2}}, splits{{4}}, ctx.world()),
                         "all_to_all_single: input_split_sizes [4] has 1 entries for group_size 2",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::all_to_all_single(t, splits{{1, 1, 2}}, splits{{2, 2}}, ctx.world()),
                         doctest::Contains("output_split_sizes [1, 1, 2] has 3 entries for group_size 2"),
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::all_to_all_single(t, splits{{-1, 5}}, splits{{2, 2}}, ctx.world()),
                         doctest::Contains("negative split"), cg::error);
    CHECK_THROWS_WITH_AS(cg::all_to_all_single(cg::ones<float>({3}), std::nullopt, std::nullopt, ctx.world()),
                         doctest::Contains("dim 0 (size 3) must be a multiple of group_size 2"), cg::error);
    // in place, wrong output shape: names both shapes
    auto out = cg::ones<float>({3, 2});
    CHECK_THROWS_WITH_AS(cg::all_to_all_single_(out, t, splits{{2, 2}}, splits{{2, 2}}, ctx.world()),
                         "all_to_all_single: output shape [3, 2] does not match the expected shape [4, 2]",
                         cg::error);
  });
}

TEST_CASE("errors.all_to_all_single_inconsistent_across_ranks") {
  // Each rank's splits are valid alone, but rank 0 expects 3 rows from rank 1, which sends 1.
  std::atomic<int> failed{0};
  auto body = [&](cg::rank_context& ctx) {
    using splits = std::optional<std::vector<i64>>;
    auto t = cg::ones<float>({4, 2});
    const splits out = ctx.rank() == 0 ? splits{{1, 3}} : splits{{3, 3}};
    const splits in = ctx.rank() == 0 ? splits{{1, 3}} : splits{{1, 3}};
    try {
      cg::all_to_all_single(t, out, in, ctx.world()).wait();
    } catch (const cg::error&) {
      ++failed;
      throw;
    }
  };
  try {
    run(2, body);
    FAIL("run_threads did not throw");
  } catch (const cg::error& e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find("all_to_all_single: rank ") != std::string::npos, m);
    CHECK_MESSAGE(m.find("rank 0") != std::string::npos, m);
    CHECK_MESSAGE(m.find("rank 1") != std::string::npos, m);
    CHECK_MESSAGE(m.find("sends") != std::string::npos, m);
  }
  CHECK(failed == 2);  // both ranks see the failure; neither hangs
}

TEST_CASE("errors.permute_tensor_not_a_permutation") {
  run(3, [](cg::rank_context& ctx) {
    auto t = cg::ones<float>({2});
    CHECK_THROWS_WITH_AS(cg::permute_tensor(t, {0, 0, 1}, ctx.world()),
                         "permute_tensor: destination 0 appears twice in [0, 0, 1]; src_dst must be a "
                         "permutation",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::permute_tensor(t, {0, 1, 3}, ctx.world()),
                         "permute_tensor: destination 3 in [0, 1, 3] is out of range for group_size 3",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::permute_tensor(t, {1, 0}, ctx.world()),
                         "permute_tensor: src_dst [1, 0] has 2 entries for group_size 3", cg::error);
  });
}

TEST_CASE("errors.broadcast_src_not_in_group") {
  run(3, [](cg::rank_context& ctx) {
    if (ctx.rank() == 2) return;
    CHECK_THROWS_WITH_AS(cg::broadcast(cg::ones<float>({2}), 2, cg::group{std::vector<int>{0, 1}}),
                         "broadcast: src rank 2 is not a member of group [0, 1]", cg::error);
    CHECK_THROWS_WITH_AS(cg::broadcast(cg::ones<float>({2}), -1, ctx.world()),
                         doctest::Contains("src rank -1 is not a member of group [0, 1, 2]"), cg::error);
  });
}

TEST_CASE("errors.groups") {
  run(4, [](cg::rank_context& ctx) {
    auto t = cg::ones<float>({2});
    if (ctx.rank() == 0) {
      CHECK_THROWS_WITH_AS(cg::all_reduce(t, "sum", cg::group{std::vector<int>{1, 3}}),
                           "all_reduce: rank 0 is not a member of group [1, 3]", cg::error);
      CHECK_THROWS_WITH_AS(cg::all_gather_tensor(t, 0, cg::group{std::vector<int>{1, 3}}),
                           doctest::Contains("is not a member of group [1, 3]"), cg::error);
      const cg::device_mesh sub({2}, {1, 3});
      CHECK_THROWS_WITH_AS(cg::all_reduce(t, "sum", cg::group{sub}),
                           doctest::Contains("rank 0 is not a member of group [1, 3]"), cg::error);
      CHECK_THROWS_WITH_AS(cg::all_reduce(t, "sum", cg::group{std::vector<std::vector<int>>{{1, 2}, {3, 4}}}),
                           doctest::Contains("rank 0 is in none of the groups [[1, 2], [3, 4]]"),
                           cg::error);
    }
    CHECK_THROWS_WITH_AS(cg::all_reduce(t, "sum", cg::group{"no_such_group"}),
                         doctest::Contains("no group named 'no_such_group' is registered"), cg::error);
    CHECK_THROWS_WITH_AS(cg::all_reduce(t, "sum", cg::group{std::vector<int>{0, 4}}),
                         doctest::Contains("rank 4 is out of range for world size 4"), cg::error);
    CHECK_THROWS_WITH_AS(cg::all_reduce(t, "sum", cg::group{std::vector<int>{0, 0, 1, 2, 3}}),
                         doctest::Contains("rank listed twice"), cg::error);
  });
  CHECK_THROWS_WITH_AS(cg::group(std::vector<std::vector<int>>{{0, 1}, {2, 3, 4}}),
                       "group sizes must be identical found 2 and 3", cg::error);
}

TEST_CASE("errors.in_place_wrong_output_shape") {
  run(2, [](cg::rank_context& ctx) {
    auto in = cg::ones<float>({2, 3});
    auto bad = cg::ones<float>({3, 3});
    CHECK_THROWS_WITH_AS(cg::all_gather_into_tensor(bad, in, ctx.world()),
                         "all_gather_into_tensor: output shape [3, 3] does not match the expected "
                         "shape [4, 3]",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::reduce_scatter_tensor_(bad, in, "sum", ctx.world()),
                         "reduce_scatter_tensor: output shape [3, 3] does not match the expected "
                         "shape [1, 3]",
                         cg::error);
    CHECK_THROWS_WITH_AS(cg::all_to_all_single_(bad, in, std::nullopt, std::nullopt, ctx.world()),
                         "all_to_all_single: output shape [3, 3] does not match the expected shape "
                         "[2, 3]",
                         cg::error);
    CHECK(bad.to_vector() == vec<float>(9, 1.f));  // untouched
  });
}

TEST_CASE("errors.unknown_reduce_op") {
  const std::string valid = "valid ops are sum, avg, product, min, max, band, bor, bxor, premul_sum(<factor>)";
  CHECK_THROWS_WITH_AS(cg::reduce_op_arg("mean"),
                       ("reduce_op: unknown reduce op 'mean'; " + valid).c_str(), cg::error);
  CHECK(cg::reduce_op_arg("MaX").value == cg::reduce_op::max);
  CHECK(cg::reduce_op_arg(std::string("Product")).value == cg::reduce_op::product);
  run(2, [&](cg::rank_context& ctx) {
    CHECK_THROWS_WITH_AS(cg::all_reduce(cg::ones<float>({2}), "summ", ctx.world()),
                         doctest::Contains(valid.c_str()), cg::error);
  });
}

TEST_CASE("errors.outside_run_threads") {
  auto t = cg::ones<float>({2});
  CHECK_THROWS_WITH_AS(cg::all_reduce(t, "sum", cg::group{"0"}),
                       doctest::Contains("all_reduce: no rank context on this thread"), cg::error);
  CHECK_THROWS_WITH_AS(cg::all_gather_tensor(t, 0, cg::group{"0"}),
                       doctest::Contains("no rank context"), cg::error);
  CHECK_THROWS_WITH_AS(cg::permute_tensor(t, {0}, cg::group{"0"}),
                       doctest::Contains("permute_tensor: no rank context"), cg::error);
  CHECK_THROWS_WITH_AS(cg::all_reduce_coalesced(std::vector<cg::tensor<float>>{t}, "sum", cg::group{"0"}),
                       doctest::Contains("no rank context"), cg::error);
}

TEST_CASE("errors.group_of_another_world_at_launch") {
  // What a graph traced for another world or rank hands the launch (issue 21 item 1): every
  // collective, eager or compiled, is checked there before a backend indexes peers by it.
  run(2, [](cg::rank_context& ctx) {
    auto launch = [&](cg::group_info gi) {
      return cg::detail::launch_collective<float>(ctx, "all_reduce", cg::ops::all_reduce{cg::reduce_op::sum},
                                                  std::move(gi), {cg::ones<float>({4})});
    };
    const std::string r = std::to_string(ctx.rank());
    CHECK(error_of([&] { launch({"", iota_ranks(8), {}}); }) ==
          "all_reduce: group [0, 1, 2, 3, 4, 5, 6, 7] does not fit a world of 2 ranks (rank " + r + ")");
    CHECK(error_of([&] { launch({"", {-1, 0, 1}, {}}); }) ==
          "all_reduce: group [-1, 0, 1] does not fit a world of 2 ranks (rank " + r + ")");
    const int other = 1 - ctx.rank();
    CHECK(error_of([&] { launch({"", {other}, {}}); }) ==
          "all_reduce: rank " + r + " is not a member of group [" + std::to_string(other) + "] (world of 2 ranks)");
    CHECK(error_of([&] { launch({"", {1, 0}, {}}); }) ==
          "all_reduce: group [1, 0] is not a sorted list of distinct ranks (rank " + r + ", world of 2 ranks)");
    CHECK(error_of([&] { launch({"", {}, {}}); }) == "all_reduce: empty group (rank " + r + ", world of 2 ranks)");
    // A partition (MPMD lists, a mesh dim) must split this world, with the group one part.
    const std::string part = "[" + r + "]";
    CHECK(error_of([&] { launch({"", {ctx.rank()}, {{ctx.rank()}, {other}, {2}}}); }) ==
          "all_reduce: the partition [[" + r + "], [" + std::to_string(other) + "], [2]] of group " + part +
              " does not split a world of 2 ranks (rank " + r + ")");
    CHECK(error_of([&] { launch({"", {ctx.rank()}, {{ctx.rank()}}}); }) ==
          "all_reduce: the partition [[" + r + "]] of group " + part + " does not split a world of 2 ranks (rank " + r + ")");
    CHECK(contains(error_of([&] { launch({"", {ctx.rank()}, {{0, 1}}}); }), "does not split a world of 2 ranks"));
    // Nothing reached the backend: the world is intact.
    CHECK(cg::all_reduce(cg::ones<float>({1}), "sum", ctx.world()).item() == 2.f);
    CHECK(launch({"", {ctx.rank()}, {{0}, {1}}}).at(0).to_vector() == std::vector<float>(4, 1.f));
  });
}

TEST_CASE("errors.splits_and_shapes_past_int64") {
  // Split sizes whose sum overflows, and outputs too large to count, are errors naming them.
  constexpr i64 big = std::numeric_limits<i64>::max();
  run(2, [](cg::rank_context& ctx) {
    auto t = cg::ones<float>({4, 2});
    using splits = std::vector<i64>;
    CHECK(error_of([&] { cg::all_to_all_single(t, splits{big, 1}, splits{2, 2}, ctx.world()); }) ==
          "all_to_all_single: output_split_sizes [9223372036854775807, 1] sum past 2^63 - 1");
    CHECK(error_of([&] { cg::all_to_all_single(t, splits{2, 2}, splits{big, big}, ctx.world()); }) ==
          "all_to_all_single: input_split_sizes [9223372036854775807, 9223372036854775807] sum past 2^63 - 1");
    CHECK(error_of([&] { cg::all_to_all_single(t, splits{big / 2, 1}, splits{2, 2}, ctx.world()); }) ==
          "all_to_all_single: output_split_sizes [4611686018427387903, 1] make an output of shape "
          "[4611686018427387904, 2], which has too many elements (the product of its sizes exceeds 2^63 - 1)");
    auto out = cg::empty<float>({4, 2});
    CHECK(error_of([&] { cg::all_to_all_single_(out, t, splits{big, 1}, splits{2, 2}, ctx.world()); }) ==
          "all_to_all_single: output_split_sizes [9223372036854775807, 1] sum past 2^63 - 1");
    // Nothing was launched: the world goes on.
    CHECK(cg::all_reduce(cg::ones<float>({1}), "sum", ctx.world()).item() == 2.f);
  });
  // all_gather's dim 0 times the group size, as inferred for a traced value (no tensor of that
  // size is ever made).
  const cg::tensor_meta huge{cg::dtype::f32, {i64{1} << 62}};
  const cg::group_info four{"0", iota_ranks(4), {}};
  CHECK(error_of([&] { (void)cg::ops::infer(cg::ops::all_gather_into_tensor{4}, {huge}, four); }) ==
        "all_gather_into_tensor: dim 0 (size 4611686018427387904) times group_size 4 exceeds 2^63 - 1");
  const cg::tensor_meta wide{cg::dtype::f32, {i64{1} << 40, i64{1} << 21}};  // 2^61 elements, 2^63 gathered
  CHECK(error_of([&] { (void)cg::ops::infer(cg::ops::all_gather_into_tensor_coalesced{4}, {wide}, four); }) ==
        "all_gather_into_tensor_coalesced: shape [4398046511104, 2097152] has too many elements (the product of "
        "its sizes exceeds 2^63 - 1)");
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // they abort on huge allocations
TEST_CASE("errors.output_that_cannot_be_allocated") {
  // 2^60 rows of one float: countable, but 4 EiB cannot be allocated (more than any address
  // space, whatever the overcommit policy): an error naming the collective and its splits.
  run(1, [](cg::rank_context& ctx) {
    using splits = std::vector<i64>;
    const std::string m = error_of([&] {
      cg::all_to_all_single(cg::ones<float>({4, 1}), splits{i64{1} << 60}, splits{4}, ctx.world());
    });
    CHECK(m ==
          "all_to_all_single: cannot allocate f32[1152921504606846976, 1] (4611686018427387904 bytes) on cpu: "
          "out of memory (output 0 of all_to_all_single(f32[4, 1], output_split_sizes=[1152921504606846976], "
          "input_split_sizes=[4], group=[0]))");
  });
  CHECK(error_of([] { (void)cg::zeros<float>({i64{1} << 60}); }) ==
        "zeros: cannot allocate f32[1152921504606846976] (4611686018427387904 bytes) on cpu: out of memory");
}
#endif
