// tests/expr/test_expr.cpp: lazy pointwise expressions (ccgraph/expr/*.hpp and
// ccgraph/ops/pointwise.hpp): laziness and one-loop fusion, compile-time structure,
// broadcasting, shape errors, every op against a std:: reference, every element type.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <ccgraph/expr/expr.hpp>
#include <ccgraph/expr/functors.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using i64 = std::int64_t;

/// Relative tolerance of one rounding to T (a few ulps for the float types).
template <class T>
double tol() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  if constexpr (std::is_same_v<T, cg::bf16>) return 1.0 / 128;
  if constexpr (std::is_same_v<T, cg::f16>) return 1.0 / 1024;
  return 0;
}

bool close(double got, double want, double rel) {
  if (std::isnan(want)) return std::isnan(got);
  return std::abs(got - want) <= rel * std::max(1.0, std::abs(want));
}

// A pointwise op of the test's own that records every call: proves laziness (no calls before
// eval) and fusion (calls of the two ops interleave element by element: one loop, not two).
std::vector<int>& call_log() {
  static std::vector<int> log;
  return log;
}
template <int Id>
struct logged : cg::detail::pointwise_tag<logged<Id>, 1> {
  static constexpr std::string_view name = Id == 1 ? "logged1" : "logged2";
  template <class C>
  static C compute(C a) {
    call_log().push_back(Id);
    return a + C(Id);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Laziness and fusion
// ---------------------------------------------------------------------------------------------

TEST_CASE("expr.lazy.no_work_until_eval") {
  auto a = cg::uniform<float>({5, 7}, -1, 1, 1);
  call_log().clear();
  auto e = cg::detail::make_expr<logged<2>>(cg::detail::make_expr<logged<1>>(a));
  static_assert(cg::is_pointwise_op_v<logged<1>>);
  CHECK(call_log().empty());  // building did no work
  CHECK(e.shape() == cg::shape_t{5, 7});
  cg::tensor<float> out = e;
  REQUIRE(call_log().size() == 2 * 35);
  for (std::size_t i = 0; i < call_log().size(); ++i) CHECK(call_log()[i] == (i % 2 == 0 ? 1 : 2));
  const auto av = a.to_vector(), ov = out.to_vector();
  for (std::size_t i = 0; i < av.size(); ++i) CHECK(ov[i] == (av[i] + 1.f) + 2.f);
  // The strided path (a transposed operand) is one loop too.
  call_log().clear();
  cg::tensor<float> outt = cg::detail::make_expr<logged<2>>(cg::detail::make_expr<logged<1>>(a.transpose(0, 1)));
  REQUIRE(call_log().size() == 2 * 35);
  for (std::size_t i = 0; i < call_log().size(); ++i) CHECK(call_log()[i] == (i % 2 == 0 ? 1 : 2));
  CHECK(outt.shape() == cg::shape_t{7, 5});
}

TEST_CASE("expr.lazy.reads_operands_at_eval") {
  auto a = cg::tensor<float>::from({1, 2, 3}, {3});
  auto b = cg::tensor<float>::from({10, 20, 30}, {3});
  auto e = a * 2 + b;
  a.fill_(5.f);  // the expression shares a's memory and has not read it yet
  CHECK(e.to_vector() == std::vector<float>{20, 30, 40});
}

TEST_CASE("expr.lazy.auto_keeps_operands_alive") {
  auto make = [] {
    auto a = cg::tensor<float>::from({1, 2}, {2});
    auto b = cg::tensor<float>::from({3, 4}, {2});
    return cg::relu(a - b) + a * b;  // a and b die here; the expression holds them
  };
  auto e = make();
  cg::tensor<float> x = e;
  CHECK(x.to_vector() == std::vector<float>{3, 8});
}

TEST_CASE("expr.pending_operand.waits_at_eval") {
  auto work = std::make_shared<cg::detail::work>();
  auto st = cg::detail::storage::host(4 * sizeof(float));
  cg::tensor<float> pending(st, {4}, {1}, 0, work);
  auto b = cg::full<float>({4}, 1.f);
  auto e = cg::relu(pending) + b;  // building must not wait
  CHECK(pending.is_pending());
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    float* p = pending.data_unsynced();
    for (int i = 0; i < 4; ++i) p[i] = static_cast<float>(i) - 1.5f;
    work->complete();
  });
  const auto v = e.to_vector();  // waits for the writer
  writer.join();
  CHECK(v == std::vector<float>{1.f, 1.f, 1.5f, 2.5f});

  auto failed = std::make_shared<cg::detail::work>();
  cg::tensor<float> bad(cg::detail::storage::host(4 * sizeof(float)), {4}, {1}, 0, failed);
  auto e2 = bad * 2;
  failed->fail(std::make_exception_ptr(cg::error("all_reduce failed")));
  CHECK_THROWS_WITH_AS(e2.eval(), "all_reduce failed", cg::error);
}

TEST_CASE("expr.fused.equals_op_by_op") {
  // One rounding per op, as in eager PyTorch: fusing a bf16 chain changes nothing, bit for bit.
  auto a = cg::uniform<cg::bf16>({33, 17}, -3, 3, 1);
  auto b = cg::uniform<cg::bf16>({33, 17}, -3, 3, 2);
  cg::tensor<cg::bf16> fused = cg::gelu(a * b + 0.5) - cg::sin(b) / 3;
  cg::tensor<cg::bf16> t1 = a * b;
  cg::tensor<cg::bf16> t2 = t1 + 0.5;
  cg::tensor<cg::bf16> t3 = cg::gelu(t2);
  cg::tensor<cg::bf16> t4 = cg::sin(b);
  cg::tensor<cg::bf16> t5 = t4 / 3;
  cg::tensor<cg::bf16> t6 = t3 - t5;
  const auto f = fused.to_vector(), s = t6.to_vector();
  for (std::size_t i = 0; i < f.size(); ++i) CHECK(f[i].bits == s[i].bits);
}

// ---------------------------------------------------------------------------------------------
// Compile-time structure
// ---------------------------------------------------------------------------------------------

TEST_CASE("expr.static.structure") {
  auto a = cg::uniform<float>({2, 3}, -1, 1, 1);
  auto b = cg::uniform<float>({3}, -1, 1, 2);
  auto e = cg::relu(a) * b + a * 2.f;
  using E = decltype(e);
  static_assert(cg::expression<E>);
  static_assert(!cg::expression<cg::tensor<float>>);
  static_assert(std::is_same_v<E::value_type, float>);
  static_assert(std::is_same_v<E::op_type, cg::ops::add>);
  static_assert(cg::count_ops_v<E, cg::ops::mul> == 2);
  static_assert(cg::count_ops_v<E, cg::ops::add> == 1);
  static_assert(cg::count_ops_v<E, cg::ops::relu> == 1);
  static_assert(cg::count_ops_v<E, cg::ops::gelu> == 0);
  static_assert(cg::count_ops_v<const E&, cg::ops::mul> == 2);
  static_assert(cg::op_count_v<E> == 4);
  static_assert(cg::leaf_count_v<E> == 3);
  static_assert(cg::scalar_count_v<E> == 1);
  static_assert(cg::expression_depth_v<E> == 3);
  static_assert(cg::expression_depth_v<cg::tensor<float>> == 0);
  static_assert(cg::op_count_v<cg::tensor<float>> == 0);
  static_assert(cg::all_op_names_v<E>.size() == 4);
  static_assert(cg::op_names_v<E>.size() == 3);
  static_assert(cg::op_names_v<E>[0] == "relu" && cg::op_names_v<E>[1] == "mul" &&
                cg::op_names_v<E>[2] == "add");
  static_assert(cg::fused_name_v<E> == "fused_relu_mul_add");
  static_assert(cg::fused_name_v<decltype(cg::relu(a))> == "fused_relu");
  static_assert(E::dtype() == cg::dtype::f32);
  CHECK(cg::fused_name_v<E> == "fused_relu_mul_add");
  CHECK(e.shape() == cg::shape_t{2, 3});
  CHECK(e.dim() == 2);
  CHECK(e.numel() == 6);

  // Concepts: operators only take tensors, expressions and scalars.
  static_assert(cg::pointwise_operand<cg::tensor<cg::bf16>>);
  static_assert(cg::pointwise_operand<const E&>);
  static_assert(!cg::pointwise_operand<float>);
  static_assert(cg::scalar_operand<double> && cg::scalar_operand<cg::f16>);
  static_assert(cg::pointwise_operand_pair<cg::tensor<float>, double>);
  static_assert(cg::pointwise_operand_pair<int, E>);
  static_assert(!cg::pointwise_operand_pair<float, float>);
  static_assert(!cg::pointwise_operand_pair<std::string, cg::tensor<float>>);
  static_assert(!cg::pointwise_operand_pair<std::vector<float>, cg::tensor<float>>);
  // The dtype rule: tensor operands must agree; a scalar of any type is fine.
  static_assert(cg::is_same_dtype_v<cg::tensor<float>, E>);
  static_assert(!cg::is_same_dtype_v<cg::tensor<double>, E>);
  static_assert(cg::is_same_dtype_v<cg::tensor<double>, float>);
  static_assert(std::is_same_v<cg::value_type_t<decltype(cg::tensor<cg::f16>{} * 2.0)>, cg::f16>);
  // Ops that need floating point refuse integer tensors at compile time (compile_fail tests);
  // the tags say which.
  static_assert(cg::ops::gelu::floating_only && !cg::ops::relu::floating_only);
  static_assert(cg::ops::add::arity == 2 && cg::ops::exp::arity == 1);
}

TEST_CASE("expr.static.visit_and_rebind_leaves") {
  auto a = cg::tensor<float>::from({1, 2, 3}, {3});
  auto b = cg::tensor<float>::from({4, 5, 6}, {3});
  auto e = a * 2.f + cg::relu(b);
  std::vector<const float*> seen;
  std::vector<float> scalars;
  cg::detail::visit_leaves(e, [&](const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<L, cg::detail::tensor_leaf<float>>)
      seen.push_back(leaf.value.data_unsynced());
    else
      scalars.push_back(leaf.value);
  });
  CHECK(seen == std::vector<const float*>{a.data_unsynced(), b.data_unsynced()});
  CHECK(scalars == std::vector<float>{2.f});
  // Re-run the same expression type on other tensors (what a graph executor does).
  auto c = cg::tensor<float>::from({-1, -1}, {2});
  auto d = cg::tensor<float>::from({-7, 8}, {2});
  auto e2 = cg::detail::rebind_leaves(e, std::vector<cg::tensor<float>>{c, d});
  static_assert(std::is_same_v<decltype(e2), decltype(e)>);
  CHECK(e2.shape() == cg::shape_t{2});
  CHECK(e2.to_vector() == std::vector<float>{-2, 6});
  CHECK(error_of([&] { (void)cg::detail::rebind_leaves(e, std::vector<cg::tensor<float>>{c}); })
            .find("needs more than 1") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Broadcasting and shapes
// ---------------------------------------------------------------------------------------------

TEST_CASE("expr.broadcast.scalar") {
  auto a = cg::tensor<float>::from({1, -2, 3, -4}, {2, 2});
  CHECK((a + 1).to_vector() == std::vector<float>{2, -1, 4, -3});
  CHECK((1 - a).to_vector() == std::vector<float>{0, 3, -2, 5});
  CHECK((a * 0.5).to_vector() == std::vector<float>{0.5, -1, 1.5, -2});
  CHECK((12.0 / a).to_vector() == std::vector<float>{12, -6, 4, -3});
  CHECK((-a).to_vector() == std::vector<float>{-1, 2, -3, 4});
  CHECK((a / 2).shape() == cg::shape_t{2, 2});
  // A 0-d tensor broadcasts like a scalar.
  auto s = cg::full<float>({}, 3.f);
  CHECK((a * s).to_vector() == std::vector<float>{3, -6, 9, -12});
  CHECK((s * s).shape() == cg::shape_t{});
  CHECK((s * s).to_vector() == std::vector<float>{9});
  // Integer scalars with an integer tensor, a double with an int tensor (converted to int).
  auto i = cg::tensor<std::int32_t>::from({7, -7}, {2});
  CHECK((i / 2).to_vector() == std::vector<std::int32_t>{3, -3});  // truncates
  CHECK((i * 2.9).to_vector() == std::vector<std::int32_t>{14, -14});
}

TEST_CASE("expr.broadcast.trailing_dims") {
  auto a = cg::uniform<float>({4, 3}, -1, 1, 1);
  auto row = cg::uniform<float>({3}, -1, 1, 2);
  auto col = cg::uniform<float>({4, 1}, -1, 1, 3);
  auto cube = cg::uniform<float>({2, 1, 3}, -1, 1, 4);
  cg::tensor<float> r = a + row * col;
  REQUIRE(r.shape() == cg::shape_t{4, 3});
  cg::tensor<float> q = cube - col;  // [2,1,3] and [4,1] -> [2,4,3]
  REQUIRE(q.shape() == cg::shape_t{2, 4, 3});
  for (i64 i = 0; i < 4; ++i)
    for (i64 j = 0; j < 3; ++j) {
      const float want = a.at({i, j}) + row.at({j}) * col.at({i, 0});
      CHECK(r.at({i, j}) == want);
      for (i64 k = 0; k < 2; ++k) CHECK(q.at({k, i, j}) == cube.at({k, 0, j}) - col.at({i, 0}));
    }
}

TEST_CASE("expr.paths.flat_rows_general") {
  // The three loops of evaluate_into: flat (all contiguous, same shape), rows (contiguous along
  // the last dim: bias rows, narrowed blocks) and general (any strides, stride-0 last dims).
  auto base = cg::uniform<float>({9, 40}, -1, 1, 1);
  auto block = base.narrow(1, 3, 35);  // [9, 35], rows of a wider tensor
  auto bias = cg::uniform<float>({35}, -1, 1, 2);
  auto col = cg::uniform<float>({9, 1}, -1, 1, 3);
  auto full = cg::uniform<float>({9, 35}, -1, 1, 4);
  cg::tensor<float> flat = cg::relu(full) * 3 - full;
  cg::tensor<float> rows = cg::relu(block) * bias + full;
  cg::tensor<float> general = cg::relu(block) * col + bias;
  cg::tensor<float> transposed = cg::relu(full.transpose(0, 1)) + 1;
  for (i64 i = 0; i < 9; ++i)
    for (i64 j = 0; j < 35; ++j) {
      const float x = block.at({i, j}), f = full.at({i, j});
      CHECK(flat.at({i, j}) == std::max(f, 0.f) * 3 - f);
      CHECK(rows.at({i, j}) == std::max(x, 0.f) * bias.at({j}) + f);
      CHECK(general.at({i, j}) == std::max(x, 0.f) * col.at({i, 0}) + bias.at({j}));
      CHECK(transposed.at({j, i}) == std::max(f, 0.f) + 1);
    }
}

TEST_CASE("expr.shape_mismatch.names_both_shapes") {
  auto a = cg::uniform<float>({2, 3}, -1, 1, 1);
  auto b = cg::uniform<float>({4}, -1, 1, 2);
  // Thrown when the expression is built, not when it is evaluated.
  const std::string msg = error_of([&] { auto e = a + b; (void)e; });
  CHECK(msg.find("add: shapes [2, 3] and [4] cannot be broadcast together") != std::string::npos);
  const std::string msg2 = error_of([&] { auto e = cg::relu(a) * cg::uniform<float>({3, 3}); (void)e; });
  CHECK(msg2.find("mul: shapes [2, 3] and [3, 3] cannot be broadcast together") != std::string::npos);
  CHECK_THROWS_AS((void)(a - b), cg::error);
  CHECK_THROWS_AS((void)(a / b), cg::error);
}

TEST_CASE("expr.strided.views") {
  auto base = cg::uniform<double>({6, 8}, -2, 2, 7);
  auto t = base.transpose(0, 1);           // [8, 6], not contiguous
  auto n = base.narrow(1, 2, 6).transpose(0, 1);  // [6, 6] with an offset
  auto u = cg::uniform<double>({8, 6}, -2, 2, 8);
  cg::tensor<double> r = cg::exp(t) * u - t;
  cg::tensor<double> r2 = n + n.transpose(0, 1);
  REQUIRE(r.is_contiguous());
  for (i64 i = 0; i < 8; ++i)
    for (i64 j = 0; j < 6; ++j) CHECK(r.at({i, j}) == std::exp(base.at({j, i})) * u.at({i, j}) - base.at({j, i}));
  for (i64 i = 0; i < 6; ++i)
    for (i64 j = 0; j < 6; ++j) CHECK(r2.at({i, j}) == base.at({j, i + 2}) + base.at({i, j + 2}));
  // Evaluating into a strided output (an executor's planned buffer).
  auto out = cg::tensor<double>::empty({6, 8}).transpose(0, 1);
  cg::detail::evaluate_into(cg::exp(t) * u - t, out);
  for (i64 i = 0; i < 8; ++i)
    for (i64 j = 0; j < 6; ++j) CHECK(out.at({i, j}) == r.at({i, j}));
  CHECK_THROWS_AS(cg::detail::evaluate_into(cg::exp(t), cg::tensor<double>::empty({6, 8})), cg::error);
}

TEST_CASE("expr.empty_and_scalar_shapes") {
  auto e = cg::tensor<float>::empty({0, 3});
  cg::tensor<float> r = cg::relu(e) + cg::tensor<float>::empty({3});
  CHECK(r.shape() == cg::shape_t{0, 3});
  CHECK(r.numel() == 0);
  auto s = cg::full<float>({}, -2.f);
  cg::tensor<float> rs = cg::abs(s);
  CHECK(rs.shape() == cg::shape_t{});
  CHECK(rs.item() == 2.f);
}

TEST_CASE("expr.conversions_and_printing") {
  auto a = cg::tensor<float>::from({1, -2}, {2});
  auto b = cg::tensor<float>::from({3, 4}, {2});
  {
    cg::tensor<float> c = cg::relu(a) + b * 2.f;
    CHECK(c.to_vector() == std::vector<float>{7, 8});
    auto d = a + b;
    cg::tensor<float> x = d;
    CHECK(x.to_vector() == std::vector<float>{4, 2});
    CHECK(cg::eval(d).to_vector() == std::vector<float>{4, 2});
    CHECK(cg::eval(a).data_unsynced() == a.data_unsynced());  // a tensor passes through
  }
  std::ostringstream os, ref;
  os << cg::relu(a) * 2;
  ref << cg::tensor<float>::from({2, 0}, {2});
  CHECK(os.str() == ref.str());
  CHECK(os.str() == "tensor([2., 0.], dtype=f32)");
}

// ---------------------------------------------------------------------------------------------
// Every op against a std:: reference, every element type
// ---------------------------------------------------------------------------------------------

namespace {

/// Checks a unary op on T against `ref` computed in double, within T's rounding.
template <class T, class Op, class Ref>
void check_unary(const char* name, Op op, Ref ref, double lo, double hi) {
  CAPTURE(name);
  auto a = cg::uniform<T>({37, 5}, lo, hi, 11);
  cg::tensor<T> r = op(a);
  const auto av = a.to_vector(), rv = r.to_vector();
  REQUIRE(rv.size() == av.size());
  for (std::size_t i = 0; i < av.size(); ++i) {
    CAPTURE(to_d(av[i]));
    CHECK(close(to_d(rv[i]), ref(to_d(av[i])), tol<T>()));
  }
}

/// Checks a binary op on T against `ref` computed in double (with a row-broadcast operand).
template <class T, class Op, class Ref>
void check_binary(const char* name, Op op, Ref ref) {
  CAPTURE(name);
  auto a = cg::uniform<T>({9, 7}, -4, 4, 21);
  auto b = cg::uniform<T>({7}, 1, 4, 22);  // no zero divisors, also for integers
  cg::tensor<T> r = op(a, b);
  for (i64 i = 0; i < 9; ++i)
    for (i64 j = 0; j < 7; ++j) {
      const double want = ref(to_d(a.at({i, j})), to_d(b.at({j})));
      if constexpr (std::is_integral_v<T>)
        CHECK(r.at({i, j}) == cg::detail::cast<T>(want));
      else
        CHECK(close(to_d(r.at({i, j})), want, tol<T>()));
    }
}

}  // namespace

TEST_CASE_TEMPLATE("expr.unary.matches_std", T, float, double, cg::bf16, cg::f16) {
  check_unary<T>("neg", [](auto x) { return -x; }, [](double x) { return -x; }, -3, 3);
  check_unary<T>("neg()", [](auto x) { return cg::neg(x); }, [](double x) { return -x; }, -3, 3);
  check_unary<T>("abs", [](auto x) { return cg::abs(x); }, [](double x) { return std::abs(x); }, -3, 3);
  check_unary<T>("relu", [](auto x) { return cg::relu(x); }, [](double x) { return x < 0 ? 0 : x; }, -3, 3);
  check_unary<T>("gelu", [](auto x) { return cg::gelu(x); },
                 [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -4, 4);
  check_unary<T>("silu", [](auto x) { return cg::silu(x); }, [](double x) { return x / (1 + std::exp(-x)); }, -6, 6);
  check_unary<T>("sigmoid", [](auto x) { return cg::sigmoid(x); },
                 [](double x) { return 1 / (1 + std::exp(-x)); }, -6, 6);
  check_unary<T>("sin", [](auto x) { return cg::sin(x); }, [](double x) { return std::sin(x); }, -6, 6);
  check_unary<T>("cos", [](auto x) { return cg::cos(x); }, [](double x) { return std::cos(x); }, -6, 6);
  check_unary<T>("exp", [](auto x) { return cg::exp(x); }, [](double x) { return std::exp(x); }, -5, 5);
  check_unary<T>("log", [](auto x) { return cg::log(x); }, [](double x) { return std::log(x); }, 0.01, 50);
  check_unary<T>("tanh", [](auto x) { return cg::tanh(x); }, [](double x) { return std::tanh(x); }, -4, 4);
  check_unary<T>("sqrt", [](auto x) { return cg::sqrt(x); }, [](double x) { return std::sqrt(x); }, 0, 50);
}

TEST_CASE("expr.unary.special_values") {
  const float nan = std::nanf(""), inf = INFINITY;
  auto a = cg::tensor<float>::from({nan, -inf, inf, -0.f, 0.f}, {5});
  const auto r = cg::relu(a).to_vector();
  CHECK(std::isnan(r[0]));  // NaN propagates, as in torch.relu
  CHECK(r[1] == 0.f);
  CHECK(r[2] == inf);
  const auto ab = cg::abs(a).to_vector();
  CHECK(!std::signbit(ab[3]));  // |-0| = +0
  CHECK(cg::sigmoid(a).to_vector()[1] == 0.f);
  CHECK(std::isnan(cg::sqrt(cg::tensor<float>::from({-1.f}, {1})).to_vector()[0]));
}

TEST_CASE_TEMPLATE("expr.binary.matches_reference", T, float, double, cg::bf16, cg::f16, std::int32_t,
                   std::int64_t) {
  check_binary<T>("add", [](auto x, auto y) { return x + y; }, [](double x, double y) { return x + y; });
  check_binary<T>("sub", [](auto x, auto y) { return x - y; }, [](double x, double y) { return x - y; });
  check_binary<T>("mul", [](auto x, auto y) { return x * y; }, [](double x, double y) { return x * y; });
  if constexpr (std::is_integral_v<T>)
    check_binary<T>("div", [](auto x, auto y) { return x / y; },
                    [](double x, double y) { return std::trunc(x / y); });
  else
    check_binary<T>("div", [](auto x, auto y) { return x / y; }, [](double x, double y) { return x / y; });
  // A chain that mixes everything, in one loop.
  check_binary<T>("chain", [](auto x, auto y) { return cg::relu(x * y - 1) + cg::abs(-y) / 2; },
                  [](double x, double y) {
                    if constexpr (std::is_integral_v<T>)
                      return std::max(x * y - 1, 0.0) + std::trunc(std::abs(y) / 2);
                    else
                      return std::max(x * y - 1, 0.0) + std::abs(y) / 2;
                  });
}

TEST_CASE("expr.integers.u8_and_bool") {
  auto u = cg::tensor<std::uint8_t>::from({250, 3, 0}, {3});
  CHECK((u + 10).to_vector() == std::vector<std::uint8_t>{4, 13, 10});  // wraps like torch.uint8
  CHECK(cg::relu(u).to_vector() == std::vector<std::uint8_t>{250, 3, 0});
  CHECK(cg::abs(u).to_vector() == std::vector<std::uint8_t>{250, 3, 0});
  CHECK((u * u).to_vector() == std::vector<std::uint8_t>{36, 9, 0});
  auto b = cg::tensor<bool>::from({true, false, true}, {3});
  auto c = cg::tensor<bool>::from({true, false, false}, {3});
  CHECK((b * c).to_vector() == std::vector<bool>{true, false, false});  // logical and
  CHECK((b + c).to_vector() == std::vector<bool>{true, false, true});   // logical or
  auto i = cg::tensor<std::int64_t>::from({-5, 5}, {2});
  CHECK(cg::abs(i).to_vector() == std::vector<std::int64_t>{5, 5});
  CHECK(cg::relu(i).to_vector() == std::vector<std::int64_t>{0, 5});
  CHECK((-i).to_vector() == std::vector<std::int64_t>{5, -5});
}

TEST_CASE("expr.halves.scalar_rounding") {
  // The scalar is converted to the tensor's type first (bf16(0.1) = 0.10009765625).
  auto a = cg::full<cg::bf16>({4}, cg::bf16(1.f));
  const auto v = (a * 0.1).to_vector();
  CHECK(static_cast<float>(v[0]) == static_cast<float>(cg::bf16(0.1f)));
  auto h = cg::full<cg::f16>({3}, cg::f16(60000.f));
  CHECK(std::isinf(static_cast<float>((h + h).to_vector()[0])));  // f16 overflows to inf
}
