// expect: ccgraph::randn: needs a floating-point element type
// Normal values of an integer type make no sense: refused at compile time.
#include <cstdint>

#include <ccgraph/tensor/random.hpp>

void randn_integer() {
  auto t = ccgraph::randn<std::int32_t>({4});
  (void)t;
}
