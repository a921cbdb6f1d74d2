// expect: tensor<T>\(expression\): mixing dtypes
// A comparison is a bool expression: assigning it to a float tensor is a compile error, not a
// conversion (write (a < b).to<float>()).
#include <ccgraph/ops/pointwise.hpp>

void bool_expression_to_float() {
  ccgraph::tensor<float> a, b;
  ccgraph::tensor<float> m = a < b;
  (void)m;
}
