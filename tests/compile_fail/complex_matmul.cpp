// expect: matmul: complex tensors \(c64, c128\) are not supported
// matmul of complex tensors fails at compile time, naming the call: compute kernels are
// instantiated for the real dtypes only.
#include <complex>

#include <ccgraph/ops/matmul.hpp>

void complex_matmul() {
  using c64 = std::complex<float>;
  auto c = ccgraph::matmul(ccgraph::tensor<c64>{}, ccgraph::tensor<c64>{});
  (void)c;
}
