// tests/tensor/test_random.cpp: the counter-based generator (ccgraph/tensor/philox.hpp and
// random.hpp): Philox4x32-10's published known answers, the documented counter layout, the
// deterministic math behind Box-Muller, statistics of 1M draws, reproducibility (seeds,
// states, streams, per-rank default generators), and the device code paths run on the host.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <ccgraph/runtime/threads.hpp>
#include <ccgraph/tensor/philox.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include "support.hpp"

namespace cg = ccgraph;
namespace cgd = ccgraph::detail;
using namespace ccgraph_test;

namespace {

using i64 = std::int64_t;
using u64 = std::uint64_t;

/// Mean and variance (as doubles) of a tensor's values.
template <class T>
std::pair<double, double> rnd_moments(const cg::tensor<T>& t) {
  double m = 0, m2 = 0;
  const auto v = t.to_vector();
  for (auto x : v) m += to_d(x);
  m /= static_cast<double>(v.size());
  for (auto x : v) m2 += (to_d(x) - m) * (to_d(x) - m);
  return {m, m2 / static_cast<double>(v.size())};
}

/// Pearson's chi-square statistic of `counts` against equal expected counts.
double rnd_chi_square(const std::vector<i64>& counts) {
  i64 total = 0;
  for (auto c : counts) total += c;
  const double e = static_cast<double>(total) / static_cast<double>(counts.size());
  double x2 = 0;
  for (auto c : counts) x2 += (static_cast<double>(c) - e) * (static_cast<double>(c) - e) / e;
  return x2;
}

/// Standard normal CDF.
double rnd_phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

}  // namespace

TEST_CASE("random.philox.known_answers") {
  // Random123's tests/kat_vectors, the three "philox4x32 10" lines: counter, key -> output.
  struct kat {
    std::array<std::uint32_t, 4> ctr;
    std::array<std::uint32_t, 2> key;
    std::array<std::uint32_t, 4> out;
  };
  const kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) {
    const auto b = cgd::philox4x32_10(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int j = 0; j < 4; ++j) CHECK(b.w[j] == k.out[static_cast<std::size_t>(j)]);
  }
  // The stream layout: key = seed, counter = (offset + k, stream) in 64-bit halves.
  const cgd::philox_stream s{0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a80ull};
  const auto b = cgd::philox_at(s, 8);
  CHECK(b.w[0] == 0xd16cfe09);
  CHECK(b.w[3] == 0x24126ea1);
}

TEST_CASE("random.layout.documented_counters") {
  // uniform<float> element i is lane i % 4 of counter offset + i / 4: the layout the GPU
  // reproduces. The generator's offset advances by ceil(n / per_counter).
  cg::generator g(0x1234, 7);
  g.set_offset(100);
  const auto t = cg::uniform<float>({10}, 0, 1, g);
  CHECK(g.offset() == 103);
  const auto v = t.to_vector();
  for (u64 i = 0; i < 10; ++i) {
    const auto b = cgd::philox4x32_10(static_cast<std::uint32_t>(100 + i / 4), 0, 7, 0, 0x1234, 0);
    CHECK(v[i] == static_cast<float>(b.w[i % 4] >> 8) * 0x1p-24f);
  }
  // f64: two words (53 bits) per element, so two elements per counter.
  cg::generator h(5);
  const auto d = cg::uniform<double>({3}, 0, 1, h).to_vector();
  CHECK(h.offset() == 2);
  const auto b0 = cgd::philox4x32_10(0, 0, 0, 0, 5, 0);
  CHECK(d[1] == static_cast<double>((static_cast<u64>(b0.w[2]) << 32 | b0.w[3]) >> 11) * 0x1p-53);
  // randn<float>: 4 per counter; randn<double>: 2; a dropout mask: 4.
  cg::generator r(1);
  (void)cg::randn<float>({9}, r);
  CHECK(r.offset() == 3);
  (void)cg::randn<double>({9}, r);
  CHECK(r.offset() == 8);
}

TEST_CASE("random.math.deterministic_log_and_sincos") {
  // The Box-Muller math is IEEE operations only; check it is also accurate.
  double worst_log = 0, worst_sin = 0, worst_log_d = 0, worst_sin_d = 0;
  for (std::uint32_t i = 1; i <= (1u << 24); i += 97) {
    const float u = static_cast<float>(i) * 0x1p-24f;
    const double ref = std::log(static_cast<double>(u));
    worst_log = std::max(worst_log, std::abs(cgd::rng_math::log_unit(u) - ref) / std::max(1e-30, std::abs(ref)));
    worst_log_d = std::max(worst_log_d, std::abs(cgd::rng_math::log_unit(static_cast<double>(u)) - ref) /
                                            std::max(1e-300, std::abs(ref)));
    const float v = static_cast<float>(i - 1) * 0x1p-24f;
    float s, c;
    cgd::rng_math::sincos_2pi(v, s, c);
    double sd, cdd;
    cgd::rng_math::sincos_2pi(static_cast<double>(v), sd, cdd);
    const double a = 2 * M_PI * static_cast<double>(v);
    worst_sin = std::max({worst_sin, std::abs(s - std::sin(a)), std::abs(c - std::cos(a))});
    worst_sin_d = std::max({worst_sin_d, std::abs(sd - std::sin(a)), std::abs(cdd - std::cos(a))});
  }
  CHECK(worst_log < 4e-7);
  CHECK(worst_sin < 2e-7);
  CHECK(worst_log_d < 1e-15);
  CHECK(worst_sin_d < 2e-15);
  CHECK(cgd::rng_math::log_unit(1.0f) == 0.f);
  CHECK(cgd::rng_math::log_unit(1.0) == 0.0);
}

TEST_CASE_TEMPLATE("random.uniform.statistics", T, float, double, cg::bf16, cg::f16) {
  constexpr i64 n = 1 << 20;
  const double lo = -1.5, hi = 2.5;
  const auto t = cg::uniform<T>({n}, lo, hi, 11);
  const auto [m, var] = rnd_moments(t);
  const double tol = std::is_same_v<T, cg::bf16> ? 0.01 : 0.004;  // bf16 rounds to 8 bits
  CHECK(std::abs(m - (lo + hi) / 2) < tol);
  CHECK(std::abs(var - (hi - lo) * (hi - lo) / 12) < 4 * tol);
  std::vector<i64> bins(64, 0);
  double mn = 1e9, mx = -1e9;
  for (auto x : t.to_vector()) {
    const double d = to_d(x);
    mn = std::min(mn, d);
    mx = std::max(mx, d);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      ++bins[static_cast<std::size_t>((d - lo) / (hi - lo) * 64)];
  }
  CHECK(mn >= lo);
  CHECK(mx < hi);  // [lo, hi): a value rounding up to hi becomes lo
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    // 63 degrees of freedom: mean 63, sd 11.2; 130 is 6 sd out.
    CHECK(rnd_chi_square(bins) < 130);
  }
}

TEST_CASE("random.uniform.integers_and_bool") {
  constexpr i64 n = 1 << 20;
  const auto i = cg::uniform<std::int32_t>({n}, -3, 5, 21).to_vector();  // -3 .. 4
  std::vector<i64> bins(8, 0);
  for (auto v : i) {
    REQUIRE(v >= -3);
    REQUIRE(v <= 4);
    ++bins[static_cast<std::size_t>(v + 3)];
  }
  CHECK(rnd_chi_square(bins) < 40);  // 7 degrees of freedom
  const auto l = cg::uniform<std::int64_t>({n}, 0, 1e12, 22).to_vector();
  double m = 0;
  for (auto v : l) m += static_cast<double>(v);
  CHECK(std::abs(m / n - 5e11) < 5e11 * 0.005);
  const auto b = cg::uniform<bool>({n}, 0, 1, 23).to_vector();
  i64 t = 0;
  for (bool v : b) t += v;
  CHECK(std::abs(static_cast<double>(t) / n - 0.5) < 0.003);
  // u8 from a negative range wraps, as before.
  const auto u = cg::uniform<std::uint8_t>({1000}, -1, 0, 24).to_vector();
  for (auto v : u) CHECK(v == 255);
}

TEST_CASE_TEMPLATE("random.randn.statistics", T, float, double, cg::bf16, cg::f16) {
  constexpr i64 n = 1 << 20;
  const auto t = cg::randn<T>({n}, cg::generator(31));
  const auto [m, var] = rnd_moments(t);
  CHECK(std::abs(m) < 0.005);  // sd of the mean: 0.001
  CHECK(std::abs(var - 1) < 0.01);
  // Chi-square against the normal CDF over 40 equiprobable bins.
  std::vector<double> edges;
  for (int k = 1; k < 40; ++k) {
    double lo = -10, hi = 10;  // bisect rnd_phi(x) = k / 40
    for (int it = 0; it < 100; ++it) {
      const double mid = (lo + hi) / 2;
      (rnd_phi(mid) < k / 40.0 ? lo : hi) = mid;
    }
    edges.push_back(lo);
  }
  std::vector<i64> bins(40, 0);
  double m3 = 0, m4 = 0;
  for (auto x : t.to_vector()) {
    const double d = to_d(x);
    m3 += d * d * d;
    m4 += d * d * d * d;
    ++bins[static_cast<std::size_t>(std::upper_bound(edges.begin(), edges.end(), d) - edges.begin())];
  }
  CHECK(std::abs(m3 / n) < 0.02);      // skewness 0
  CHECK(std::abs(m4 / n - 3) < 0.05);  // kurtosis 3
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
    CHECK(rnd_chi_square(bins) < 90);  // 39 degrees of freedom: mean 39, sd 8.8
}

TEST_CASE("random.reproducible.seeds_states_and_draws") {
  // An explicit seed: the same values every call.
  CHECK(cg::uniform<float>({100}, -1, 1, 5).to_vector() == cg::uniform<float>({100}, -1, 1, 5).to_vector());
  CHECK(cg::uniform<float>({100}, -1, 1, 5).to_vector() != cg::uniform<float>({100}, -1, 1, 6).to_vector());
  // A generator: two draws differ, and a saved state replays them.
  cg::generator g(77);
  const auto st = g.state();
  const auto a = cg::randn<float>({100}, g).to_vector();
  const auto b = cg::randn<float>({100}, g).to_vector();
  CHECK(a != b);
  g.set_state(st);
  CHECK(cg::randn<float>({100}, g).to_vector() == a);
  // Copies share the state (like torch.Generator objects).
  cg::generator h = g;
  (void)cg::randn<float>({8}, h);
  CHECK(g.state() == h.state());
  CHECK(g == h);
  // A draw of n elements starting mid-counter is the same as the tail of a longer one.
  g.manual_seed(77);
  const auto whole = cg::uniform<float>({11}, 0, 1, g).to_vector();
  std::vector<float> part(7);
  cgd::fill_random(part.data(), cgd::make_uniform<float>(0, 1), cgd::philox_stream{77, 0, 0}, 4, 7);
  for (std::size_t i = 0; i < 7; ++i) CHECK(part[i] == whole[i + 4]);
  // Streams: same seed, another stream, other numbers.
  CHECK(cg::uniform<float>({64}, 0, 1, cg::generator(1, 0)).to_vector() !=
        cg::uniform<float>({64}, 0, 1, cg::generator(1, 1)).to_vector());
}

TEST_CASE("random.default_generator.manual_seed_and_two_draws_differ") {
  cg::manual_seed(42);
  const auto a = cg::uniform<float>({50}).to_vector();
  const auto b = cg::uniform<float>({50}).to_vector();
  const auto c = cg::randn<double>({50}).to_vector();
  CHECK(a != b);
  cg::manual_seed(42);
  CHECK(cg::uniform<float>({50}).to_vector() == a);
  CHECK(cg::uniform<float>({50}).to_vector() == b);
  CHECK(cg::randn<double>({50}).to_vector() == c);
  CHECK(cg::default_generator().seed() == 42);
  CHECK(cg::default_generator().stream() == 0);
}

TEST_CASE("random.default_generator.per_rank") {
  // Each rank (a thread) has its own default generator, seeded like PyTorch's: without
  // manual_seed, or with the same seed, every rank draws the same numbers; with its rank as the
  // stream, each draws its own.
  std::vector<std::vector<float>> fresh(3), same(3), own(3);
  std::mutex mu;
  run(3, [&](cg::rank_context& ctx) {
    const auto r = static_cast<std::size_t>(ctx.rank());
    CHECK(cg::default_generator().seed() == cg::generator::default_seed);
    auto f = cg::uniform<float>({16}).to_vector();
    cg::manual_seed(9);
    auto s = cg::uniform<float>({16}).to_vector();
    cg::manual_seed(9, static_cast<std::uint64_t>(ctx.rank()));
    auto o = cg::uniform<float>({16}).to_vector();
    std::lock_guard lk(mu);
    fresh[r] = f;
    same[r] = s;
    own[r] = o;
  });
  CHECK(fresh[0] == fresh[1]);
  CHECK(fresh[1] == fresh[2]);
  CHECK(same[0] == same[2]);
  CHECK(own[0] == same[0]);  // rank 0's stream is stream 0
  CHECK(own[0] != own[1]);
  CHECK(own[1] != own[2]);
}

TEST_CASE("random.errors") {
  CHECK(error_of([] { (void)cg::uniform<float>({4}, 1, 0, 1); }) ==
        "uniform: expects lo <= hi to draw from [lo, hi), but got lo=1 > hi=0");
  CHECK(contains(error_of([] { (void)cg::uniform<float>({4}, -INFINITY, 0, 1); }), "uniform: lo and hi must be finite"));
  CHECK(contains(error_of([] { (void)cg::uniform<float>({4}, -3e38, 3e38, 1); }), "overflows f32"));
  // lo == hi: every value is lo.
  for (float v : cg::uniform<float>({8}, 2, 2, 1).to_vector()) CHECK(v == 2.f);
}

TEST_CASE("random.kernel_leaf.packs_match_the_host_loop") {
  // The device kernel reads random operands through random_kernel's load / load_pack; run both
  // on the host against fill_random for every pack width the flat kernel uses.
  auto check = [](const auto& dist, const char* what) {
    CAPTURE(what);
    using D = std::remove_cvref_t<decltype(dist)>;
    using V = typename D::value_type;
    const cgd::philox_stream s{99, 3, 17};
    constexpr i64 n = 64;
    const std::unique_ptr<V[]> want(new V[n]);  // not vector<bool>: fill_random writes through a V*
    cgd::fill_random(want.get(), dist, s, 0, n);
    const cgd::random_kernel<D, 1> k{dist, s};
    const std::int64_t zero[2] = {0, 0};
    auto same = [](V a, V b) { return std::memcmp(&a, &b, sizeof(V)) == 0; };
    for (i64 i = 0; i < n; ++i) CHECK(same(k.load(zero, i), want[static_cast<std::size_t>(i)]));
    // Offsets: operand 1 starts at element 5.
    const std::int64_t off[2] = {0, 5};
    CHECK(same(k.load(off, 2), want[7]));
    auto packs = [&](auto v_tag) {
      constexpr int Vw = decltype(v_tag)::value;
      for (i64 i = 0; i + Vw <= n; i += Vw) {
        const auto p = k.template load_pack<Vw, false>(i);
        for (int j = 0; j < Vw; ++j) CHECK(same(p.v[j], want[static_cast<std::size_t>(i + j)]));
      }
      // An unaligned start takes the element path.
      const auto q = k.template load_pack<Vw, false>(3);
      for (int j = 0; j < Vw; ++j) CHECK(same(q.v[j], want[static_cast<std::size_t>(3 + j)]));
    };
    packs(std::integral_constant<int, 1>{});
    packs(std::integral_constant<int, 2>{});
    packs(std::integral_constant<int, 4>{});
    packs(std::integral_constant<int, 8>{});
    packs(std::integral_constant<int, 16>{});
  };
  check(cgd::make_uniform<float>(-1, 1), "uniform f32");
  check(cgd::make_uniform<double>(-1, 1), "uniform f64");
  check(cgd::make_uniform<cg::bf16>(-1, 1), "uniform bf16");
  check(cgd::make_uniform<std::int64_t>(-100, 100), "uniform i64");
  check(cgd::make_uniform<bool>(0, 1), "uniform bool");
  check(cgd::normal_dist<float>{}, "normal f32");
  check(cgd::normal_dist<double>{}, "normal f64");
  check(cgd::normal_dist<cg::f16>{}, "normal f16");
  check(cgd::keep_dist{std::uint64_t{3} << 30}, "keep 0.75");
}
