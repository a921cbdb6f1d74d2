// ccgraph/tensor/print.hpp: printing tensors the way PyTorch users read them.
#pragma once

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>

#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {
namespace detail {

template <class T>
std::string format_element(T v) {
  std::ostringstream os;
  if constexpr (is_complex_v<T>) {  // as PyTorch: 1.+2.j, 0.5-1.j
    const std::string im = format_element(v.imag());
    os << format_element(v.real()) << (im.front() == '-' ? "" : "+") << im << 'j';
  } else if constexpr (std::is_same_v<T, bool>) {
    os << (v ? "True" : "False");
  } else if constexpr (std::is_same_v<T, std::uint8_t>) {
    os << static_cast<int>(v);
  } else if constexpr (std::is_integral_v<T>) {
    os << v;
  } else {
    const double d = static_cast<double>(static_cast<compute_t<T>>(v));
    os.precision(4);
    // Range check first: casting inf, NaN or a huge value to int64 is undefined behaviour.
    if (std::abs(d) < 1e15 && d == static_cast<double>(static_cast<std::int64_t>(d)))
      os << static_cast<std::int64_t>(d) << '.';
    else
      os << d;
  }
  return os.str();
}

template <class T>
void print_dim(std::ostream& os, const T* p, const shape_t& shape, const strides_t& strides,
               std::size_t d, std::int64_t off, int indent) {
  constexpr std::int64_t edge = 3;  // elements shown at each end of a long dimension
  const std::int64_t n = shape[d];
  const bool elide = n > 2 * edge && numel_of(shape) > 1000;
  os << '[';
  for (std::int64_t i = 0; i < n; ++i) {
    if (elide && i == edge) {
      os << (d + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - edge;
    }
    if (d + 1 == shape.size())
      os << format_element(p[off + i * strides[d]]);
    else
      print_dim(os, p, shape, strides, d + 1, off + i * strides[d], indent + 1);
    if (i + 1 < n) os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace detail

/// Prints `tensor([[1., 2.], [3., 4.]], dtype=f32)`-style text; waits if the tensor is pending.
/// Long tensors (over 1000 elements) show three entries at each end of each dimension.
template <element T>
std::ostream& operator<<(std::ostream& os, const tensor<T>& t) {
  if (!t.device().is_cpu()) {  // print the host copy, naming the device
    const tensor<T> h = t.cpu();
    std::ostringstream s;
    s << h;
    std::string text = s.str();
    text.insert(text.size() - 1, ", device=" + t.device().str());
    return os << text;
  }
  const T* p = t.data();
  os << "tensor(";
  if (t.dim() == 0)
    os << detail::format_element(*p);
  else
    detail::print_dim(os, p, t.shape(), t.strides(), 0, 0, 7);
  return os << ", dtype=" << t.dtype() << ')';
}

}  // namespace ccgraph
