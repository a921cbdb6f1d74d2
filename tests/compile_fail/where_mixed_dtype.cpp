// expect: ccgraph::where: mixing dtypes
// where's two value operands must have one element type.
#include <ccgraph/ops/pointwise.hpp>

void where_mixed_dtype() {
  ccgraph::tensor<float> a;
  ccgraph::tensor<double> b;
  auto e = ccgraph::where(a > 0.f, a, b);
  (void)e;
}
