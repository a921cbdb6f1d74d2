// expect: ccgraph::dropout: needs a floating-point tensor
// dropout scales kept values by 1 / (1 - p): integer tensors are refused, as in PyTorch.
#include <cstdint>

#include <ccgraph/ops/pointwise.hpp>

void dropout_integer() {
  auto e = ccgraph::dropout(ccgraph::tensor<std::int32_t>{}, 0.1);
  (void)e;
}
