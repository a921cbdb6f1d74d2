// expect: mixing dtypes
// Adding tensors of different element types must fail at compile time with a static_assert
// that names the call, not with pages of template errors (or, worse, a silent conversion).
#include <ccgraph/ccgraph.hpp>

void mixed_dtype_add() {
  auto e = ccgraph::tensor<float>{} + ccgraph::tensor<double>{};
  (void)e;
}
