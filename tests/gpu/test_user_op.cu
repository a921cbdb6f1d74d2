// tests/gpu/test_user_op.cu: a user op (ccgraph/ops/user_op.hpp) with its own CUDA kernel, run on
// device tensors eagerly, in an executed graph beside an all_reduce, and replayed from a CUDA
// Graph, equal to its CPU callable.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cstdint>
#include <string>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_user_op {

namespace cg = ccgraph;

namespace {

__global__ void axpb_kernel(const float* x, float* y, std::int64_t n, float a, float b) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = __fadd_rn(__fmul_rn(a, x[i]), b);  // no FMA: equal to the CPU callable
}

/// y = attrs[0] * x + attrs[1], f32: a CPU callable and a CUDA one.
const cg::user_op& axpb() {
  static const cg::user_op op = [] {
    cg::user_op_def d;
    d.name = "gpu_test::axpb";
    d.infer = [](const std::vector<cg::tensor_meta>& in, const std::vector<double>& attrs) {
      CCGRAPH_CHECK(in.size() == 1 && in[0].dtype == cg::dtype::f32, "gpu_test::axpb: expected one f32 tensor");
      CCGRAPH_CHECK(attrs.size() == 2, "gpu_test::axpb: expected attributes a and b");
      return std::vector<cg::tensor_meta>{in[0]};
    };
    d.cpu = [](const cg::user_op_call& c) {
      const auto x = std::get<cg::tensor<float>>(c.inputs[0]).to_vector();
      float* y = std::get<cg::tensor<float>>(c.outputs[0]).data();
      for (std::size_t i = 0; i < x.size(); ++i)
        y[i] = static_cast<float>(c.attrs[0]) * x[i] + static_cast<float>(c.attrs[1]);
    };
    d.cuda = [](const cg::user_op_call& c, void* stream) {
      const auto x = std::get<cg::tensor<float>>(c.inputs[0]).contiguous();
      const auto& y = std::get<cg::tensor<float>>(c.outputs[0]);
      const std::int64_t n = x.numel();
      if (n == 0) return;
      axpb_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
          x.data(), y.data(), n, static_cast<float>(c.attrs[0]), static_cast<float>(c.attrs[1]));
      CCGRAPH_CHECK(cudaGetLastError() == cudaSuccess, "gpu_test::axpb: launch failed");
    };
    d.cost = [](const cg::cost_args& a, const std::vector<double>&) {
      const double n = static_cast<double>(cg::numel_of(a.in[0].shape));
      return cg::op_cost::compute(2 * n, 8 * n, cg::peak_class::vector);
    };
    return cg::register_op(std::move(d));
  }();
  return op;
}

}  // namespace

TEST_CASE("user_op.cuda_callable_eager_graph_and_cuda_graph" * doctest::skip(ccgraph_test::gpu_count() < 1)) {
  const int ranks = ccgraph_test::gpu_count() >= 2 ? 2 : 1;
  const std::int64_t n = 100003;  // not a multiple of the block
  auto program = [](const cg::group& world) {
    return [world](auto x) {
      auto s = cg::wait_tensor(cg::all_reduce(x, "sum", world));
      return axpb().with({2.0, 0.5})(s);
    };
  };
  auto input = [&](int rank) { return cg::uniform<float>({n}, -1, 1, 5 + static_cast<std::uint64_t>(rank)); };
  // The reference: the CPU callable on the threads backend.
  std::vector<std::vector<float>> ref(static_cast<std::size_t>(ranks));
  cg::run_threads(ranks, [&](cg::rank_context& ctx) {
    ref[static_cast<std::size_t>(ctx.rank())] = program(ctx.world())(input(ctx.rank())).to_vector();
  });
  cg::cuda::run_gpus(ranks, [&](cg::rank_context& ctx) {
    const auto& want = ref[static_cast<std::size_t>(ctx.rank())];
    const auto x = input(ctx.rank()).cuda(ctx.rank());
    CHECK(program(ctx.world())(x).to_vector() == want);  // eager, on the device
    auto g = cg::trace(program(ctx.world()), cg::input<float>({n}));
    for (bool cuda_graph : {false, true}) {
      INFO("cuda_graph " << cuda_graph << ", rank " << ctx.rank());
      auto exe = cg::compile(g, ctx, {.cuda_graph = cuda_graph});
      for (int call = 0; call < 2; ++call) CHECK(exe(x).to_vector() == want);
    }
  });
}
}  // namespace gpu_test_user_op
