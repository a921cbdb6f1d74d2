// expect: op_traits: an op lacks .device .its device_path
// A compute op that does not say how it runs on a device tensor (device_path) fails to compile:
// no device tensor falls through to a CPU loop.
#include <string_view>
#include <variant>
#include <vector>

#include <ccgraph/ir/node_op.hpp>

namespace my {
/// x * by: a compute op a user might add.
struct scale {
  static constexpr std::string_view name = "scale";
  double by = 1;
};
}  // namespace my

template <>
struct ccgraph::op_traits<my::scale> {
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const my::scale&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    return in;
  }
  static std::vector<any_tensor> run(const my::scale&, const run_args& a) { return a.in; }
  static op_cost cost(const my::scale&, const cost_args& a) { return op_cost::compute(0, 0, peak_class::vector); }
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

// The closed set's completeness check, as ir/node_op.hpp runs it on node_op, over a set that
// includes the new op.
static_assert(ccgraph::detail::check_ops(static_cast<const std::variant<ccgraph::ops::matmul, my::scale>*>(nullptr)));
