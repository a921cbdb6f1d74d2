// expect: ccgraph::where: the condition must be a bool tensor or expression
// where's condition is a bool tensor or a comparison, not a float tensor read as "not zero".
#include <ccgraph/ops/pointwise.hpp>

void where_non_bool_condition() {
  ccgraph::tensor<float> c, a, b;
  auto e = ccgraph::where(c, a, b);
  (void)e;
}
