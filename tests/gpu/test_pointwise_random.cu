// The pointwise ops of a transformer block and the random numbers on a GPU: every new op
// (comparisons, where, clamp, pow, rsqrt, erf, tanh, sign, rounding, maximum/minimum, casts)
// through the generated kernel against the CPU path, mixed element types in one kernel, and
// the Philox draws (uniform, randn, dropout masks) bit for bit equal to the CPU's for the same
// seed, stream and offset, eagerly and in a compiled graph. Skipped without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_pointwise_random {

namespace cg = ccgraph;

namespace {

/// Same bits element by element (host copies of both).
template <class T>
void check_bits(const cg::tensor<T>& got, const cg::tensor<T>& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector(), w = want.to_vector();
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const T gi = g[i], wi = w[i];  // vector<bool> has no element addresses
    if (std::memcmp(&gi, &wi, sizeof(T)) != 0 && bad++ == 0) first = i;
  }
  CHECK_MESSAGE(bad == 0, bad << " of " << g.size() << " elements differ, the first at " << first);
}

/// Within `rel` (relative to max(1, |want|)) element by element; NaN where the CPU has NaN.
template <class T>
void check_near(const cg::tensor<T>& got, const cg::tensor<T>& want, double rel, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector(), w = want.to_vector();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double x = static_cast<double>(static_cast<cg::compute_t<T>>(g[i]));
    const double y = static_cast<double>(static_cast<cg::compute_t<T>>(w[i]));
    const bool ok = std::isnan(y) ? std::isnan(x) : std::abs(x - y) <= rel * std::max(1.0, std::abs(y));
    bad += ok ? 0 : 1;
  }
  CHECK_MESSAGE(bad == 0, bad << " of " << g.size() << " elements differ by more than " << rel);
}

/// Runs `f` on host operands and on device copies of them; `check` compares the two results.
template <class F, class... Ts>
auto both(F f, const cg::tensor<Ts>&... host) {
  auto cpu = f(host...);
  cg::device_guard on(cg::device::cuda(0));
  auto gpu = f(host.cuda(0)...);
  return std::make_pair(cpu, gpu);
}

template <class T>
void new_ops_match_cpu(double tol) {
  const auto a = cg::uniform<T>({33, 65}, -3, 3, 1);
  const auto b = cg::uniform<T>({65}, -3, 3, 2);
  const auto pos = cg::uniform<T>({33, 65}, 0.1, 4, 3);
  const auto wide = cg::uniform<T>({65, 33}, -40, 40, 4);
  // Exact ops: identical bits on both devices (flat, broadcast row, transposed).
  auto exact = [&](const char* what, auto f) {
    auto [c, g] = both(f, a, b, wide);
    check_bits(g, c, what);
  };
  exact("clamp", [](auto x, auto, auto) { return cg::tensor<T>(cg::clamp(x, -1, 2)); });
  exact("clamp tensor bounds", [](auto x, auto y, auto) { return cg::tensor<T>(cg::clamp(x, y, y + 1)); });
  exact("maximum", [](auto x, auto y, auto) { return cg::tensor<T>(cg::maximum(x, y)); });
  exact("minimum", [](auto x, auto y, auto) { return cg::tensor<T>(cg::minimum(x, y)); });
  exact("sign", [](auto x, auto, auto) { return cg::tensor<T>(cg::sign(x)); });
  exact("floor ceil round trunc", [](auto, auto, auto w) {
    return cg::tensor<T>(cg::floor(w) + cg::ceil(w) * 2 + cg::round(w) * 4 +
                         cg::tensor<T>(cg::trunc(w.transpose(0, 1))).transpose(0, 1));
  });
  exact("where", [](auto x, auto y, auto) { return cg::tensor<T>(cg::where(x > y, x, y * 2)); });
  exact("where scalars", [](auto x, auto, auto) { return cg::tensor<T>(cg::where(x < 0, 0, x)); });
  exact("transposed", [](auto, auto, auto w) { return cg::tensor<T>(cg::clamp(w.transpose(0, 1), -5, 5)); });
  // Bool results: vectors of 16 per thread over operands of T.
  for (auto [name, f] : {std::pair{"lt", +[](const cg::tensor<T>& x, const cg::tensor<T>& y) { return cg::tensor<bool>(x < y); }},
                         std::pair{"ne", +[](const cg::tensor<T>& x, const cg::tensor<T>& y) { return cg::tensor<bool>(x != y); }},
                         std::pair{"ge", +[](const cg::tensor<T>& x, const cg::tensor<T>& y) { return cg::tensor<bool>(cg::ge(x, y)); }}}) {
    auto [c, g] = both(f, a, b);
    check_bits(g, c, name);
  }
  // Library math (erf, tanh, rsqrt, pow): CUDA's and glibc's functions differ in the last bits.
  auto approx = [&](const char* what, auto f) {
    auto [c, g] = both(f, a, pos);
    check_near(g, c, tol, what);
  };
  approx("erf", [](auto x, auto) { return cg::tensor<T>(cg::erf(x)); });
  approx("tanh", [](auto x, auto) { return cg::tensor<T>(cg::tanh(x)); });
  approx("rsqrt", [](auto, auto p) { return cg::tensor<T>(cg::rsqrt(p)); });
  approx("pow", [](auto x, auto p) { return cg::tensor<T>(cg::pow(p, x) / 16); });
  approx("pow scalar", [](auto x, auto) { return cg::tensor<T>(cg::pow(x, 3)); });
}

}  // namespace

GPU_TEST_CASE("pointwise_gpu.new_ops_match_cpu.f32") { new_ops_match_cpu<float>(4e-6); }
GPU_TEST_CASE("pointwise_gpu.new_ops_match_cpu.f64") { new_ops_match_cpu<double>(1e-13); }
GPU_TEST_CASE("pointwise_gpu.new_ops_match_cpu.bf16") { new_ops_match_cpu<cg::bf16>(1.0 / 64); }
GPU_TEST_CASE("pointwise_gpu.new_ops_match_cpu.f16") { new_ops_match_cpu<cg::f16>(1.0 / 512); }

GPU_TEST_CASE("pointwise_gpu.mixed_dtypes_in_one_kernel") {
  const auto i = cg::uniform<std::int32_t>({37, 41}, -3, 3, 11);
  const auto f = cg::uniform<float>({37, 41}, -2, 2, 12);
  const auto g = cg::uniform<float>({41}, -2, 2, 13);
  auto fn = [](const auto& iv, const auto& fv, const auto& gv) {
    return std::make_tuple(cg::tensor<float>(cg::where(iv > 0, fv * 2.f, gv) + cg::cast<float>(iv)),
                           cg::tensor<cg::bf16>((fv * 3.f).template to<cg::bf16>()),
                           cg::tensor<std::int64_t>(cg::cast<std::int64_t>(fv * 10.f)),
                           cg::tensor<bool>(cg::abs(fv - gv) <= 0.5f),
                           cg::tensor<std::int32_t>(cg::pow(iv, 3) + cg::where(cg::cast<bool>(iv), 1, 0)));
  };
  auto [c, d] = both(fn, i, f, g);
  check_bits(std::get<0>(d), std::get<0>(c), "where over an int condition, cast inside");
  check_bits(std::get<1>(d), std::get<1>(c), "to bf16");
  check_bits(std::get<2>(d), std::get<2>(c), "to i64");
  check_bits(std::get<3>(d), std::get<3>(c), "bool result");
  check_bits(std::get<4>(d), std::get<4>(c), "integer pow, cast to bool");
}

namespace {

/// Draws with `draw(gen)` on the host and on the GPU from the same generator state; the
/// values and the generators' offsets afterwards must be identical.
template <class F>
void same_draws(F draw, std::uint64_t seed, std::uint64_t stream, std::uint64_t offset, const std::string& what) {
  cg::generator hg(seed, stream), dg(seed, stream);
  hg.set_offset(offset);
  dg.set_offset(offset);
  const auto cpu = draw(hg);
  cg::device_guard on(cg::device::cuda(0));
  const auto gpu = draw(dg);
  CHECK(gpu.device() == cg::device::cuda(0));
  check_bits(gpu, cpu, what);
  CHECK(hg.state() == dg.state());
}

template <class T>
void draws_match(std::int64_t n) {
  const std::string t(cg::to_string(cg::dtype_v<T>));
  for (auto [seed, stream, offset] : {std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>{0, 0, 0},
                                      {42, 3, 1000}, {0xdeadbeefcafef00dull, 1ull << 40, (1ull << 32) - 1}}) {
    same_draws([&](cg::generator& g) { return cg::uniform<T>({n}, -2, 3, g); }, seed, stream, offset, "uniform " + t);
    if constexpr (cg::is_floating(cg::dtype_v<T>))
      same_draws([&](cg::generator& g) { return cg::randn<T>({n}, g); }, seed, stream, offset, "randn " + t);
  }
}

}  // namespace

GPU_TEST_CASE("random_gpu.draws_bitwise_equal_to_cpu") {
  for (std::int64_t n : {1, 3, 7, 1000, 1 << 20, (1 << 20) + 5}) {
    CAPTURE(n);
    draws_match<float>(n);
    draws_match<double>(n);
    draws_match<cg::bf16>(n);
    draws_match<cg::f16>(n);
    draws_match<std::int32_t>(n);
    draws_match<std::int64_t>(n);
    draws_match<std::uint8_t>(n);
    draws_match<bool>(n);
  }
}

GPU_TEST_CASE("random_gpu.dropout_bitwise_equal_to_cpu") {
  const auto x = cg::uniform<float>({257, 129}, -1, 1, 21);
  const auto row = cg::uniform<float>({129}, -1, 1, 22);
  const auto h = x.to<cg::bf16>();
  auto check = [](const char* what, auto f) {
    cg::generator hg(7), dg(7);
    const auto cpu = f(hg, false);
    cg::device_guard on(cg::device::cuda(0));
    const auto gpu = f(dg, true);
    check_bits(gpu, cpu, what);
    CHECK(hg.state() == dg.state());
  };
  auto on_device = [](const auto& t, bool dev) { return dev ? t.cuda(0) : t; };
  check("flat", [&](cg::generator& g, bool dev) { return cg::tensor<float>(cg::dropout(on_device(x, dev), 0.3, g)); });
  check("fused chain", [&](cg::generator& g, bool dev) {
    return cg::tensor<float>(cg::dropout(cg::relu(on_device(x, dev)) + on_device(row, dev), 0.1, g) * 2.f - 1.f);
  });
  check("transposed operand", [&](cg::generator& g, bool dev) {
    return cg::tensor<float>(cg::dropout(on_device(x, dev).transpose(0, 1), 0.5, g));
  });
  check("broadcast mask", [&](cg::generator& g, bool dev) {
    return cg::tensor<float>(cg::dropout(on_device(row, dev), 0.5, g) + on_device(x, dev));
  });
  check("bf16", [&](cg::generator& g, bool dev) { return cg::tensor<cg::bf16>(cg::dropout(on_device(h, dev), 0.2, g)); });
  check("p = 1", [&](cg::generator& g, bool dev) { return cg::tensor<float>(cg::dropout(on_device(x, dev), 1.0, g)); });
}

GPU_TEST_CASE("random_gpu.traced_dropout_and_cuda_graphs") {
  auto fn = [](auto x, auto b) { return cg::eval(cg::dropout(cg::relu(x) + b, 0.5) * 3.f + cg::cast<float>(x > b)); };
  const auto hx = cg::uniform<float>({64, 48}, -1, 1, 31);
  const auto hb = cg::uniform<float>({48}, -1, 1, 32);
  // The CPU's compiled graph from a seed: the reference.
  std::vector<float> want1, want2;
  cg::run_threads(1, [&](cg::rank_context& ctx) {
    auto exe = cg::compile(cg::trace(fn, cg::input<float>({64, 48}), cg::input<float>({48})), ctx);
    cg::manual_seed(5);
    want1 = exe(hx, hb).to_vector();
    want2 = exe(hx, hb).to_vector();
  });
  CHECK(want1 != want2);
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    auto g = cg::trace(fn, cg::input<float>({64, 48}), cg::input<float>({48}));
    auto exe = cg::compile(g, ctx);
    const auto x = hx.cuda(0), b = hb.cuda(0);
    cg::manual_seed(5);
    const auto got1 = exe(x, b).to_vector();
    const auto got2 = exe(x, b).to_vector();
    CHECK(std::memcmp(got1.data(), want1.data(), got1.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(got2.data(), want2.data(), got2.size() * sizeof(float)) == 0);
    // A CUDA Graph would replay one mask forever: refused.
    CHECK_THROWS_WITH_AS((void)cg::compile(g, ctx, {.cuda_graph = true}),
                         doctest::Contains("draws random numbers"), cg::error);
  });
}
}  // namespace gpu_test_pointwise_random
