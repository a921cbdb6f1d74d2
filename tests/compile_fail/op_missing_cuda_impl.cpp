// expect: op_traits: an op lacks .cuda_impl<O>::run
// A compute op whose device path is cuda_impl but that defines no cuda_impl<O> fails to compile
// where <ccgraph/cuda.hpp> installs the CUDA runs: a device tensor never reaches a missing kernel.
#include <string_view>
#include <variant>
#include <vector>

#include <ccgraph/cuda/install_ops.hpp>

namespace my {
/// x * by: a compute op a user might add, with a CUDA kernel promised but not written.
struct scale {
  static constexpr std::string_view name = "scale";
  double by = 1;
};
}  // namespace my

template <>
struct ccgraph::op_traits<my::scale> {
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::cuda_impl;
  static std::vector<tensor_meta> infer(const my::scale&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    return in;
  }
  static std::vector<any_tensor> run(const my::scale&, const run_args& a) { return a.in; }
  static op_cost cost(const my::scale&, const cost_args&) { return op_cost::compute(0, 0, peak_class::vector); }
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

static const bool installed =
    ccgraph::cuda::detail::install_device_runs(static_cast<const std::variant<ccgraph::ops::matmul, my::scale>*>(nullptr));
