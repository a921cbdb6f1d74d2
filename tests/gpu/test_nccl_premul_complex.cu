// premul_sum (ncclRedOpCreatePreMulSum) and complex tensors (c64/c128 as pairs of reals) on the
// nccl backend: every reducing collective, and the moving ones for complex, compared with the
// threads backend's results on the same inputs, on 1, 2 and 4 GPUs; the errors c10d gives for the
// combinations it refuses are the same on both backends.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cmath>
#include <complex>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_nccl_premul_complex {

namespace cg = ccgraph;

namespace {

using c64 = std::complex<float>;
using c128 = std::complex<double>;

/// What one rank got: named values (complex as real, imaginary pairs), and named errors.
struct outcome {
  std::map<std::string, std::vector<double>> values;
  std::map<std::string, std::string> errors;
};

template <class T>
std::vector<double> host_values(const cg::tensor<T>& t) {
  std::vector<double> out;
  for (auto v : t.to_vector()) {
    if constexpr (cg::is_complex_v<T>) {
      out.push_back(static_cast<double>(v.real()));
      out.push_back(static_cast<double>(v.imag()));
    } else {
      out.push_back(static_cast<double>(static_cast<cg::compute_t<T>>(v)));
    }
  }
  return out;
}

/// Rank r's [rows, 3] tensor of small integers (complex: a second part of another sign).
template <class T>
cg::tensor<T> input_of(int r, std::int64_t rows) {
  std::vector<T> v;
  for (std::int64_t i = 0; i < rows * 3; ++i) {
    const double re = static_cast<double>((r + 3 * i) % 5 + 1);
    if constexpr (cg::is_complex_v<T>) {
      using R = typename T::value_type;
      v.push_back(T(static_cast<R>(re), static_cast<R>(-(r + i % 3))));
    } else {
      v.push_back(cg::detail::cast<T>(re));
    }
  }
  return cg::tensor<T>::from(v, {rows, 3});
}

/// Records `f()`'s values under `key`, or its error.
template <class F>
void record(outcome& out, const std::string& key, F&& f) {
  try {
    out.values[key] = f();
  } catch (const cg::error& e) {
    out.errors[key] = e.what();
  }
}

/// Every reducing collective with `op` on T (all_reduce, reduce_scatter_tensor, the coalesced
/// forms, reduce) and, for complex T, the moving collectives.
template <class T>
void suite_of(cg::rank_context& ctx, cg::reduce_op op, outcome& out) {
  const int r = ctx.rank(), n = ctx.world_size();
  const auto w = ctx.world();
  const std::int64_t rows = 2 * n;
  const std::string k = cg::detail::concat(cg::dtype_v<T>, ".", op, ".");
  record(out, k + "all_reduce", [&] { return host_values(cg::all_reduce(input_of<T>(r, rows), op, w)); });
  record(out, k + "reduce_scatter", [&] { return host_values(cg::reduce_scatter_tensor(input_of<T>(r, rows), op, 0, w)); });
  record(out, k + "all_reduce_coalesced", [&] {
    auto v = cg::all_reduce_coalesced(std::vector{input_of<T>(r, rows), input_of<T>(r + 1, 1)}, op, w);
    auto a = host_values(v[0]), b = host_values(v[1]);
    a.insert(a.end(), b.begin(), b.end());
    return a;
  });
  record(out, k + "reduce_scatter_coalesced", [&] {
    return host_values(cg::reduce_scatter_tensor_coalesced(std::vector{input_of<T>(r, rows)}, op, {0}, w)[0]);
  });
  record(out, k + "reduce", [&] { return host_values(cg::reduce(input_of<T>(r, rows), n - 1, op, w)); });
  if constexpr (cg::is_complex_v<T>) {
    const std::string m = cg::detail::concat(cg::dtype_v<T>, ".");
    record(out, m + "all_gather", [&] { return host_values(cg::all_gather_tensor(input_of<T>(r, 2), 0, w)); });
    record(out, m + "broadcast", [&] { return host_values(cg::broadcast(input_of<T>(r, 2), n - 1, w)); });
    record(out, m + "all_to_all", [&] {
      return host_values(cg::all_to_all_single(input_of<T>(r, rows), std::nullopt, std::nullopt, w));
    });
    if (n >= 2)
      record(out, m + "send_recv", [&] {
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        auto got = cg::batch_isend_irecv({cg::isend(input_of<T>(r, 2), next), cg::irecv(input_of<T>(prev, 2), prev)}, w);
        return host_values(got.at(0));
      });
  }
}

outcome premul_complex_suite(cg::rank_context& ctx) {
  outcome out;
  for (double f : {0.5, -0.25, 0.1}) {
    suite_of<float>(ctx, cg::premul_sum(f), out);
    suite_of<double>(ctx, cg::premul_sum(f), out);
    suite_of<cg::bf16>(ctx, cg::premul_sum(f), out);
    suite_of<cg::f16>(ctx, cg::premul_sum(f), out);
    suite_of<std::int32_t>(ctx, cg::premul_sum(f), out);  // refused, as c10d
    suite_of<bool>(ctx, cg::premul_sum(f), out);          // refused, as c10d
  }
  for (cg::reduce_op op : {cg::reduce_op::sum, cg::reduce_op::avg, cg::premul_sum(0.5), cg::reduce_op::max,
                           cg::reduce_op::product}) {
    suite_of<c64>(ctx, op, out);
    suite_of<c128>(ctx, op, out);
  }
  return out;
}

/// premul_complex_suite on n ranks of both backends: the same values (within the dtype's
/// rounding: NCCL's premul_sum multiplies in the element type) and the same errors.
void premul_complex_case(int n) {
  std::vector<outcome> cpu(static_cast<std::size_t>(n)), gpu(static_cast<std::size_t>(n));
  cg::run_threads(n, [&](cg::rank_context& ctx) { cpu[static_cast<std::size_t>(ctx.rank())] = premul_complex_suite(ctx); });
  cg::cuda::run_gpus(n, [&](cg::rank_context& ctx) { gpu[static_cast<std::size_t>(ctx.rank())] = premul_complex_suite(ctx); });
  for (int r = 0; r < n; ++r) {
    const auto& c = cpu[static_cast<std::size_t>(r)];
    const auto& g = gpu[static_cast<std::size_t>(r)];
    CHECK(c.values.size() == g.values.size());
    for (auto& [key, want] : c.values) {
      CAPTURE(key);
      REQUIRE(g.values.count(key) == 1);
      const auto& got = g.values.at(key);
      REQUIRE(got.size() == want.size());
      const bool half = key.rfind("bf16", 0) == 0 || key.rfind("f16", 0) == 0;
      const double tol = half ? 1e-2 : key.rfind("f32", 0) == 0 || key.rfind("c64", 0) == 0 ? 1e-6 : 1e-12;
      for (std::size_t i = 0; i < want.size(); ++i) {
        INFO("rank " << r << " of " << n << " element " << i << ": got " << got[i] << " want " << want[i]);
        CHECK(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
      }
    }
    for (auto& [key, e] : c.errors) {
      CAPTURE(key);
      REQUIRE(g.errors.count(key) == 1);
      CHECK(g.errors.at(key) == e);
    }
    // What the threads backend refuses: integer/bool premul_sum, complex max/product.
    CHECK(c.errors.count("i32.premul_sum(0.5).all_reduce") == 1);
    CHECK(c.errors.count("c64.max.all_reduce") == 1);
    CHECK(c.values.count("c64.premul_sum(0.5).all_reduce") == 1);
  }
}

}  // namespace

GPU_TEST_CASE("nccl.premul_sum_and_complex_match_threads_backend.1_gpu") { premul_complex_case(1); }
GPUS_TEST_CASE("nccl.premul_sum_and_complex_match_threads_backend.2_gpus", 2) { premul_complex_case(2); }
GPUS_TEST_CASE("nccl.premul_sum_and_complex_match_threads_backend.4_gpus", 4) { premul_complex_case(4); }

TEST_CASE("nccl.copy_engine_all_reduce_refuses_premul_sum_and_complex") {
  // No GPU needed: the pair kernel has neither, so such all_reduces go to NCCL.
  cg::cuda::nccl_options opt;
  opt.copy_engine = cg::cuda::copy_engine_all_reduce::always;
  auto request = [](cg::reduce_op op, cg::dtype dt) {
    cg::detail::collective_request req;
    req.op = cg::ops::all_reduce{op};
    req.group.ranks = {0, 1};
    cg::detail::buffer b;
    b.meta = {dt, {1 << 20}};
    req.inputs.push_back(b);
    req.outputs.push_back(b);
    return req;
  };
  using cg::cuda::detail::copy_engine_eligible;
  CHECK(copy_engine_eligible(opt, request(cg::reduce_op::sum, cg::dtype::f32)));
  CHECK_FALSE(copy_engine_eligible(opt, request(cg::premul_sum(0.5), cg::dtype::f32)));
  CHECK_FALSE(copy_engine_eligible(opt, request(cg::premul_sum(0.5), cg::dtype::bf16)));
  CHECK_FALSE(copy_engine_eligible(opt, request(cg::reduce_op::sum, cg::dtype::c64)));
}
}  // namespace gpu_test_nccl_premul_complex
