// ccgraph/cuda/install_ops.hpp: installs the CUDA run of every op whose device path is
// cuda_impl (ops/op_traits.hpp) into the slot host code calls for device tensors, and fails to
// compile, naming the behaviour, when such an op has no cuda_impl. <ccgraph/cuda.hpp> includes it
// after every op's .cuh, in translation units compiled by nvcc; it holds no CUDA code itself.
//
// Installing compiles every op's kernels (a cuda_impl's run is a member template, instantiated
// only here), which costs minutes of CPU per translation unit. A program with several nvcc
// translation units defines CCGRAPH_CUDA_NO_OP_KERNELS in all but one of them: those skip the
// kernels and reach them through the slots the one installing unit fills.
#pragma once

#include <variant>

#include <ccgraph/autograd/grad.hpp>
#include <ccgraph/ir/node_op.hpp>

namespace ccgraph::cuda::detail {

/// Checks that op O, when its device path is cuda_impl, has a cuda_impl (a static_assert naming
/// the op and the behaviour otherwise).
template <class O>
constexpr bool check_device_run() {
  if constexpr (::ccgraph::detail::op_has_device_path<O>) {
    if constexpr (op_traits<O>::device == device_path::cuda_impl) ::ccgraph::detail::require_cuda_impl<O>();
  }
  return true;
}

/// Checks every op of a closed set.
template <class... Os>
constexpr bool check_device_runs(const std::variant<Os...>*) {
  return (check_device_run<Os>() && ...);
}

/// Installs op O's CUDA run when its device path is cuda_impl (checked first).
template <class O>
bool install_device_run() {
  check_device_run<O>();
  if constexpr (::ccgraph::detail::op_has_device_path<O>) {
    if constexpr (op_traits<O>::device == device_path::cuda_impl) {
      if constexpr (::ccgraph::detail::op_has_cuda_impl<O>)
        ::ccgraph::detail::device_run_slot<O> = &::ccgraph::cuda_impl<O>::template run<run_args>;
    }
  }
  return true;
}

/// Installs the CUDA runs of every op of a closed set.
template <class... Os>
bool install_device_runs(const std::variant<Os...>*) {
  return (install_device_run<Os>() && ...);
}

// Only under nvcc, after every op's .cuh (as <ccgraph/cuda.hpp> includes it): a host compiler
// sees no cuda_impl, so the closed set is checked and installed only there.
#if defined(__CUDACC__)
static_assert(check_device_runs(static_cast<const node_op*>(nullptr)));
#ifndef CCGRAPH_CUDA_NO_OP_KERNELS
/// Done at static initialisation of every translation unit that includes <ccgraph/cuda.hpp>
/// under nvcc without CCGRAPH_CUDA_NO_OP_KERNELS (each writes the same pointers), so a device
/// tensor reaching an op's run finds it.
inline const bool device_runs_installed = install_device_runs(static_cast<const node_op*>(nullptr));
#if defined(CCGRAPH_CUDA_GRADIENT_KERNELS)
/// The gradient rules of every op, for each type gradients are taken in (autograd/grad.hpp's
/// visit_grad_dtype), compiled here once (with their pointwise kernels) and installed for the
/// units that skip them (CCGRAPH_CUDA_NO_OP_KERNELS). Opt-in: a one-unit program that never
/// differentiates would otherwise pay minutes of nvcc for them.
inline const bool gradient_rules_installed = [] {
  ::ccgraph::detail::gradient_rule_slot<float> = &::ccgraph::detail::run_gradient_rule_here<float>;
  ::ccgraph::detail::gradient_rule_slot<double> = &::ccgraph::detail::run_gradient_rule_here<double>;
  ::ccgraph::detail::gradient_rule_slot<bf16> = &::ccgraph::detail::run_gradient_rule_here<bf16>;
  return true;
}();
#endif
#endif
#endif

}  // namespace ccgraph::cuda::detail
