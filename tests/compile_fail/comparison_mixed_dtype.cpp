// expect: operator<: mixing dtypes
// Comparing tensors of two element types fails at compile time, naming the operator, instead of
// converting one of them silently.
#include <ccgraph/ops/pointwise.hpp>

void comparison_mixed_dtype() {
  auto e = ccgraph::tensor<float>{} < ccgraph::tensor<int>{};
  (void)e;
}
