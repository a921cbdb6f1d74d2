// expect: ccgraph::rsqrt: needs a floating-point tensor
// rsqrt (like erf and tanh) of an integer tensor would truncate its result: refused.
#include <cstdint>

#include <ccgraph/ops/pointwise.hpp>

void rsqrt_on_integer() {
  auto e = ccgraph::rsqrt(ccgraph::tensor<std::int64_t>{});
  (void)e;
}
