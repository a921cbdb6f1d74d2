// expect: op_traits: an op lacks .op_traits<O> .no specialisation
// An op with no op_traits specialisation at all fails to compile, naming what is missing.
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

// The closed set's completeness check, as ir/node_op.hpp runs it on node_op, over a set that
// includes the new op.
static_assert(ccgraph::detail::check_ops(static_cast<const std::variant<ccgraph::ops::matmul, my::scale>*>(nullptr)));
