// expect: mixing dtypes
// Assigning a float expression to a tensor<double> fails at compile time instead of converting.
#include <ccgraph/ops/pointwise.hpp>

void mixed_dtype_assign() {
  ccgraph::tensor<float> a;
  ccgraph::tensor<double> x = a + 1.0;
  (void)x;
}
