// Example 02: an expression's structure is known at compile time.
//
//   e = relu(a) * b + 2 * silu(c)
//
// Pointwise math builds a lazy expression whose *type* is the tree of ops. This program first
// reads that tree with static_asserts (nothing runs yet: if a fact were wrong, it would not
// compile), then evaluates the same expression eagerly (one loop, no temporaries), and finally
// traces a function that uses it together with an all_reduce: the whole chain becomes one
// pointwise node named after its ops, and the compiled graph gives the same bits as eager code
// on every rank of a 2-rank world.
#include <ccgraph/ccgraph.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cg = ccgraph;

// ---- 1. Facts about the expression's type, checked by the compiler -------------------------

using tensor = cg::tensor<float>;
using expr = decltype(cg::relu(std::declval<tensor>()) * std::declval<tensor>() +
                      2.f * cg::silu(std::declval<tensor>()));

static_assert(cg::is_expression_v<expr>, "a lazy expression, not a tensor");
static_assert(std::is_same_v<expr::value_type, float>, "its element type");
static_assert(std::is_same_v<expr::op_type, cg::ops::add>, "the root op: +");
static_assert(cg::op_count_v<expr> == 5, "relu, *, silu, * (by the scalar), +");
static_assert(cg::count_ops_v<expr, cg::ops::mul> == 2, "two multiplications");
static_assert(cg::count_ops_v<expr, cg::ops::relu> == 1 && cg::count_ops_v<expr, cg::ops::silu> == 1);
static_assert(cg::count_ops_v<expr, cg::ops::gelu> == 0, "no gelu");
static_assert(cg::leaf_count_v<expr> == 3, "three tensor operands");
static_assert(cg::scalar_count_v<expr> == 1, "one scalar operand");
static_assert(cg::expression_depth_v<expr> == 3, "+ over * over relu/silu");
static_assert(cg::all_op_names_v<expr>.size() == 5 && cg::all_op_names_v<expr>[3] == "mul",
              "every op in evaluation order: relu, mul, silu, mul, add");
static_assert(cg::op_names_v<expr>.size() == 4, "distinct ops: relu, mul, silu, add");
static_assert(cg::fused_name_v<expr> == "fused_relu_mul_silu_add", "its name as one graph node");
static_assert(!cg::is_traced_v<expr>, "over tensors: computed, not recorded");

// The same expression over traced values has the same structure, and is recorded instead.
using traced_expr = decltype(cg::relu(std::declval<cg::symbolic<float>>()) * std::declval<cg::symbolic<float>>() +
                             2.f * cg::silu(std::declval<cg::symbolic<float>>()));
static_assert(cg::is_traced_v<traced_expr>);
static_assert(cg::fused_name_v<traced_expr> == cg::fused_name_v<expr>);
static_assert(cg::op_count_v<traced_expr> == cg::op_count_v<expr>);

// Dtypes are checked at compile time too: a float tensor and an int32 tensor do not mix (the
// operator's static_assert says "mixing dtypes"; see tests/compile_fail/), a scalar mixes with
// anything.
static_assert(!cg::is_same_dtype_v<tensor, cg::tensor<std::int32_t>>);
static_assert(cg::is_same_dtype_v<expr, tensor> && cg::is_same_dtype_v<expr, int>);

// ---- 2. The program: written once, run eagerly and traced ----------------------------------

template <class A, class B, class C>
auto program(const A& a, const B& b, const C& c) {
  auto e = cg::relu(a) * b + 2.f * cg::silu(c);  // lazy: the type above
  auto s = cg::all_reduce(e, "sum", "0");        // e becomes one loop / one node here
  return cg::eval(s * 0.5f - e);                 // e is read again: computed once when traced
}

bool same_bits(const tensor& x, const tensor& y) {
  const auto u = x.to_vector(), v = y.to_vector();
  return x.shape() == y.shape() && std::memcmp(u.data(), v.data(), u.size() * sizeof(float)) == 0;
}

int main() {
  std::cout << "expression type facts (checked at compile time):\n"
            << "  ops: " << cg::op_count_v<expr> << " (" << cg::count_ops_v<expr, cg::ops::mul> << " mul)"
            << ", tensor leaves: " << cg::leaf_count_v<expr> << ", scalars: " << cg::scalar_count_v<expr>
            << ", depth: " << cg::expression_depth_v<expr> << ", dtype: " << cg::dtype_v<expr::value_type>
            << "\n  as one node: " << cg::fused_name_v<expr> << "\n\n";

  int failures = 0;

  // Eagerly: one loop over the output, checked against the formula element by element.
  {
    auto a = cg::tensor<float>::from({-1, 0, 1, 2}, {2, 2});
    auto b = cg::full<float>({2, 2}, 3.f);
    auto c = cg::tensor<float>::from({0, 1, -1, 2}, {2, 2});
    tensor e = cg::relu(a) * b + 2.f * cg::silu(c);
    std::cout << "eager relu(a) * b + 2 * silu(c) = " << e << '\n';
    const auto av = a.to_vector(), cv = c.to_vector(), ev = e.to_vector();
    for (std::size_t i = 0; i < ev.size(); ++i) {
      const float expected = std::max(av[i], 0.f) * 3.f + 2.f * (cv[i] / (1.f + std::exp(-cv[i])));
      if (std::abs(ev[i] - expected) > 1e-5f) {
        std::cout << "  MISMATCH at " << i << ": " << ev[i] << " vs " << expected << '\n';
        ++failures;
      }
    }
  }

  // Traced on each rank of a 2-rank world, compiled, and compared with eager bit for bit.
  std::vector<std::string> report(2);
  std::vector<int> bad(2, 0);
  cg::run_threads(2, [&](cg::rank_context& ctx) {
    const int r = ctx.rank();
    auto a = cg::uniform<float>({4, 4}, -1, 1, 10 + static_cast<std::uint64_t>(r));
    auto b = cg::uniform<float>({4, 4}, -1, 1, 20 + static_cast<std::uint64_t>(r));
    auto c = cg::uniform<float>({4, 4}, -1, 1, 30 + static_cast<std::uint64_t>(r));
    auto g = cg::trace([](auto x, auto y, auto z) { return program(x, y, z); }, a, b, c);
    std::ostringstream os;
    if (r == 0) os << "traced graph (rank 0):\n" << g << '\n';
    const auto seq = cg::op_sequence(g);
    const std::vector<std::string> expected_seq{std::string(cg::fused_name_v<expr>), "all_reduce", "wait_tensor",
                                                "fused_mul_sub"};
    if (seq != expected_seq) {
      os << "  rank " << r << ": unexpected op sequence\n";
      ++bad[static_cast<std::size_t>(r)];
    }
    if (g.count("pointwise") != 2) {
      os << "  rank " << r << ": e was not computed once\n";
      ++bad[static_cast<std::size_t>(r)];
    }
    auto compiled = cg::compile(g, ctx);
    const tensor eager = program(a, b, c);
    for (int call = 0; call < 2; ++call) {
      const tensor traced = compiled(a, b, c);
      const bool ok = same_bits(traced, eager);
      bad[static_cast<std::size_t>(r)] += ok ? 0 : 1;
      os << "  rank " << r << " call " << call << ": compiled == eager bit for bit: " << (ok ? "yes" : "NO") << '\n';
    }
    report[static_cast<std::size_t>(r)] = os.str();
  });
  for (int r = 0; r < 2; ++r) {
    std::cout << report[static_cast<std::size_t>(r)];
    failures += bad[static_cast<std::size_t>(r)];
  }
  std::cout << (failures ? "FAILED" : "all checks passed") << '\n';
  return failures == 0 ? 0 : 1;
}
