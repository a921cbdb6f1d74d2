// expect: ccgraph::clamp: at least one of min and max must be given
// clamp(x, nullopt, nullopt) is PyTorch's runtime error; here the missing bounds are known at
// compile time, so it fails there.
#include <optional>

#include <ccgraph/ops/pointwise.hpp>

void clamp_without_bounds() {
  ccgraph::clamp(ccgraph::tensor<float>{}, std::nullopt, std::nullopt);
}
