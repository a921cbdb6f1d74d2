// expect: ccgraph::lt: a floating-point scalar with an integer tensor
// An integer tensor compared with 0.5 would compare with 0 after converting the scalar;
// PyTorch compares in floating point. Refused at compile time rather than a silent wrong result.
#include <cstdint>

#include <ccgraph/ops/pointwise.hpp>

void float_scalar_integer_compare() {
  auto e = ccgraph::lt(ccgraph::tensor<std::int32_t>{}, 0.5);
  (void)e;
}
