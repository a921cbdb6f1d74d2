// tests/ops/test_collectives_premul_complex.cpp: premul_sum (c10d's _make_nccl_premul_sum) and
// complex tensors (c64, c128) in the collectives of ccgraph/ops/collectives.hpp, on the threads
// backend for worlds of 1 to 4 ranks against references computed here: every reducing
// collective, c10d's errors for the combinations it refuses, printing, the compile_function
// cache and bucketing keeping two factors apart, and what a complex tensor supports.
#include <doctest/doctest.h>

#include <cmath>
#include <complex>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/ccgraph.hpp>
#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/runtime/compiled_function.hpp>
#include <ccgraph/schedule/bucketing.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace premul_complex_test {

using c64 = std::complex<float>;
using c128 = std::complex<double>;

/// Rank r's value at element i: small integers (and for complex, a second part of another
/// sign), so that sums of up to 4 ranks times a power-of-two factor are exact in every dtype.
template <class T>
T value_of(int r, std::int64_t i) {
  const double re = static_cast<double>((r + 3 * i) % 5 + 1);
  if constexpr (cg::is_complex_v<T>) {
    using R = typename T::value_type;
    return T(static_cast<R>(re), static_cast<R>(-(r + i % 3)));
  } else {
    return cg::detail::cast<T>(re);
  }
}

template <class T>
cg::tensor<T> tensor_of(int r, const cg::shape_t& shape) {
  std::vector<T> v;
  for (std::int64_t i = 0; i < cg::numel_of(shape); ++i) v.push_back(value_of<T>(r, i));
  return cg::tensor<T>::from(v, shape);
}

/// A value as a complex double (real types with a zero imaginary part).
template <class T>
c128 as_c128(T v) {
  if constexpr (cg::is_complex_v<T>) return {static_cast<double>(v.real()), static_cast<double>(v.imag())};
  else return {to_d(v), 0.0};
}

/// The reduction of element i over ranks 0..n-1 by hand: sum, avg (sum / n) or premul_sum
/// (sum of factor * x, the factor first rounded to T's (real part's) type, as NCCL takes it).
template <class T>
c128 reduced(cg::reduce_op op, int n, std::int64_t i) {
  double f = 1;
  if (op.kind() == cg::reduce_kind::premul_sum) {
    if constexpr (cg::is_complex_v<T>) f = static_cast<double>(static_cast<typename T::value_type>(op.factor()));
    else f = to_d(cg::detail::cast<T>(op.factor()));
  }
  c128 acc = 0;
  for (int r = 0; r < n; ++r) acc += f * as_c128(value_of<T>(r, i));
  if (op.kind() == cg::reduce_kind::avg) acc /= static_cast<double>(n);
  return acc;
}

/// Relative tolerance of T's (real part's) type.
template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, cg::bf16>) return 1e-2;
  else if constexpr (std::is_same_v<T, cg::f16>) return 1e-3;
  else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c64>) return 1e-6;
  else return 1e-12;
}

/// `got` (flat, row-major) equals want(i) for every i, within T's tolerance.
template <class T, class W>
void check_values(const std::vector<T>& got, std::int64_t count, W&& want, const std::string& what) {
  REQUIRE(static_cast<std::int64_t>(got.size()) == count);
  for (std::int64_t i = 0; i < count; ++i) {
    const c128 w = want(i), g = as_c128(got[static_cast<std::size_t>(i)]);
    CHECK_MESSAGE(std::abs(g - w) <= tolerance<T>() * (1 + std::abs(w)), what, " element ", i, ": got (", g.real(), ", ",
                  g.imag(), "), want (", w.real(), ", ", w.imag(), ")");
  }
}

/// Runs every reducing collective with `op` on T over worlds of 1 to 4 ranks and checks each
/// against `reduced`: all_reduce, all_reduce_ (in place), reduce_scatter_tensor (dims 0 and
/// 1), the coalesced forms, and reduce (root gets the reduction, the others their input).
template <class T>
void check_every_reducing_collective(cg::reduce_op op) {
  for (int n : {1, 2, 3, 4}) {
    const std::string what = cg::detail::concat(cg::dtype_v<T>, " ", op, " world ", n);
    run(n, [&](cg::rank_context& ctx) {
      const int r = ctx.rank();
      const cg::group w = ctx.world();
      const cg::shape_t shape{static_cast<std::int64_t>(2 * n), 3};
      const std::int64_t count = 6 * n;
      auto full = [&](std::int64_t i) { return reduced<T>(op, n, i); };
      check_values(cg::all_reduce(tensor_of<T>(r, shape), op, w).to_vector(), count, full, what + " all_reduce");
      auto t = tensor_of<T>(r, shape);
      cg::all_reduce_(t, op, w);
      check_values(t.to_vector(), count, full, what + " all_reduce_");
      // dim 0: rank r gets rows [2r, 2r + 2) of the reduction.
      check_values(cg::reduce_scatter_tensor(tensor_of<T>(r, shape), op, 0, w).to_vector(), 6,
                   [&](std::int64_t i) { return full(6 * r + i); }, what + " reduce_scatter_tensor dim 0");
      // dim 1 of a [3, 2n] tensor: rank r gets columns [2r, 2r + 2).
      const cg::shape_t wide{3, static_cast<std::int64_t>(2 * n)};
      check_values(cg::reduce_scatter_tensor(tensor_of<T>(r, wide), op, 1, w).to_vector(), 6,
                   [&](std::int64_t i) { return full((i / 2) * 2 * n + 2 * r + i % 2); },
                   what + " reduce_scatter_tensor dim 1");
      const auto co = cg::all_reduce_coalesced(std::vector{tensor_of<T>(r, shape), tensor_of<T>(r, {4})}, op, w);
      REQUIRE(co.size() == 2);
      check_values(co[0].to_vector(), count, full, what + " all_reduce_coalesced[0]");
      check_values(co[1].to_vector(), 4, full, what + " all_reduce_coalesced[1]");
      const auto rs = cg::reduce_scatter_tensor_coalesced(std::vector{tensor_of<T>(r, shape)}, op, {0}, w);
      REQUIRE(rs.size() == 1);
      check_values(rs[0].to_vector(), 6, [&](std::int64_t i) { return full(6 * r + i); },
                   what + " reduce_scatter_tensor_coalesced");
      const int dst = n - 1;
      check_values(cg::reduce(tensor_of<T>(r, shape), dst, op, w).to_vector(), count,
                   [&](std::int64_t i) { return r == dst ? full(i) : as_c128(value_of<T>(r, i)); }, what + " reduce");
    });
  }
}

// The test cases stay in the namespace: in a unity batch, the other collective test files'
// helpers (value_of, tensor_of) are visible too, and these must win unqualified lookup.

// ---- premul_sum ----

TEST_CASE("premul_sum.reduce_op.value_print_parse") {
  const cg::reduce_op half = cg::premul_sum(0.5);
  CHECK(half.kind() == cg::reduce_kind::premul_sum);
  CHECK(half.factor() == 0.5);
  CHECK(half == cg::reduce_op::premul_sum(0.5));
  CHECK_FALSE(half == cg::premul_sum(0.25));
  CHECK_FALSE(half == cg::reduce_op::sum);
  CHECK_FALSE(cg::premul_sum(0.0) == cg::premul_sum(-0.0));  // bit for bit, as the cache hashes it
  CHECK(cg::to_string(half) == "premul_sum(0.5)");
  CHECK(cg::to_string(cg::premul_sum(0.1)) == "premul_sum(0.1)");  // shortest round trip
  CHECK(cg::to_string(cg::premul_sum(1.0 / 3)) == "premul_sum(0.3333333333333333)");
  std::ostringstream os;
  os << cg::premul_sum(2);
  CHECK(os.str() == "premul_sum(2)");
  // Printing and parsing round-trip, case-insensitively, and reduce_op_arg takes both spellings.
  for (double f : {0.5, 0.1, 1.0 / 3, -2.0, 1e-30}) {
    CHECK(cg::parse_reduce_op(cg::to_string(cg::premul_sum(f))) == cg::premul_sum(f));
    CHECK(cg::reduce_op(cg::reduce_op_arg(cg::premul_sum(f))) == cg::premul_sum(f));
  }
  CHECK(cg::parse_reduce_op("PreMul_Sum(0.25)") == cg::premul_sum(0.25));
  CHECK_FALSE(cg::is_bitwise(half));
  CHECK_FALSE(cg::bool_reduce_as_bytes(half).has_value());
}

TEST_CASE("premul_sum.without_factor_is_an_error_saying_how") {
  const std::string how = "premul_sum needs its factor: pass cg::premul_sum(0.5) (or the string \"premul_sum(0.5)\")";
  CHECK(error_of([] { (void)cg::parse_reduce_op("premul_sum"); }) == "reduce_op 'premul_sum': " + how);
  CHECK(error_of([] { (void)cg::reduce_op_arg("PREMUL_SUM"); }) == "reduce_op 'PREMUL_SUM': " + how);
  CHECK(error_of([] { (void)cg::reduce_op(cg::reduce_kind::premul_sum); }) == "reduce_op: " + how);
  CHECK(error_of([] { (void)cg::parse_reduce_op("premul_sum(half)"); }) ==
        "reduce_op: premul_sum factor 'half' in 'premul_sum(half)' is not a number");
  CHECK(error_of([] { (void)cg::parse_reduce_op("premul_sum()"); }) ==
        "reduce_op: unknown reduce op 'premul_sum()'; valid ops are sum, avg, product, min, max, band, bor, bxor, "
        "premul_sum(<factor>)");
  // Through a collective: the string form fails before anything is issued.
  run(2, [&](cg::rank_context& ctx) {
    CHECK(contains(error_of([&] { (void)cg::all_reduce(cg::ones<float>({2}), "premul_sum", ctx.world()); }), how));
  });
}

TEST_CASE("premul_sum.every_reducing_collective.float_dtypes.worlds_1_to_4") {
  for (double f : {0.5, 0.25, -2.0}) {
    CAPTURE(f);
    check_every_reducing_collective<float>(cg::premul_sum(f));
    check_every_reducing_collective<double>(cg::premul_sum(f));
    check_every_reducing_collective<cg::bf16>(cg::premul_sum(f));
    check_every_reducing_collective<cg::f16>(cg::premul_sum(f));
  }
}

TEST_CASE("premul_sum.factor_cast_to_the_dtype_then_computed_in_its_compute_type") {
  // 0.1 is not a bf16: NCCL multiplies by bf16(0.1) = 0.10009765625, in float, then rounds.
  run(2, [](cg::rank_context& ctx) {
    const auto got = cg::all_reduce(cg::full<cg::bf16>({1}, cg::bf16(3.0f)), cg::premul_sum(0.1), ctx.world()).to_vector();
    const float f = static_cast<float>(cg::bf16(0.1f));
    CHECK(f != 0.1f);
    CHECK(static_cast<float>(got[0]) == static_cast<float>(cg::bf16(3.0f * f + 3.0f * f)));
    // f64 keeps the factor exactly: sum of 0.1 * 3 twice.
    const auto d = cg::all_reduce(cg::full<double>({1}, 3.0), cg::premul_sum(0.1), ctx.world()).to_vector();
    CHECK(d[0] == 0.1 * 3.0 + 0.1 * 3.0);
  });
}

TEST_CASE("premul_sum.integer_and_bool_refused_as_c10d") {
  run(2, [](cg::rank_context& ctx) {
    const cg::group w = ctx.world();
    const auto op = cg::premul_sum(0.5);
    CHECK(error_of([&] { (void)cg::all_reduce(cg::ones<std::int32_t>({2}), op, w); }) ==
          "all_reduce: reduce op premul_sum(0.5) needs a floating or complex tensor (f16, bf16, f32, f64, c64, c128), "
          "got i32");
    CHECK(contains(error_of([&] { (void)cg::reduce_scatter_tensor(cg::ones<std::int64_t>({4}), op, 0, w); }),
                   "reduce_scatter_tensor: reduce op premul_sum(0.5) needs a floating or complex tensor"));
    CHECK(contains(error_of([&] { (void)cg::reduce(cg::ones<std::uint8_t>({2}), 0, op, w); }),
                   "reduce: reduce op premul_sum(0.5) needs a floating or complex tensor"));
    CHECK(contains(error_of([&] { (void)cg::all_reduce_coalesced(std::vector{cg::ones<bool>({2})}, op, w); }),
                   "all_reduce_coalesced: reduce op premul_sum(0.5) needs a floating or complex tensor (f16, bf16, "
                   "f32, f64, c64, c128), got bool"));
  });
}

TEST_CASE("premul_sum.ranks_with_different_factors_mismatch") {
  // The factor is part of what every member must agree on, as the op is.
  std::vector<std::string> errs(2);
  try {
    cg::run_threads(2, [&](cg::rank_context& ctx) {
      try {
        (void)cg::all_reduce(cg::ones<float>({2}), cg::premul_sum(ctx.rank() ? 0.5 : 0.25), ctx.world()).to_vector();
      } catch (const cg::error& e) {
        errs[static_cast<std::size_t>(ctx.rank())] = e.what();
        throw;
      }
    }, threads_opts());
  } catch (const cg::error&) {
  }
  CHECK((contains(errs[0], "premul_sum(0.25)") || contains(errs[1], "premul_sum(0.25)")));
  CHECK((contains(errs[0], "premul_sum(0.5)") || contains(errs[1], "premul_sum(0.5)")));
}

TEST_CASE("premul_sum.traced.printed_with_factor_and_equal_to_eager") {
  run(3, [](cg::rank_context& ctx) {
    const cg::group w = ctx.world();
    auto program = [&](auto x, auto y) {
      auto a = cg::all_reduce(x, cg::premul_sum(0.5), w);
      auto b = cg::reduce_scatter_tensor(y, "premul_sum(0.25)", 0, w);
      return std::make_tuple(a, b);
    };
    const auto x = tensor_of<float>(ctx.rank(), {3, 2}), y = tensor_of<float>(ctx.rank() + 1, {6});
    const auto [ea, eb] = program(x, y);
    auto g = cg::trace(program, cg::input<float>({3, 2}), cg::input<float>({6}));
    std::ostringstream os;
    os << g;
    CHECK(contains(os.str(), "op=premul_sum(0.5)"));
    CHECK(contains(os.str(), "op=premul_sum(0.25)"));
    const auto [ga, gb] = cg::compile(g, ctx)(x, y);
    CHECK(ga.to_vector() == ea.to_vector());
    CHECK(gb.to_vector() == eb.to_vector());
  });
}

TEST_CASE("premul_sum.structural_hash_and_equality_keep_factors_apart") {
  auto traced = [](cg::reduce_op op) {
    return cg::trace(world(2), [op](auto x) { return cg::all_reduce(x, op, cg::group{iota_ranks(2)}); },
                     cg::input<float>({4}));
  };
  const auto a = traced(cg::premul_sum(0.5)), b = traced(cg::premul_sum(0.25)), c = traced(cg::premul_sum(0.5));
  CHECK(cg::structural_hash(a) != cg::structural_hash(b));
  CHECK(cg::structural_hash(a) == cg::structural_hash(c));
  CHECK(cg::structural_hash(a) != cg::structural_hash(traced(cg::reduce_op::sum)));
}

TEST_CASE("premul_sum.compile_function.one_graph_per_factor") {
  run(2, [](cg::rank_context& ctx) {
    auto f = cg::compile_function<float, cg::host_arg<double>>(
        [&](auto x, double k) { return cg::all_reduce(x, cg::premul_sum(k), ctx.world()); }, ctx);
    const auto x = tensor_of<float>(ctx.rank(), {4});
    for (double k : {0.5, 0.25, 0.5, 2.0, 0.25}) {
      CAPTURE(k);
      CHECK(f(x, k).to_vector() == cg::all_reduce(x, cg::premul_sum(k), ctx.world()).to_vector());
    }
    CHECK(f.compiles() == 3);  // one graph per factor, never another factor's
    auto g = cg::compile_function<float, cg::host_arg<double>>(
        [&](auto x, double k) { return cg::all_reduce(x, cg::premul_sum(k), ctx.world()); }, ctx,
        {.guard = cg::function_guard::arguments});
    for (double k : {0.5, 0.25, 0.5}) CHECK(g(x, k).to_vector() == cg::all_reduce(x, cg::premul_sum(k), ctx.world()).to_vector());
    CHECK(g.compiles() == 2);
  });
}

TEST_CASE("premul_sum.bucketing.merges_equal_factors_only") {
  // Bucketing merges a run of compatible collectives: 0.5 and 0.5 merge, 0.25 and 0.25 merge,
  // the boundary between 0.5 and 0.25 and the sum after them is never crossed.
  const cg::group grp{iota_ranks(2)};
  const auto g = cg::trace(world(2), [&](auto a, auto b, auto c, auto d, auto e) {
    auto ra = cg::all_reduce(a, cg::premul_sum(0.5), grp);
    auto rb = cg::all_reduce(b, cg::premul_sum(0.5), grp);
    auto rc = cg::all_reduce(c, cg::premul_sum(0.25), grp);
    auto rd = cg::all_reduce(d, cg::premul_sum(0.25), grp);
    auto re = cg::all_reduce(e, "sum", grp);
    return std::make_tuple(ra, rb, rc, rd, re);
  }, cg::input<float>({4}), cg::input<float>({4}), cg::input<float>({4}), cg::input<float>({4}), cg::input<float>({4}));
  auto b = g;
  cg::bucket_collectives(b, 1 << 20);
  REQUIRE(b.count("all_reduce_coalesced") == 2);
  CHECK(b.count("all_reduce") == 1);
  std::vector<cg::reduce_op> merged;
  for (const cg::node* n : b.nodes())
    if (const auto* m = std::get_if<cg::ops::all_reduce_coalesced>(&n->kind())) {
      CHECK(n->args().size() == 2);
      merged.push_back(m->op);
    }
  CHECK(merged == std::vector<cg::reduce_op>{cg::premul_sum(0.5), cg::premul_sum(0.25)});
  run(2, [&](cg::rank_context& ctx) {
    std::vector<cg::tensor<float>> in;
    for (int k = 0; k < 5; ++k) in.push_back(tensor_of<float>(ctx.rank() + k, {4}));
    const auto want = cg::compile(g, ctx)(in[0], in[1], in[2], in[3], in[4]);
    const auto got = cg::compile(b, ctx)(in[0], in[1], in[2], in[3], in[4]);
    CHECK(std::get<0>(got).to_vector() == std::get<0>(want).to_vector());
    CHECK(std::get<1>(got).to_vector() == std::get<1>(want).to_vector());
    CHECK(std::get<2>(got).to_vector() == std::get<2>(want).to_vector());
    CHECK(std::get<3>(got).to_vector() == std::get<3>(want).to_vector());
    CHECK(std::get<4>(got).to_vector() == std::get<4>(want).to_vector());
    // And against the reference: rank-summed inputs times the factor.
    CHECK(std::get<0>(got).to_vector()[0] == 0.5f * (value_of<float>(0, 0) + value_of<float>(1, 0)));
  });
}

// ---- complex ----

TEST_CASE("complex.dtype_and_tensor") {
  static_assert(cg::dtype_v<c64> == cg::dtype::c64 && cg::dtype_v<c128> == cg::dtype::c128);
  static_assert(cg::element_size(cg::dtype::c64) == 8 && cg::element_size(cg::dtype::c128) == 16);
  static_assert(cg::is_complex(cg::dtype::c64) && !cg::is_floating(cg::dtype::c64) && !cg::is_complex(cg::dtype::f32));
  static_assert(cg::real_dtype(cg::dtype::c128) == cg::dtype::f64 && cg::real_dtype(cg::dtype::i32) == cg::dtype::i32);
  static_assert(cg::element<c64> && !cg::real_element<c64> && cg::real_element<float>);
  CHECK(cg::to_string(cg::dtype::c64) == "c64");
  CHECK(cg::to_string(cg::dtype::c128) == "c128");
  // Creation, to_vector.
  CHECK(cg::zeros<c64>({2}).to_vector() == std::vector<c64>{0, 0});
  CHECK(cg::ones<c128>({2}).to_vector() == std::vector<c128>{1, 1});
  CHECK(cg::full<c64>({2}, c64(1, -2)).to_vector() == std::vector<c64>{{1, -2}, {1, -2}});
  const auto t = cg::tensor<c64>::from({{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}, {11, 12}}, {2, 3});
  CHECK(t.dtype() == cg::dtype::c64);
  CHECK(t.at({1, 2}) == c64(11, 12));
  // Views and copies.
  CHECK(t.transpose(0, 1).contiguous().to_vector() == std::vector<c64>{{1, 2}, {7, 8}, {3, 4}, {9, 10}, {5, 6}, {11, 12}});
  CHECK(t.narrow(1, 1, 2).to_vector() == std::vector<c64>{{3, 4}, {5, 6}, {9, 10}, {11, 12}});
  CHECK(t.select(0, 1).to_vector() == std::vector<c64>{{7, 8}, {9, 10}, {11, 12}});
  CHECK(t.reshape({3, 2}).shape() == cg::shape_t{3, 2});
  auto u = cg::zeros<c64>({2, 3});
  u.copy_(t);
  CHECK(u.to_vector() == t.to_vector());
  CHECK(t.clone().to_vector() == t.to_vector());
  CHECK(t.repeat({1, 2}).to_vector().size() == 12);
  CHECK(cg::cat(std::vector{t, t}, 0).shape() == cg::shape_t{4, 3});
  CHECK(cg::meta_of(cg::any_tensor(t)) == cg::tensor_meta{cg::dtype::c64, {2, 3}});
  // Printing, as PyTorch.
  std::ostringstream os;
  os << cg::tensor<c64>::from({{1, 2}, {0.5f, -1}}, {2});
  CHECK(os.str() == "tensor([1.+2.j, 0.5-1.j], dtype=c64)");
}

TEST_CASE("complex.sum_avg_premul_sum.every_reducing_collective.worlds_1_to_4") {
  for (cg::reduce_op op : {cg::reduce_op::sum, cg::reduce_op::avg, cg::premul_sum(0.5), cg::premul_sum(-0.25)}) {
    CAPTURE(cg::to_string(op));
    check_every_reducing_collective<c64>(op);
    check_every_reducing_collective<c128>(op);
  }
}

TEST_CASE("complex.other_reduce_ops_refused_as_c10d") {
  run(2, [](cg::rank_context& ctx) {
    const cg::group w = ctx.world();
    for (cg::reduce_op op : {cg::reduce_op::product, cg::reduce_op::min, cg::reduce_op::max, cg::reduce_op::band,
                             cg::reduce_op::bor, cg::reduce_op::bxor}) {
      const std::string tail = " on complex tensors (c64; it supports sum, avg and premul_sum)";
      const std::string name = cg::to_string(op);
      CHECK(error_of([&] { (void)cg::all_reduce(cg::ones<c64>({2}), op, w); }) ==
            "all_reduce does not support " + name + tail);
      CHECK(error_of([&] { (void)cg::reduce_scatter_tensor(cg::ones<c64>({2}), op, 0, w); }) ==
            "reduce_scatter_tensor does not support " + name + tail);
      CHECK(error_of([&] { (void)cg::reduce(cg::ones<c64>({2}), 0, op, w); }) == "reduce does not support " + name + tail);
      CHECK(contains(error_of([&] { (void)cg::all_reduce_coalesced(std::vector{cg::ones<c128>({2})}, op, w); }),
                     "all_reduce_coalesced does not support " + name + " on complex tensors (c128"));
      CHECK(contains(error_of([&] { (void)cg::reduce_scatter_tensor_coalesced(std::vector{cg::ones<c128>({2})}, op, {0}, w); }),
                     "reduce_scatter_tensor_coalesced does not support " + name + " on complex tensors"));
    }
  });
}

TEST_CASE("complex.moving_collectives.worlds_1_to_4") {
  // all_gather, broadcast, all_to_all, send/recv, gather/scatter move complex elements as they are.
  auto check = [](auto tag) {
    using T = decltype(tag);
    for (int n : {1, 2, 3, 4})
      run(n, [&](cg::rank_context& ctx) {
        const int r = ctx.rank();
        const cg::group w = ctx.world();
        std::vector<T> all;
        for (int k = 0; k < n; ++k)
          for (auto v : tensor_of<T>(k, {2}).to_vector()) all.push_back(v);
        CHECK(cg::all_gather_tensor(tensor_of<T>(r, {2}), 0, w).to_vector() == all);
        CHECK(cg::broadcast(tensor_of<T>(r, {3}), n - 1, w).to_vector() == tensor_of<T>(n - 1, {3}).to_vector());
        // all_to_all_single, even splits: rank r gets chunk r of every rank's [n, 2] tensor.
        std::vector<T> want;
        for (int k = 0; k < n; ++k) {
          const auto v = tensor_of<T>(k, {n, 2}).to_vector();
          want.push_back(v[static_cast<std::size_t>(2 * r)]);
          want.push_back(v[static_cast<std::size_t>(2 * r + 1)]);
        }
        CHECK(cg::all_to_all_single(tensor_of<T>(r, {n, 2}), std::nullopt, std::nullopt, w).to_vector() == want);
        const auto parts = cg::gather(tensor_of<T>(r, {2}), 0, w);
        if (r == 0) {
          REQUIRE(static_cast<int>(parts.size()) == n);
          for (int k = 0; k < n; ++k) CHECK(parts[static_cast<std::size_t>(k)].to_vector() == tensor_of<T>(k, {2}).to_vector());
        }
        const auto piece = cg::scatter(r == 0 ? tensor_of<T>(9, {2 * n}) : cg::zeros<T>({2 * n}), 0, w);
        const auto src = tensor_of<T>(9, {2 * n}).to_vector();
        CHECK(piece.to_vector() == std::vector<T>{src[static_cast<std::size_t>(2 * r)], src[static_cast<std::size_t>(2 * r + 1)]});
        if (n >= 2) {  // a ring of send/recv
          const int next = (r + 1) % n, prev = (r + n - 1) % n;
          const auto got = cg::batch_isend_irecv({cg::isend(tensor_of<T>(r, {3}), next), cg::irecv(cg::zeros<T>({3}), prev)}, w);
          REQUIRE(got.size() == 1);
          CHECK(got[0].to_vector() == tensor_of<T>(prev, {3}).to_vector());
        }
      });
  };
  check(c64{});
  check(c128{});
}

TEST_CASE("complex.traced.collectives_equal_to_eager") {
  run(2, [](cg::rank_context& ctx) {
    const cg::group w = ctx.world();
    auto program = [&](auto x) {
      auto a = cg::all_reduce(x, "avg", w);
      auto b = cg::all_gather_tensor(a, 1, w);
      return cg::reduce_scatter_tensor(b, cg::premul_sum(0.5), 1, w);
    };
    const auto x = tensor_of<c64>(ctx.rank(), {2, 3});
    const auto eager = program(x).to_vector();
    auto g = cg::trace(program, cg::input<c64>({2, 3}));
    CHECK(cg::compile(g, ctx)(x).to_vector() == eager);
    auto s = cg::schedule(g, {"bucket_collectives", "overlap"});
    CHECK(cg::compile(s, ctx)(x).to_vector() == eager);
  });
}

TEST_CASE("complex.compute_ops_refuse_naming_op_and_dtype") {
  // Compute kernels are instantiated for the real dtypes only: a traced matmul of complex
  // values is refused when it is recorded, naming the op and the input.
  CHECK(error_of([] {
          (void)cg::trace(world(1), [](auto x) { return cg::matmul(x, x); }, cg::input<c64>({2, 2}));
        }) == "matmul: input 0 is c64[2, 2]; complex tensors are not supported by matmul (collectives, copies and "
              "views take them; compute ops take real dtypes)");
  // The last guard, for a kernel reached some other way.
  CHECK(error_of([] { cg::visit_dtype(cg::dtype::c128, [](auto) {}); }) ==
        "c128 tensors are not supported by this op: compute ops take real dtypes; collectives, copies and views "
        "take complex ones");
  int seen = 0;
  cg::visit_any_dtype(cg::dtype::c128, [&](auto t) { seen = std::is_same_v<decltype(t), c128> ? 1 : 2; });
  CHECK(seen == 1);
}

}  // namespace premul_complex_test
