// Tests of ccgraph/core/dtype.hpp and ccgraph/core/half.hpp: bf16 / f16 conversions bit-exact
// against an independent reference, the dtype tags and traits, and detail::cast.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/half.hpp>
#include <ccgraph/tensor/strided.hpp>

namespace cg = ccgraph;

namespace {

// ---- an independent reference for the 16-bit formats, in double arithmetic ----------------
// Every value of both formats, and every float, is exact in a double; so are the scalings by
// powers of two below. Rounding to an integer with std::nearbyint under FE_TONEAREST is the
// one rounding step, and it ties to even.

/// A binary floating format with `mant` stored mantissa bits and exponent bias `bias`
/// (max biased exponent all ones = inf/NaN).
struct format {
  int mant;
  int exp_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  int emin() const { return 1 - bias(); }  // exponent of the smallest normal
  int emax() const { return bias(); }      // exponent of the largest finite
  std::uint16_t inf_bits() const { return static_cast<std::uint16_t>(((1 << exp_bits) - 1) << mant); }
};
constexpr format f16_fmt{10, 5};
constexpr format bf16_fmt{7, 8};

/// Decodes a bit pattern to its exact value, without using the library.
double ref_decode(format f, std::uint16_t b) {
  const bool neg = (b >> 15) & 1;
  const int e = (b >> f.mant) & ((1 << f.exp_bits) - 1);
  const int m = b & ((1 << f.mant) - 1);
  double v;
  if (e == (1 << f.exp_bits) - 1)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), f.emin() - f.mant);
  else
    v = std::ldexp(static_cast<double>(m + (1 << f.mant)), e - f.bias() - f.mant);
  return neg ? -v : v;
}

/// Rounds x to the nearest value of the format (ties to even), overflowing to inf, and encodes
/// it. NaN gives 0xffff (callers check NaN-ness only).
std::uint16_t ref_encode(format f, float x) {
  if (std::isnan(x)) return 0xffff;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(a)) return sign | f.inf_bits();
  if (a == 0) return sign;
  // Exponent of x's binade, clamped to the subnormal binade's exponent.
  const int e = std::max(std::ilogb(a), f.emin());
  const double ulp = std::ldexp(1.0, e - f.mant);
  const double q = std::nearbyint(a / ulp);  // exact division by a power of two
  const double v = q * ulp;                  // rounded value, unbounded exponent range
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -f.mant), f.emax());
  if (v > max_finite) return sign | f.inf_bits();
  if (v == 0) return sign;
  const int ve = std::ilogb(v);
  if (ve < f.emin())  // subnormal
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(v / std::ldexp(1.0, f.emin() - f.mant)));
  const auto m = static_cast<std::uint32_t>(v / std::ldexp(1.0, ve - f.mant)) - (1u << f.mant);
  return static_cast<std::uint16_t>(sign | ((ve + f.bias()) << f.mant) | m);
}

template <class H>
constexpr format fmt_of() {
  return std::is_same_v<H, cg::f16> ? f16_fmt : bf16_fmt;
}

bool is_nan_bits(format f, std::uint16_t b) {
  return (b & 0x7fff) > f.inf_bits();
}

/// Checks the library's narrowing of x against the reference; returns true on agreement.
template <class H>
bool narrow_agrees(float x) {
  constexpr format f = fmt_of<H>();
  const std::uint16_t got = H::from_float(x);
  if (std::isnan(x)) return is_nan_bits(f, got);
  return got == ref_encode(f, x);
}

float bits_to_float(std::uint32_t u) { return std::bit_cast<float>(u); }

/// Restores the rounding mode (the reference relies on round-to-nearest).
struct nearest_rounding {
  int saved = std::fegetround();
  nearest_rounding() { std::fesetround(FE_TONEAREST); }
  ~nearest_rounding() { std::fesetround(saved); }
};

}  // namespace

// ---- the reference itself is checked on hand-computed cases first ---------------------------

TEST_CASE("half.reference.sanity") {
  nearest_rounding rn;
  CHECK(ref_encode(f16_fmt, 1.0f) == 0x3c00);
  CHECK(ref_encode(f16_fmt, 65504.0f) == 0x7bff);
  CHECK(ref_encode(f16_fmt, 65520.0f) == 0x7c00);
  CHECK(ref_encode(f16_fmt, std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(ref_encode(f16_fmt, -2.0f) == 0xc000);
  CHECK(ref_encode(bf16_fmt, 1.0f) == 0x3f80);
  CHECK(ref_encode(bf16_fmt, -1.0f) == 0xbf80);
  CHECK(ref_encode(bf16_fmt, std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(ref_decode(f16_fmt, 0x0001) == std::ldexp(1.0, -24));
  CHECK(ref_decode(f16_fmt, 0x7bff) == 65504.0);
  CHECK(ref_decode(bf16_fmt, 0x0001) == std::ldexp(1.0, -133));
  CHECK(ref_decode(bf16_fmt, 0x3f80) == 1.0);
}

// ---- widening ---------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("half.widen_all_bit_patterns_exact", H, cg::f16, cg::bf16) {
  constexpr format f = fmt_of<H>();
  int mismatches = 0;
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float w = H::to_float(bits);
    const double ref = ref_decode(f, bits);
    if (is_nan_bits(f, bits)) {
      if (!std::isnan(w)) ++mismatches;
    } else if (static_cast<double>(w) != ref || std::signbit(w) != std::signbit(ref)) {
      ++mismatches;
    }
    // The conversion operator agrees with to_float.
    const float via_op = H::from_bits(bits);
    if (std::bit_cast<std::uint32_t>(via_op) != std::bit_cast<std::uint32_t>(w)) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE_TEMPLATE("half.round_trip_all_bit_patterns", H, cg::f16, cg::bf16) {
  constexpr format f = fmt_of<H>();
  int mismatches = 0;
  int nans = 0;
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const std::uint16_t back = H::from_float(H::to_float(bits));
    if (is_nan_bits(f, bits)) {
      ++nans;
      if (!is_nan_bits(f, back)) ++mismatches;  // NaN stays NaN
    } else if (back != bits) {
      ++mismatches;  // identity, -0 and +-inf included
    }
  }
  CHECK(mismatches == 0);
  CHECK(nans == (f.mant == 10 ? 2 * 1023 : 2 * 127));
}

// ---- narrowing --------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("half.narrow_halfway_and_neighbours", H, cg::f16, cg::bf16) {
  // For every pair of adjacent finite values: the midpoint (a tie), the floats just either side
  // of it, and each value itself with its float neighbours.
  nearest_rounding rn;
  constexpr format f = fmt_of<H>();
  int mismatches = 0;
  int checked = 0;
  auto check = [&](float x) {
    ++checked;
    if (!narrow_agrees<H>(x)) {
      ++mismatches;
      if (mismatches < 10) MESSAGE("mismatch at float bits 0x" << std::hex << std::bit_cast<std::uint32_t>(x));
    }
  };
  for (std::uint32_t b = 0; b < f.inf_bits(); ++b) {  // positive finite values
    for (std::uint32_t sign : {0u, 0x8000u}) {
      const auto lo = static_cast<std::uint16_t>(b | sign);
      const auto hi = static_cast<std::uint16_t>((b + 1) | sign);  // next magnitude (may be inf)
      const auto vlo = static_cast<float>(ref_decode(f, lo));
      check(vlo);
      check(std::nextafter(vlo, 0.0f));
      check(std::nextafter(vlo, std::copysign(std::numeric_limits<float>::infinity(), vlo)));
      const double vhi = (b + 1 == f.inf_bits())
                             ? (sign ? -1.0 : 1.0) * std::ldexp(1.0, f.emax() + 1)  // where inf starts
                             : ref_decode(f, hi);
      const double mid_d = (static_cast<double>(vlo) + vhi) / 2;
      const auto mid = static_cast<float>(mid_d);
      REQUIRE(static_cast<double>(mid) == mid_d);  // ties are exact floats for both formats
      check(mid);
      check(std::nextafter(mid, 0.0f));
      check(std::nextafter(mid, std::copysign(std::numeric_limits<float>::infinity(), mid)));
    }
  }
  CHECK(checked > 65536 * 5);
  CHECK(mismatches == 0);
}

TEST_CASE_TEMPLATE("half.narrow_random_floats", H, cg::f16, cg::bf16) {
  nearest_rounding rn;
  std::mt19937 gen(1234);
  int mismatches = 0;
  // Uniform over all float bit patterns (every exponent, NaNs, infs, subnormals) ...
  for (int i = 0; i < 300000; ++i) {
    const float x = bits_to_float(static_cast<std::uint32_t>(gen()));
    if (!narrow_agrees<H>(x)) ++mismatches;
  }
  // ... and concentrated around the format's range, where all the rounding paths are.
  constexpr format f = fmt_of<H>();
  std::uniform_int_distribution<int> exp_dist(std::max(0, 127 + f.emin() - f.mant - 3),
                                              std::min(254, 127 + f.emax() + 2));
  for (int i = 0; i < 300000; ++i) {
    const std::uint32_t u = (gen() & 0x807fffffu) | (static_cast<std::uint32_t>(exp_dist(gen)) << 23);
    const float x = bits_to_float(u);
    if (!narrow_agrees<H>(x)) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("f16.narrow_edge_cases") {
  using H = cg::f16;
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(H::from_float(65504.0f) == 0x7bff);                           // max finite
  CHECK(H::from_float(-65504.0f) == 0xfbff);
  CHECK(H::from_float(std::nextafter(65520.0f, 0.0f)) == 0x7bff);     // just below the tie
  CHECK(H::from_float(65520.0f) == 0x7c00);                           // tie with odd max: inf
  CHECK(H::from_float(-65520.0f) == 0xfc00);
  CHECK(H::from_float(1e6f) == 0x7c00);                               // overflow
  CHECK(H::from_float(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(H::from_float(inf) == 0x7c00);
  CHECK(H::from_float(-inf) == 0xfc00);
  CHECK(H::from_float(std::ldexp(1.0f, -24)) == 0x0001);              // smallest subnormal
  CHECK(H::from_float(-std::ldexp(1.0f, -24)) == 0x8001);
  CHECK(H::from_float(std::ldexp(1.0f, -25)) == 0x0000);              // tie: to even (zero)
  CHECK(H::from_float(-std::ldexp(1.0f, -25)) == 0x8000);             // keeps the sign
  CHECK(H::from_float(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(H::from_float(3 * std::ldexp(1.0f, -25)) == 0x0002);          // tie 1|2 -> 2
  CHECK(H::from_float(5 * std::ldexp(1.0f, -25)) == 0x0002);          // tie 2|3 -> 2
  CHECK(H::from_float(std::ldexp(1.0f, -14)) == 0x0400);              // smallest normal
  CHECK(H::from_float(std::ldexp(1023.5f, -24)) == 0x0400);           // subnormal rounds up to normal
  CHECK(H::from_float(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(H::from_float(0.0f) == 0x0000);
  CHECK(H::from_float(-0.0f) == 0x8000);
  CHECK(H::from_float(1.0f) == 0x3c00);
  CHECK(H::from_float(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);       // tie 1.0|1.0+ulp -> even
  CHECK(H::from_float(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);   // tie -> even (up)
  CHECK(H::from_float(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)) == 0x3c01);
  CHECK(H::from_float(0.1f) == 0x2e66);
  CHECK(H::from_float(-2.5f) == 0xc100);
  const std::uint16_t nan = H::from_float(std::numeric_limits<float>::quiet_NaN());
  CHECK(is_nan_bits(f16_fmt, nan));
  CHECK(std::isnan(static_cast<float>(H::from_bits(nan))));
  CHECK(is_nan_bits(f16_fmt, H::from_float(std::numeric_limits<float>::signaling_NaN())));
  CHECK(is_nan_bits(f16_fmt, H::from_float(bits_to_float(0x7f800001u))));  // payload in low bits only
  // The value constructors round the same way.
  CHECK(H(65520.0).bits == 0x7c00);
  CHECK(H(3).bits == 0x4200);
  CHECK(H(-1L).bits == 0xbc00);
  CHECK(H(2048LL + 1).bits == H::from_float(2048.0f));  // 2049 is a tie -> 2048
}

TEST_CASE("bf16.round_to_nearest_even") {
  using H = cg::bf16;
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(H::from_float(1.0f) == 0x3f80);
  CHECK(H::from_float(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);          // tie -> even
  CHECK(H::from_float(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);      // tie -> even (up)
  CHECK(H::from_float(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)) == 0x3f81);
  CHECK(H::from_float(bits_to_float(0x7f7f0000u)) == 0x7f7f);          // max finite
  CHECK(H::from_float(bits_to_float(0x7f7f7fffu)) == 0x7f7f);          // below the tie
  CHECK(H::from_float(bits_to_float(0x7f7f8000u)) == 0x7f80);          // tie with odd max: inf
  CHECK(H::from_float(std::numeric_limits<float>::max()) == 0x7f80);   // overflow
  CHECK(H::from_float(-std::numeric_limits<float>::max()) == 0xff80);
  CHECK(H::from_float(inf) == 0x7f80);
  CHECK(H::from_float(-inf) == 0xff80);
  CHECK(H::from_float(bits_to_float(0x00010000u)) == 0x0001);          // smallest subnormal
  CHECK(H::from_float(bits_to_float(0x00008000u)) == 0x0000);          // tie -> zero
  CHECK(H::from_float(bits_to_float(0x00008001u)) == 0x0001);
  CHECK(H::from_float(bits_to_float(0x80008000u)) == 0x8000);          // keeps the sign
  CHECK(H::from_float(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(H::from_float(0.0f) == 0x0000);
  CHECK(H::from_float(-0.0f) == 0x8000);
  CHECK(H::from_float(0.1f) == 0x3dcd);
  CHECK(H::from_float(-3.0f) == 0xc040);
  const std::uint16_t nan = H::from_float(std::numeric_limits<float>::quiet_NaN());
  CHECK(is_nan_bits(bf16_fmt, nan));
  // A NaN whose payload lives only in the low 16 bits must not become inf.
  CHECK(is_nan_bits(bf16_fmt, H::from_float(bits_to_float(0x7f800001u))));
  CHECK(is_nan_bits(bf16_fmt, H::from_float(bits_to_float(0xff800001u))));
  CHECK(is_nan_bits(bf16_fmt, H::from_float(bits_to_float(0x7fffffffu))));  // no wrap to zero
  CHECK(H(1.00390625).bits == 0x3f80);
  CHECK(H(257).bits == 0x4380);  // 257 is a tie between 256 and 258 -> 256
  CHECK(H(259L).bits == 0x4382);  // tie 258|260 -> 260 (even mantissa)
}

TEST_CASE_TEMPLATE("half.arithmetic_through_float", H, cg::f16, cg::bf16) {
  const H a = 1.5f, b = 2.25f;
  CHECK(float(a + b) == 3.75f);
  CHECK(float(a - b) == -0.75f);
  CHECK(float(a * b) == 3.375f);
  CHECK(float(b / a) == 1.5f);
  CHECK(float(-a) == -1.5f);
  H c = a;
  c += b;
  CHECK(float(c) == 3.75f);
  c -= b;
  c *= b;
  c /= b;
  CHECK(float(c) == 1.5f);
  CHECK(a == H(1.5f));
  CHECK(a < b);
  CHECK(b > a);
  CHECK(a <= a);
  CHECK(b >= a);
  CHECK(H(0.0f) == H(-0.0f));
  const H nan = H::from_bits(H::from_float(std::numeric_limits<float>::quiet_NaN()));
  CHECK_FALSE(nan == nan);
  // A product rounds once, to the format.
  const H one_ulp = H::from_bits(static_cast<std::uint16_t>(H(1.0f).bits + 1));
  CHECK((one_ulp * one_ulp).bits == H(float(one_ulp) * float(one_ulp)).bits);
  std::ostringstream os;
  os << H(2.5f) << ' ' << H(-0.5f);
  CHECK(os.str() == "2.5 -0.5");
  static_assert(sizeof(H) == 2);
  static_assert(std::is_trivially_copyable_v<H>);
  static_assert(H::from_bits(0x1234).bits == 0x1234);
  static_assert(H{}.bits == 0);
}

// ---- dtype tags and traits ------------------------------------------------------------------

TEST_CASE("dtype.tags_and_sizes") {
  static_assert(cg::dtype_v<float> == cg::dtype::f32);
  static_assert(cg::dtype_v<double> == cg::dtype::f64);
  static_assert(cg::dtype_v<std::int32_t> == cg::dtype::i32);
  static_assert(cg::dtype_v<std::int64_t> == cg::dtype::i64);
  static_assert(cg::dtype_v<std::uint8_t> == cg::dtype::u8);
  static_assert(cg::dtype_v<bool> == cg::dtype::boolean);
  static_assert(cg::dtype_v<cg::bf16> == cg::dtype::bf16);
  static_assert(cg::dtype_v<cg::f16> == cg::dtype::f16);

  static_assert(cg::element_size(cg::dtype::f32) == 4);
  static_assert(cg::element_size(cg::dtype::f64) == 8);
  static_assert(cg::element_size(cg::dtype::i32) == 4);
  static_assert(cg::element_size(cg::dtype::i64) == 8);
  static_assert(cg::element_size(cg::dtype::u8) == 1);
  static_assert(cg::element_size(cg::dtype::boolean) == 1);
  static_assert(cg::element_size(cg::dtype::bf16) == 2);
  static_assert(cg::element_size(cg::dtype::f16) == 2);

  static_assert(cg::to_string(cg::dtype::f32) == "f32");
  static_assert(cg::to_string(cg::dtype::f64) == "f64");
  static_assert(cg::to_string(cg::dtype::i32) == "i32");
  static_assert(cg::to_string(cg::dtype::i64) == "i64");
  static_assert(cg::to_string(cg::dtype::u8) == "u8");
  static_assert(cg::to_string(cg::dtype::boolean) == "bool");
  static_assert(cg::to_string(cg::dtype::bf16) == "bf16");
  static_assert(cg::to_string(cg::dtype::f16) == "f16");

  static_assert(cg::is_floating(cg::dtype::f32) && cg::is_floating(cg::dtype::f64));
  static_assert(cg::is_floating(cg::dtype::bf16) && cg::is_floating(cg::dtype::f16));
  static_assert(!cg::is_floating(cg::dtype::i32) && !cg::is_floating(cg::dtype::i64));
  static_assert(!cg::is_floating(cg::dtype::u8) && !cg::is_floating(cg::dtype::boolean));

  // The same facts at run time, and through operator<<.
  const cg::dtype all[] = {cg::dtype::f32, cg::dtype::f64, cg::dtype::i32,  cg::dtype::i64,
                           cg::dtype::u8,  cg::dtype::boolean, cg::dtype::bf16, cg::dtype::f16};
  const char* names[] = {"f32", "f64", "i32", "i64", "u8", "bool", "bf16", "f16"};
  for (int i = 0; i < 8; ++i) {
    std::ostringstream os;
    os << all[i];
    CHECK(os.str() == names[i]);
    CHECK(cg::to_string(all[i]) == names[i]);
  }
}

TEST_CASE("dtype.element_concept_and_traits") {
  static_assert(cg::element<float> && cg::element<double> && cg::element<std::int32_t>);
  static_assert(cg::element<std::int64_t> && cg::element<std::uint8_t> && cg::element<bool>);
  static_assert(cg::element<cg::bf16> && cg::element<cg::f16>);
  static_assert(!cg::element<char> && !cg::element<std::int16_t> && !cg::element<std::uint32_t>);
  static_assert(!cg::element<long double> && !cg::element<void> && !cg::element<float*>);
  static_assert(!cg::element<const float> && !cg::element<float&>);
  static_assert(cg::is_element_v<float> && !cg::is_element_v<std::string>);

  static_assert(cg::is_integral_element_v<std::int32_t> && cg::is_integral_element_v<std::int64_t>);
  static_assert(cg::is_integral_element_v<std::uint8_t> && cg::is_integral_element_v<bool>);
  static_assert(!cg::is_integral_element_v<float> && !cg::is_integral_element_v<cg::bf16>);

  static_assert(std::is_same_v<cg::compute_t<cg::bf16>, float>);
  static_assert(std::is_same_v<cg::compute_t<cg::f16>, float>);
  static_assert(std::is_same_v<cg::compute_t<float>, float>);
  static_assert(std::is_same_v<cg::compute_t<double>, double>);
  static_assert(std::is_same_v<cg::compute_t<std::int32_t>, std::int32_t>);
  static_assert(std::is_same_v<cg::compute_t<std::int64_t>, std::int64_t>);
  static_assert(std::is_same_v<cg::compute_t<std::uint8_t>, std::uint8_t>);
  static_assert(std::is_same_v<cg::compute_t<bool>, bool>);
  CHECK(cg::is_element_v<cg::f16>);
}

TEST_CASE("dtype.visit_dtype") {
  const cg::dtype all[] = {cg::dtype::f32, cg::dtype::f64, cg::dtype::i32,  cg::dtype::i64,
                           cg::dtype::u8,  cg::dtype::boolean, cg::dtype::bf16, cg::dtype::f16};
  for (cg::dtype d : all) {
    // The visitor receives a value of exactly the element type the tag names.
    const cg::dtype seen = cg::visit_dtype(d, [](auto x) { return cg::dtype_v<decltype(x)>; });
    CHECK(seen == d);
    const std::size_t size = cg::visit_dtype(d, [](auto x) { return sizeof(x); });
    CHECK(size == cg::element_size(d));
    // Value-initialised: zero.
    const bool zero = cg::visit_dtype(d, [](auto x) { return static_cast<double>(static_cast<cg::compute_t<decltype(x)>>(x)) == 0.0; });
    CHECK(zero);
  }
  // decltype(auto): a reference result stays a reference.
  int target = 0;
  int& r = cg::visit_dtype(cg::dtype::i32, [&](auto) -> int& { return target; });
  r = 7;
  CHECK(target == 7);
}

TEST_CASE("dtype.visit_any_dtype_covers_complex_visit_dtype_refuses_it") {
  // visit_dtype covers the dtypes compute kernels take; visit_any_dtype adds c64 and c128 for
  // code that only stores or moves elements.
  const cg::dtype all[] = {cg::dtype::f32, cg::dtype::f64,  cg::dtype::i32, cg::dtype::i64, cg::dtype::u8,
                           cg::dtype::boolean, cg::dtype::bf16, cg::dtype::f16, cg::dtype::c64, cg::dtype::c128};
  for (cg::dtype d : all) {
    CAPTURE(d);
    CHECK(cg::visit_any_dtype(d, [](auto x) { return cg::dtype_v<decltype(x)>; }) == d);
    CHECK(cg::visit_any_dtype(d, [](auto x) { return sizeof(x); }) == cg::element_size(d));
    if (cg::is_complex(d))
      CHECK_THROWS_WITH_AS(cg::visit_dtype(d, [](auto) {}),
                           (std::string(cg::to_string(d)) +
                            " tensors are not supported by this op: compute ops take real dtypes; collectives, copies "
                            "and views take complex ones")
                               .c_str(),
                           cg::error);
  }
  static_assert(cg::dtype_v<std::complex<float>> == cg::dtype::c64 && cg::dtype_v<std::complex<double>> == cg::dtype::c128);
  static_assert(cg::element<std::complex<double>> && !cg::real_element<std::complex<double>> && cg::real_element<bool>);
  CHECK(cg::to_string(cg::dtype::c64) == "c64");
  CHECK(cg::to_string(cg::dtype::c128) == "c128");
}

// ---- detail::cast ---------------------------------------------------------------------------

TEST_CASE("dtype.cast_rules") {
  using cg::detail::cast;
  // bool is "not zero", from every type, NaN included (PyTorch: bool(nan) is True).
  CHECK(cast<bool>(0.0f) == false);
  CHECK(cast<bool>(-0.0f) == false);
  CHECK(cast<bool>(0.25f) == true);
  CHECK(cast<bool>(-1e-30) == true);
  CHECK(cast<bool>(std::numeric_limits<float>::quiet_NaN()) == true);
  CHECK(cast<bool>(std::int32_t{0}) == false);
  CHECK(cast<bool>(std::int64_t{-5}) == true);
  CHECK(cast<bool>(std::uint8_t{2}) == true);
  CHECK(cast<bool>(cg::bf16(0.0f)) == false);
  CHECK(cast<bool>(cg::bf16(-0.0f)) == false);
  CHECK(cast<bool>(cg::bf16(0.5f)) == true);
  CHECK(cast<bool>(cg::f16(0.0f)) == false);
  CHECK(cast<bool>(cg::f16::from_bits(0x0001)) == true);  // smallest subnormal is not zero
  CHECK(cast<bool>(true) == true);
  // A fraction below 1 does not truncate to false.
  CHECK(cast<bool>(0.5) == true);

  // From bool.
  CHECK(cast<float>(true) == 1.0f);
  CHECK(cast<std::int64_t>(false) == 0);
  CHECK(cast<cg::bf16>(true).bits == 0x3f80);
  CHECK(cast<cg::f16>(true).bits == 0x3c00);

  // Halves go through float.
  CHECK(cast<std::int32_t>(cg::bf16(2.75f)) == 2);
  CHECK(cast<std::int32_t>(cg::f16(-2.75f)) == -2);
  CHECK(cast<double>(cg::f16::from_bits(0x0001)) == std::ldexp(1.0, -24));
  CHECK(cast<cg::bf16>(cg::f16(0.1f)).bits == cg::bf16(static_cast<float>(cg::f16(0.1f))).bits);
  CHECK(cast<cg::f16>(cg::bf16(3.0f)).bits == 0x4200);
  CHECK(cast<cg::f16>(cg::bf16::from_bits(0x7f7f)).bits == 0x7c00);  // bf16 max overflows f16
  CHECK(cast<cg::f16>(std::int32_t{3}).bits == 0x4200);
  CHECK(cast<cg::bf16>(std::int64_t{-2}).bits == 0xc000);
  CHECK(cast<cg::bf16>(1.00390625).bits == 0x3f80);  // double -> bf16 ties to even
  CHECK(cast<std::uint8_t>(cg::bf16(200.0f)) == 200);

  // Same type: identity, bit for bit.
  CHECK(cast<cg::bf16>(cg::bf16::from_bits(0x7fc1)).bits == 0x7fc1);
  CHECK(cast<float>(0.1f) == 0.1f);
  // Plain static_cast between the builtin types.
  CHECK(cast<std::int32_t>(-3.9) == -3);
  CHECK(cast<float>(std::int64_t{1} << 40) == std::ldexp(1.0f, 40));
  CHECK(cast<double>(0.1f) == static_cast<double>(0.1f));

  static_assert(std::is_same_v<decltype(cast<cg::f16>(1.0f)), cg::f16>);
  static_assert(std::is_same_v<decltype(cast<bool>(cg::bf16{})), bool>);
}
