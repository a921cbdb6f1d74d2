// ccgraph/core/dtype.hpp: the element types a tensor may hold, as a runtime tag and as a trait.
#pragma once

#include <complex>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/half.hpp>

namespace ccgraph {

/// Runtime tag of an element type; printed with PyTorch's short names (f32, bf16, c64, ...).
/// c64 and c128 are complex (std::complex<float>, std::complex<double>): collectives, copies,
/// views, creation and printing take them; compute ops do not (see is_complex).
enum class dtype : std::uint8_t { f32, f64, i32, i64, u8, boolean, bf16, f16, c64, c128 };

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
    case dtype::c64: return "c64";
    case dtype::c128: return "c128";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, dtype d) { return os << to_string(d); }

/// Bytes per element.
constexpr std::size_t element_size(dtype d) {
  switch (d) {
    case dtype::c128: return 16;
    case dtype::c64:
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

/// True for f32, f64, bf16, f16 (not for complex, as torch.is_floating_point).
constexpr bool is_floating(dtype d) {
  return d == dtype::f32 || d == dtype::f64 || d == dtype::bf16 || d == dtype::f16;
}

/// True for the complex dtypes c64 and c128. Collectives move them as pairs of reals (c10d's
/// view_as_real: NCCL float/double with twice the count) and reduce them with sum, avg and
/// premul_sum only.
constexpr bool is_complex(dtype d) { return d == dtype::c64 || d == dtype::c128; }

/// The real dtype of a complex one's parts (c64 -> f32, c128 -> f64); other dtypes themselves.
constexpr dtype real_dtype(dtype d) { return d == dtype::c64 ? dtype::f32 : d == dtype::c128 ? dtype::f64 : d; }

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
template <> struct dtype_of_impl<std::complex<float>> { static constexpr dtype value = dtype::c64; };
template <> struct dtype_of_impl<std::complex<double>> { static constexpr dtype value = dtype::c128; };
}  // namespace detail

/// True for the element types a tensor may hold.
template <class T>
inline constexpr bool is_element_v = requires { detail::dtype_of_impl<T>::value; };

/// A type that a `tensor<T>` may hold: float, double, int32, int64, uint8, bool, bf16, f16,
/// std::complex<float>, std::complex<double>.
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

/// True for std::complex<float> and std::complex<double>.
template <class T>
inline constexpr bool is_complex_v = std::is_same_v<T, std::complex<float>> || std::is_same_v<T, std::complex<double>>;

/// An element type that compute ops take: every element type but the complex ones.
template <class T>
concept real_element = element<T> && !is_complex_v<T>;

/// The type arithmetic on T is carried out in: float for the 16-bit floats, T otherwise.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

namespace detail {
/// The error of a compute kernel reached with a complex dtype (op_traits<O>::infer refuses
/// them first, naming the op; this is the last guard).
[[noreturn]] inline void throw_complex_dtype(dtype d) {
  CCGRAPH_THROW(error, to_string(d), " tensors are not supported by this op: compute ops take real dtypes; "
                "collectives, copies and views take complex ones");
}
}  // namespace detail

/// Calls `f(T{})` with the element type whose tag is `d`, for the element types compute ops
/// take (every dtype but c64/c128: a complex `d` is an error). Kernels visit with this one, so
/// they are never instantiated for complex; storage-level code (allocation, copies, views,
/// collectives) uses visit_any_dtype.
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
    case dtype::c64:
    case dtype::c128: detail::throw_complex_dtype(d);
  }
  return f(float{});
}

/// Calls `f(T{})` with the element type whose tag is `d`, complex ones included: for code that
/// only stores or moves elements (allocation, copies, views, collectives, printing).
template <class F>
decltype(auto) visit_any_dtype(dtype d, F&& f) {
  if (d == dtype::c64) return f(std::complex<float>{});
  if (d == dtype::c128) return f(std::complex<double>{});
  return visit_dtype(d, std::forward<F>(f));
}

}  // namespace ccgraph
