// ccgraph/tensor/philox.hpp: the counter-based generator behind every random number ccgraph
// draws (Philox4x32-10, Salmon et al., SC'11 "Parallel random numbers: as easy as 1, 2, 3"),
// the distributions built on it, and the kernel-tree leaf that draws them. Everything here is
// host/device code compiled from this one source by g++ and by nvcc, so the CPU and the GPU
// draw the same bits for the same (seed, stream, offset).
//
// The counter layout (the contract that makes draws reproducible across devices):
//   key      = (seed & 0xffffffff, seed >> 32)
//   counter  = (c & 0xffffffff, c >> 32, stream & 0xffffffff, stream >> 32)
//   c        = offset + i / per_counter for element i (row-major) of a draw
// and element i takes lane i % per_counter of that counter's output: 4 elements per counter
// (one 32-bit word each) for types of at most 4 bytes and for masks; 2 (two words each) for
// f64 and i64. A draw of n elements advances its generator's offset by ceil(n / per_counter).
//
// Bitwise equality between the devices rests on IEEE arithmetic alone: conversions from
// integers, *, /, sqrt and fma are correctly rounded on both, and the transcendental parts
// (log, sin and cos for Box-Muller) are computed here from those operations (the libraries'
// logf/sinf differ between glibc and CUDA). No product feeds an addition except through an
// explicit fma, so neither compiler can contract one differently (-ffp-contract, --fmad).
// Don't build with -ffast-math / --use_fast_math arithmetic reassociation if you need the two
// devices to agree.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/tensor/kernel_tree.hpp>
#include <ccgraph/tensor/strided.hpp>

namespace ccgraph::detail {

/// Where a draw starts: the generator's seed (the Philox key) and stream (counter words 2-3),
/// and the first counter (offset) of the draw.
struct philox_stream {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
  std::uint64_t offset = 0;
};

/// The four 32-bit words of one Philox4x32-10 output block.
struct philox_block {
  std::uint32_t w[4];
};

/// Philox4x32-10 of counter (c0, c1, c2, c3) under key (k0, k1): Random123's reference
/// algorithm (tests check its published known answers).
CCGRAPH_HOST_DEVICE inline philox_block philox4x32_10(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                                      std::uint32_t c3, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += w0;
      k1 += w1;
    }
#if defined(__CUDA_ARCH__)
    const std::uint32_t hi0 = __umulhi(m0, c0), lo0 = m0 * c0;
    const std::uint32_t hi1 = __umulhi(m1, c2), lo1 = m1 * c2;
#else
    const std::uint64_t p0 = static_cast<std::uint64_t>(m0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(m1) * c2;
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
#endif
    const std::uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return {{c0, c1, c2, c3}};
}

/// The block of counter `offset + k` of stream `s` (see the layout at the top of this file).
CCGRAPH_HOST_DEVICE inline philox_block philox_at(const philox_stream& s, std::uint64_t k) {
  const std::uint64_t c = s.offset + k;
  return philox4x32_10(static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c >> 32),
                       static_cast<std::uint32_t>(s.stream), static_cast<std::uint32_t>(s.stream >> 32),
                       static_cast<std::uint32_t>(s.seed), static_cast<std::uint32_t>(s.seed >> 32));
}

// ---------------------------------------------------------------------------------------------
// Correctly rounded arithmetic that no compiler fuses or reorders (see the top of this file)
// ---------------------------------------------------------------------------------------------

namespace rng_math {

CCGRAPH_HOST_DEVICE inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
CCGRAPH_HOST_DEVICE inline double fma_rn(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
// Products and sums below never feed each other (that would be an fma_rn): on the host a plain
// operator is then exact IEEE; on the device the _rn intrinsics are never contracted.
CCGRAPH_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
CCGRAPH_HOST_DEVICE inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
CCGRAPH_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
CCGRAPH_HOST_DEVICE inline double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
CCGRAPH_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
CCGRAPH_HOST_DEVICE inline double div_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
CCGRAPH_HOST_DEVICE inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
CCGRAPH_HOST_DEVICE inline double sqrt_rn(double a) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
CCGRAPH_HOST_DEVICE inline float floor_rn(float a) { return floorf(a); }
CCGRAPH_HOST_DEVICE inline double floor_rn(double a) { return ::floor(a); }

/// The bits of a float / double as an integer and back (memcpy: no aliasing UB on the host).
CCGRAPH_HOST_DEVICE inline std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
CCGRAPH_HOST_DEVICE inline std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
CCGRAPH_HOST_DEVICE inline float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
CCGRAPH_HOST_DEVICE inline double double_of(std::uint64_t u) {
  double x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// log(x) for a normal x in (0, 1] (what Box-Muller takes): x = m * 2^e with m in
/// [sqrt(1/2), sqrt(2)), log(m) = 2 atanh(s), s = (m - 1) / (m + 1), by its series. A few ulp.
CCGRAPH_HOST_DEVICE inline float log_unit(float x) {
  const std::uint32_t b = bits_of(x);
  int e = static_cast<int>(b >> 23) - 127;
  float m = float_of((b & 0x7fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = mul_rn(m, 0.5f);  // exact
    e += 1;
  }
  const float f = add_rn(m, -1.0f);  // exact (Sterbenz)
  const float s = div_rn(f, add_rn(f, 2.0f));
  const float s2 = mul_rn(s, s);
  float p = fma_rn(s2, 1.0f / 11, 1.0f / 9);
  p = fma_rn(s2, p, 1.0f / 7);
  p = fma_rn(s2, p, 1.0f / 5);
  p = fma_rn(s2, p, 1.0f / 3);
  const float two_s = mul_rn(s, 2.0f);  // exact
  const float log_m = fma_rn(mul_rn(two_s, s2), p, two_s);
  return fma_rn(static_cast<float>(e), 0.693147180559945309f, log_m);
}
/// log(x) for a normal x in (0, 1], in double (about 1 ulp).
CCGRAPH_HOST_DEVICE inline double log_unit(double x) {
  const std::uint64_t b = bits_of(x);
  int e = static_cast<int>(b >> 52) - 1023;
  double m = double_of((b & 0xfffffffffffffull) | 0x3ff0000000000000ull);
  if (m > 1.4142135623730951) {
    m = mul_rn(m, 0.5);
    e += 1;
  }
  const double f = add_rn(m, -1.0);
  const double s = div_rn(f, add_rn(f, 2.0));
  const double s2 = mul_rn(s, s);
  double p = fma_rn(s2, 1.0 / 23, 1.0 / 21);
  p = fma_rn(s2, p, 1.0 / 19);
  p = fma_rn(s2, p, 1.0 / 17);
  p = fma_rn(s2, p, 1.0 / 15);
  p = fma_rn(s2, p, 1.0 / 13);
  p = fma_rn(s2, p, 1.0 / 11);
  p = fma_rn(s2, p, 1.0 / 9);
  p = fma_rn(s2, p, 1.0 / 7);
  p = fma_rn(s2, p, 1.0 / 5);
  p = fma_rn(s2, p, 1.0 / 3);
  const double two_s = mul_rn(s, 2.0);
  const double log_m = fma_rn(mul_rn(two_s, s2), p, two_s);
  const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;  // fdlibm's split
  const double de = static_cast<double>(e);
  return fma_rn(de, ln2_hi, fma_rn(de, ln2_lo, log_m));
}

/// sin and cos of 2*pi*v for v in [0, 1) a multiple of 2^-24 (float) or 2^-53 (double): the
/// quadrant is split off exactly (v - n/4), the rest is a polynomial on [-pi/4, pi/4].
template <class C>
CCGRAPH_HOST_DEVICE inline void sincos_2pi(C v, C& s, C& c) {
  const C n = floor_rn(add_rn(mul_rn(v, C(4)), C(0.5)));  // v * 4 is exact, so is any fusing
  const C y = fma_rn(n, C(-0.25), v);                      // exact: |y| <= 1/8
  const C x = mul_rn(y, C(6.283185307179586476925));
  const C x2 = mul_rn(x, x);
  C ps, pc;
  if constexpr (std::is_same_v<C, float>) {
    ps = fma_rn(x2, C(1.0 / 362880), C(-1.0 / 5040));
    ps = fma_rn(x2, ps, C(1.0 / 120));
    ps = fma_rn(x2, ps, C(-1.0 / 6));
    pc = fma_rn(x2, C(-1.0 / 3628800), C(1.0 / 40320));
    pc = fma_rn(x2, pc, C(-1.0 / 720));
    pc = fma_rn(x2, pc, C(1.0 / 24));
    pc = fma_rn(x2, pc, C(-0.5));
  } else {
    // Taylor terms up to x^17 / 17! and x^18 / 18!: below half an ulp on [-pi/4, pi/4].
    ps = fma_rn(x2, C(1.0 / 355687428096000.0), C(-1.0 / 1307674368000.0));
    ps = fma_rn(x2, ps, C(1.0 / 6227020800.0));
    ps = fma_rn(x2, ps, C(-1.0 / 39916800.0));
    ps = fma_rn(x2, ps, C(1.0 / 362880.0));
    ps = fma_rn(x2, ps, C(-1.0 / 5040.0));
    ps = fma_rn(x2, ps, C(1.0 / 120.0));
    ps = fma_rn(x2, ps, C(-1.0 / 6.0));
    pc = fma_rn(x2, C(-1.0 / 6402373705728000.0), C(1.0 / 20922789888000.0));
    pc = fma_rn(x2, pc, C(-1.0 / 87178291200.0));
    pc = fma_rn(x2, pc, C(1.0 / 479001600.0));
    pc = fma_rn(x2, pc, C(-1.0 / 3628800.0));
    pc = fma_rn(x2, pc, C(1.0 / 40320.0));
    pc = fma_rn(x2, pc, C(-1.0 / 720.0));
    pc = fma_rn(x2, pc, C(1.0 / 24.0));
    pc = fma_rn(x2, pc, C(-0.5));
  }
  const C sx = fma_rn(mul_rn(x, x2), ps, x);
  const C cx = fma_rn(x2, pc, C(1));
  switch (static_cast<int>(n) & 3) {
    case 0: s = sx, c = cx; break;
    case 1: s = cx, c = -sx; break;
    case 2: s = -sx, c = -cx; break;
    default: s = -cx, c = sx; break;
  }
}

}  // namespace rng_math

// ---------------------------------------------------------------------------------------------
// Distributions: each turns one Philox block into `per_counter` values
// ---------------------------------------------------------------------------------------------

/// [0, 1) from the top 24 bits of a word (exact in float).
CCGRAPH_HOST_DEVICE inline float unit_float(std::uint32_t w) {
  return rng_math::mul_rn(static_cast<float>(w >> 8), 5.9604644775390625e-08f);
}
/// [0, 1) from the top 53 bits of two words (exact in double).
CCGRAPH_HOST_DEVICE inline double unit_double(std::uint32_t hi, std::uint32_t lo) {
  const std::uint64_t u = (static_cast<std::uint64_t>(hi) << 32 | lo) >> 11;
  return rng_math::mul_rn(static_cast<double>(u), 1.1102230246251565404e-16);
}

/// Uniform values in [lo, hi) of element type T: floating types as lo + u * (hi - lo) in
/// compute_t<T> (one fma, then one rounding to T; a result that rounds up to hi becomes lo, as
/// PyTorch's CUDA uniform_ does); integers as floor(lo + u * (hi - lo)) in double (u from 32
/// bits, 53 for i64); bool as a fair coin (the word's top bit).
template <class T>
struct uniform_dist {
  using value_type = T;
  using compute = std::conditional_t<sizeof(T) == 8 || std::is_integral_v<T>, double, float>;
  static constexpr int per_counter = sizeof(T) == 8 ? 2 : 4;
  compute lo = 0, range = 1;
  double hi = 1;

  CCGRAPH_HOST_DEVICE void expand(const philox_block& b, T (&out)[per_counter]) const {
    for (int j = 0; j < per_counter; ++j) out[j] = one(b, j);
  }

 private:
  CCGRAPH_HOST_DEVICE T one(const philox_block& b, int j) const {
    if constexpr (std::is_same_v<T, bool>) {
      return (b.w[j] >> 31) != 0;
    } else {
      compute u;
      if constexpr (per_counter == 2)
        u = unit_double(b.w[2 * j], b.w[2 * j + 1]);
      else if constexpr (std::is_integral_v<T>)
        u = rng_math::mul_rn(static_cast<double>(b.w[j]), 2.3283064365386962890625e-10);  // 2^-32
      else
        u = unit_float(b.w[j]);
      compute v = rng_math::fma_rn(u, range, lo);
      if constexpr (std::is_integral_v<T>) {
        if (!(v < hi)) v = lo;
        return static_cast<T>(static_cast<std::int64_t>(rng_math::floor_rn(v)));  // u8: wraps
      } else {
        T r = cast<T>(v);
        if (!(static_cast<double>(static_cast<compute>(r)) < hi)) r = cast<T>(lo);
        return r;
      }
    }
  }
};

/// Standard normal values (Box-Muller, as curand_normal4 / curand_normal2_double): a pair of
/// words gives u1 in (0, 1] and u2 in [0, 1); sqrt(-2 log u1) * (cos, sin)(2 pi u2) are two
/// elements. Floating types of 4 bytes or less compute in float (4 per counter), f64 in double
/// (2 per counter: 53-bit u1 and u2).
template <class T>
struct normal_dist {
  using value_type = T;
  using compute = std::conditional_t<sizeof(T) == 8, double, float>;
  static constexpr int per_counter = sizeof(T) == 8 ? 2 : 4;

  CCGRAPH_HOST_DEVICE void expand(const philox_block& b, T (&out)[per_counter]) const {
    using namespace rng_math;
    if constexpr (per_counter == 2) {
      const double u1 = add_rn(unit_double(b.w[0], b.w[1]), 1.1102230246251565404e-16);  // (0, 1]
      const double u2 = unit_double(b.w[2], b.w[3]);
      pair(u1, u2, out[0], out[1]);
    } else {
      for (int j = 0; j < 2; ++j) {
        const float u1 = add_rn(unit_float(b.w[2 * j]), 5.9604644775390625e-08f);  // (0, 1]
        const float u2 = unit_float(b.w[2 * j + 1]);
        pair(u1, u2, out[2 * j], out[2 * j + 1]);
      }
    }
  }

 private:
  CCGRAPH_HOST_DEVICE static void pair(compute u1, compute u2, T& z0, T& z1) {
    using namespace rng_math;
    const compute r = sqrt_rn(mul_rn(compute(-2), log_unit(u1)));
    compute s, c;
    sincos_2pi(u2, s, c);
    z0 = cast<T>(mul_rn(r, c));
    z1 = cast<T>(mul_rn(r, s));
  }
};

/// Dropout's keep mask: true with probability threshold / 2^32 (a 32-bit word below the
/// threshold). threshold 2^32 keeps everything and 0 nothing; neither draws.
struct keep_dist {
  using value_type = bool;
  static constexpr int per_counter = 4;
  std::uint64_t threshold = std::uint64_t{1} << 32;

  CCGRAPH_HOST_DEVICE void expand(const philox_block& b, bool (&out)[per_counter]) const {
    for (int j = 0; j < per_counter; ++j) out[j] = b.w[j] < threshold;
  }
  /// True when the mask depends on the draws (0 < p < 1).
  CCGRAPH_HOST_DEVICE bool draws() const { return threshold != 0 && threshold != (std::uint64_t{1} << 32); }
};

/// True when a distribution's values depend on the draws (every one but a constant mask).
template <class Dist>
CCGRAPH_HOST_DEVICE bool dist_draws(const Dist& d) {
  if constexpr (requires { d.draws(); })
    return d.draws();
  else
    return true;
}

/// Counters a draw of `n` elements from Dist consumes.
template <class Dist>
constexpr std::uint64_t counters_for(std::int64_t n) {
  return (static_cast<std::uint64_t>(n) + Dist::per_counter - 1) / Dist::per_counter;
}

/// Element `idx` of the draw of `d` starting at `s`.
template <class Dist>
CCGRAPH_HOST_DEVICE typename Dist::value_type draw_at(const Dist& d, const philox_stream& s, std::uint64_t idx) {
  constexpr int pc = Dist::per_counter;
  typename Dist::value_type v[pc];
  if (dist_draws(d)) {
    d.expand(philox_at(s, idx / pc), v);
  } else {
    d.expand(philox_block{{0, 0, 0, 0}}, v);
  }
  // A compare chain instead of v[idx % pc]: a run-time index would put v in local memory.
  const int lane = static_cast<int>(idx % pc);
  typename Dist::value_type r = v[0];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 1; j < pc; ++j)
    if (j == lane) r = v[j];
  return r;
}

/// out[0..n) = elements [first, first + n) of the draw of `d` starting at `s` (host loops:
/// one Philox block per per_counter elements).
template <class Dist>
void fill_random(typename Dist::value_type* out, const Dist& d, const philox_stream& s, std::int64_t first,
                 std::int64_t n) {
  constexpr int pc = Dist::per_counter;
  const bool draws = dist_draws(d);
  typename Dist::value_type v[pc];
  if (!draws) d.expand(philox_block{{0, 0, 0, 0}}, v);
  std::int64_t i = 0;
  while (i < n) {
    const auto idx = static_cast<std::uint64_t>(first + i);
    const auto lane = static_cast<int>(idx % pc);
    if (draws) d.expand(philox_at(s, idx / pc), v);
    for (int j = lane; j < pc && i < n; ++j) out[i++] = v[j];
  }
}

/// Kernel-tree leaf (tensor/kernel_tree.hpp) for a random operand numbered I: element at
/// offset o[I] + i of the operand's own row-major index space, so it broadcasts like a tensor.
/// The host keeps the last block it expanded (its loops run in order); a device thread
/// expands one block per `per_counter` elements of a pack.
template <class Dist, std::size_t I>
struct random_kernel {
  using value_type = typename Dist::value_type;
  static constexpr int pc = Dist::per_counter;
  Dist d;
  philox_stream s;
  mutable std::uint64_t cached = ~std::uint64_t{0};  // host only
  mutable value_type cache[pc] = {};

  CCGRAPH_HOST_DEVICE value_type load(const std::int64_t* offsets, std::int64_t i) const {
    const auto idx = static_cast<std::uint64_t>(offsets[I] + i);
#if defined(__CUDA_ARCH__)
    return draw_at(d, s, idx);
#else
    const std::uint64_t c = idx / pc;
    if (c != cached) {
      if (dist_draws(d))
        d.expand(philox_at(s, c), cache);
      else
        d.expand(philox_block{{0, 0, 0, 0}}, cache);
      cached = c;
    }
    return cache[idx % pc];
#endif
  }
  /// Elements offsets[I], ..., offsets[I]+V-1 (the strided kernel's packs).
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<value_type, V> load_pack_off(const std::int64_t* offsets) const {
    return load_pack<V, Vec>(offsets[I]);
  }
  /// Elements i, ..., i+V-1 (the flat kernel's packs start at multiples of V).
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<value_type, V> load_pack(std::int64_t i) const {
    elem_pack<value_type, V> r;
    const auto first = static_cast<std::uint64_t>(i);
    if constexpr (V % pc == 0) {
      if (first % pc == 0) {
        const bool draws = dist_draws(d);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
        for (int k = 0; k < V / pc; ++k) {
          value_type v[pc];
          d.expand(draws ? philox_at(s, first / pc + static_cast<std::uint64_t>(k)) : philox_block{{0, 0, 0, 0}}, v);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
          for (int l = 0; l < pc; ++l) r.v[k * pc + l] = v[l];
        }
        return r;
      }
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < V; ++j) r.v[j] = draw_at(d, s, first + static_cast<std::uint64_t>(j));
    return r;
  }
  CCGRAPH_HOST_DEVICE bool aligned16() const { return true; }
};

}  // namespace ccgraph::detail
