// expect: operator[*]: mixing dtypes
// An expression of one element type times a tensor of another must fail at compile time with
// a static_assert that names the operator.
#include <ccgraph/ops/pointwise.hpp>

void mixed_dtype_expression() {
  auto e = ccgraph::relu(ccgraph::tensor<float>{}) * ccgraph::tensor<ccgraph::bf16>{};
  (void)e;
}
