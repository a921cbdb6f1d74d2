// expect: matmul: mixing dtypes
// matmul of two element types fails at compile time, naming the call.
#include <ccgraph/ops/matmul.hpp>

void mixed_dtype_matmul() {
  auto c = ccgraph::matmul(ccgraph::tensor<float>{}, ccgraph::tensor<double>{});
  (void)c;
}
