// ccgraph/core/dtype.hpp: the element types a tensor may hold, as a runtime tag and as a trait.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include <ccgraph/core/half.hpp>

namespace ccgraph {

/// Runtime tag of an element type; printed with PyTorch's short names (f32, bf16, ...).
enum class dtype : std::uint8_t { f32, f64, i32, i64, u8, boolean, bf16, f16 };

/// Short name used in printed graphs and error messages: "f32", "bf16", "bool", ...
constexpr std::string_view to_string(dtype d) {
  switch (d) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::u8: return "u8";
    case dtype::boolean: return "bool";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, dtype d) { return os << to_string(d); }

/// Bytes per element.
constexpr std::size_t element_size(dtype d) {
  switch (d) {
    case dtype::f64:
    case dtype::i64: return 8;
    case dtype::f32:
    case dtype::i32: return 4;
    case dtype::bf16:
    case dtype::f16: return 2;
    case dtype::u8:
    case dtype::boolean: return 1;
  }
  return 0;
}

/// True for f32, f64, bf16, f16.
constexpr bool is_floating(dtype d) {
  return d == dtype::f32 || d == dtype::f64 || d == dtype::bf16 || d == dtype::f16;
}

namespace detail {
template <class T> struct dtype_of_impl {};
template <> struct dtype_of_impl<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of_impl<double> { static constexpr dtype value = dtype::f64; };
template <> struct dtype_of_impl<std::int32_t> { static constexpr dtype value = dtype::i32; };
template <> struct dtype_of_impl<std::int64_t> { static constexpr dtype value = dtype::i64; };
template <> struct dtype_of_impl<std::uint8_t> { static constexpr dtype value = dtype::u8; };
template <> struct dtype_of_impl<bool> { static constexpr dtype value = dtype::boolean; };
template <> struct dtype_of_impl<bf16> { static constexpr dtype value = dtype::bf16; };
template <> struct dtype_of_impl<f16> { static constexpr dtype value = dtype::f16; };
}  // namespace detail

/// True for the element types a tensor may hold.
template <class T>
inline constexpr bool is_element_v = requires { detail::dtype_of_impl<T>::value; };

/// A type that a `tensor<T>` may hold: float, double, int32, int64, uint8, bool, bf16, f16.
template <class T>
concept element = is_element_v<T>;

/// The runtime tag of element type T.
template <element T>
inline constexpr dtype dtype_v = detail::dtype_of_impl<T>::value;

/// True for integer element types and bool: the types bitwise reductions accept.
template <class T>
inline constexpr bool is_integral_element_v =
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool>;

/// The type arithmetic on T is carried out in: float for the 16-bit floats, T otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

/// Calls `f(T{})` with the element type whose tag is `d`: the one switch from runtime tag to type.
template <class F>
decltype(auto) visit_dtype(dtype d, F&& f) {
  switch (d) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::i32: return f(std::int32_t{});
    case dtype::i64: return f(std::int64_t{});
    case dtype::u8: return f(std::uint8_t{});
    case dtype::boolean: return f(bool{});
    case dtype::bf16: return f(bf16{});
    case dtype::f16: return f(f16{});
  }
  return f(float{});
}

}  // namespace ccgraph
