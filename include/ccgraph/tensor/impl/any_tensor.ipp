// ccgraph/tensor/impl/any_tensor.ipp: the non-template functions of
// <ccgraph/tensor/any_tensor.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/tensor/any_tensor.hpp>

namespace ccgraph {

CCGRAPH_DECL tensor_meta meta_of(const any_tensor& t) {
  return ::ccgraph::detail::visit([](const auto& x) { return tensor_meta{x.dtype(), x.shape()}; }, t);
}

CCGRAPH_DECL any_tensor empty_like_meta(const tensor_meta& m) {
  return visit_any_dtype(m.dtype, [&](auto tag) -> any_tensor {
    return tensor<decltype(tag)>::empty(m.shape);
  });
}

}  // namespace ccgraph
