// expect: ccgraph::gelu: needs a floating-point tensor
// Transcendental ops on integer tensors fail at compile time instead of truncating the result.
#include <ccgraph/ops/pointwise.hpp>

void float_op_on_integer() {
  auto e = ccgraph::gelu(ccgraph::tensor<int>{});
  (void)e;
}
