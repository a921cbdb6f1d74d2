// ccgraph/tensor/any_tensor.hpp: a tensor of any element type, for the code that handles values
// whose type is only known at run time (graph executors, backends).
#pragma once

#include <ccgraph/core/config.hpp>
#include <cstdint>
#include <type_traits>
#include <variant>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

/// One tensor<T> of any element type, complex ones included (code that computes on an
/// any_tensor dispatches with visit_dtype, which refuses them).
using any_tensor = std::variant<tensor<float>, tensor<double>, tensor<std::int32_t>,
                                tensor<std::int64_t>, tensor<std::uint8_t>, tensor<bool>,
                                tensor<bf16>, tensor<f16>, tensor<std::complex<float>>,
                                tensor<std::complex<double>>>;

/// Element type and shape of `t`.
CCGRAPH_DECL tensor_meta meta_of(const any_tensor& t);

/// The tensor<T> inside `t`; a different element type is an error naming both.
template <element T>
const tensor<T>& get_tensor(const any_tensor& t, const char* what) {
  const auto* p = std::get_if<tensor<T>>(&t);
  CCGRAPH_CHECK(p != nullptr, what, ": expected a ", dtype_v<T>, " tensor, got ", meta_of(t).str());
  return *p;
}

/// A new uninitialised tensor of the given meta.
CCGRAPH_DECL any_tensor empty_like_meta(const tensor_meta& m);

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/tensor/impl/any_tensor.ipp>
#endif
