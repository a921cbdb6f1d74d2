// ccgraph/core/tensor_meta.hpp: what shape/dtype inference works on: a tensor without its data.
#pragma once

#include <ostream>
#include <string>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/shape.hpp>

namespace ccgraph {

/// Element type and shape of a value: what ops infer and validate, eagerly and in graphs.
struct tensor_meta {
  ccgraph::dtype dtype = ccgraph::dtype::f32;
  shape_t shape;

  friend bool operator==(const tensor_meta&, const tensor_meta&) = default;
  /// "f32[4, 4]", the form printed graphs and error messages use.
  std::string str() const {
    std::string s(to_string(dtype));
    s += '[';
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + ']';
  }
};

inline std::ostream& operator<<(std::ostream& os, const tensor_meta& m) { return os << m.str(); }

}  // namespace ccgraph
