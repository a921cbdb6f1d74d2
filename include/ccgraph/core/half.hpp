// ccgraph/core/half.hpp: host-side bf16 and f16 with exact widening and round-to-nearest-even
// narrowing, so CPU results match what the hardware types give bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>

#include <ccgraph/core/config.hpp>

namespace ccgraph {

/// bfloat16: the top 16 bits of an IEEE float. Converting to float is exact; converting from
/// float rounds to nearest even and keeps NaN a (quiet) NaN.
struct bf16 {
  std::uint16_t bits = 0;

  constexpr bf16() = default;
  /// Rounds `f` to the nearest bf16 (ties to even).
  CCGRAPH_HOST_DEVICE bf16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a builtin
  CCGRAPH_HOST_DEVICE bf16(double d) : bf16(static_cast<float>(d)) {}
  CCGRAPH_HOST_DEVICE bf16(int i) : bf16(static_cast<float>(i)) {}
  CCGRAPH_HOST_DEVICE bf16(long i) : bf16(static_cast<float>(i)) {}
  CCGRAPH_HOST_DEVICE bf16(long long i) : bf16(static_cast<float>(i)) {}
  /// Widens exactly.
  CCGRAPH_HOST_DEVICE operator float() const { return to_float(bits); }

  /// Builds a value from its bit pattern.
  static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }

  CCGRAPH_HOST_DEVICE static float to_float(std::uint16_t b) {
    std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  CCGRAPH_HOST_DEVICE static std::uint16_t from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    return static_cast<std::uint16_t>(u >> 16);
  }
};

/// IEEE binary16. Widening is exact (subnormals included); narrowing rounds to nearest even,
/// overflows to infinity and keeps NaN a NaN.
struct f16 {
  std::uint16_t bits = 0;

  constexpr f16() = default;
  /// Rounds `f` to the nearest f16 (ties to even).
  CCGRAPH_HOST_DEVICE f16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a builtin
  CCGRAPH_HOST_DEVICE f16(double d) : f16(static_cast<float>(d)) {}
  CCGRAPH_HOST_DEVICE f16(int i) : f16(static_cast<float>(i)) {}
  CCGRAPH_HOST_DEVICE f16(long i) : f16(static_cast<float>(i)) {}
  CCGRAPH_HOST_DEVICE f16(long long i) : f16(static_cast<float>(i)) {}
  /// Widens exactly.
  CCGRAPH_HOST_DEVICE operator float() const { return to_float(bits); }

  /// Builds a value from its bit pattern.
  static constexpr f16 from_bits(std::uint16_t b) {
    f16 r;
    r.bits = b;
    return r;
  }

  CCGRAPH_HOST_DEVICE static float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t man = h & 0x3ffu;
    std::uint32_t u;
    if (exp == 0x1f) {
      u = sign | 0x7f800000u | (man << 13);  // inf / NaN
    } else if (exp != 0) {
      u = sign | ((exp + 112u) << 23) | (man << 13);  // normal: rebias 15 -> 127
    } else if (man == 0) {
      u = sign;  // signed zero
    } else {
      // Subnormal: normalise the mantissa.
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

  CCGRAPH_HOST_DEVICE static std::uint16_t from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
    if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
    if (a >= 0x38800000u) {
      // Normal range: drop 13 mantissa bits with round to nearest even.
      std::uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
      r += 0xfffu + ((r >> 13) & 1u);
      return static_cast<std::uint16_t>(sign | (r >> 13));
    }
    if (a < 0x33000000u) return sign;  // below half the smallest subnormal: zero
    // Subnormal result: shift the full mantissa into place with round to nearest even.
    const std::uint32_t exp = a >> 23;
    const std::uint32_t man = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;  // 14..24
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t rem = man & ((1u << shift) - 1u);
    std::uint32_t q = man >> shift;
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
};

// Arithmetic goes through float, as on hardware without native half math.
#define CCGRAPH_HALF_OPS(T)                                                                   \
  CCGRAPH_HOST_DEVICE inline T operator+(T a, T b) { return T(float(a) + float(b)); }        \
  CCGRAPH_HOST_DEVICE inline T operator-(T a, T b) { return T(float(a) - float(b)); }        \
  CCGRAPH_HOST_DEVICE inline T operator*(T a, T b) { return T(float(a) * float(b)); }        \
  CCGRAPH_HOST_DEVICE inline T operator/(T a, T b) { return T(float(a) / float(b)); }        \
  CCGRAPH_HOST_DEVICE inline T operator-(T a) { return T(-float(a)); }                       \
  CCGRAPH_HOST_DEVICE inline T& operator+=(T& a, T b) { return a = a + b; }                  \
  CCGRAPH_HOST_DEVICE inline T& operator-=(T& a, T b) { return a = a - b; }                  \
  CCGRAPH_HOST_DEVICE inline T& operator*=(T& a, T b) { return a = a * b; }                  \
  CCGRAPH_HOST_DEVICE inline T& operator/=(T& a, T b) { return a = a / b; }                  \
  CCGRAPH_HOST_DEVICE inline bool operator==(T a, T b) { return float(a) == float(b); }      \
  CCGRAPH_HOST_DEVICE inline bool operator<(T a, T b) { return float(a) < float(b); }        \
  CCGRAPH_HOST_DEVICE inline bool operator>(T a, T b) { return float(a) > float(b); }        \
  CCGRAPH_HOST_DEVICE inline bool operator<=(T a, T b) { return float(a) <= float(b); }      \
  CCGRAPH_HOST_DEVICE inline bool operator>=(T a, T b) { return float(a) >= float(b); }      \
  inline std::ostream& operator<<(std::ostream& os, T v) { return os << float(v); }

CCGRAPH_HALF_OPS(bf16)
CCGRAPH_HALF_OPS(f16)
#undef CCGRAPH_HALF_OPS

}  // namespace ccgraph
