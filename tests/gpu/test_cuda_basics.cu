// The thin CUDA layer: RAII owners, error macros, capture, and a one-rank NCCL all_reduce.
// Every case is skipped (not failed) on a machine without a GPU.
#include <ccgraph/cuda.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cuda_runtime.h>

#include <numeric>
#include <string>
#include <utility>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_cuda_basics {

namespace cg = ccgraph;

namespace {

using ccgraph_test::gpu_available;

__global__ void add_one(float* data, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += 1.f;
}

/// A device buffer owned for the test's scope.
struct device_buffer {
  float* ptr = nullptr;
  explicit device_buffer(std::size_t n) { CCGRAPH_CHECK_CUDA(cudaMalloc(&ptr, n * sizeof(float))); }
  ~device_buffer() { (void)cudaFree(ptr); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

}  // namespace

TEST_CASE("cuda.device_present") {
  // Runs everywhere, so that a run without a GPU says why the other cases were skipped.
  if (!gpu_available()) MESSAGE("no CUDA device: the GPU test cases are skipped");
  int runtime = 0;
  CHECK(cudaRuntimeGetVersion(&runtime) == cudaSuccess);
  CHECK(runtime / 1000 == CUDART_VERSION / 1000);  // same major version as the headers
}

GPU_TEST_CASE("cuda.stream_event.move_only") {
  static_assert(!std::is_copy_constructible_v<cg::cuda::stream>);
  static_assert(std::is_nothrow_move_constructible_v<cg::cuda::stream>);
  static_assert(!std::is_copy_constructible_v<cg::cuda::event>);
  static_assert(!std::is_copy_constructible_v<cg::cuda::graph_exec>);
  static_assert(!std::is_copy_constructible_v<cg::cuda::nccl_comm>);

  cg::cuda::stream a;
  cudaStream_t raw = a.get();
  CHECK(raw != nullptr);
  cg::cuda::stream b = std::move(a);
  CHECK(b.get() == raw);
  CHECK(a.get() == nullptr);  // NOLINT(bugprone-use-after-move): documented moved-from state
  CHECK(b.query());
}

GPU_TEST_CASE("cuda.memcpy_async.round_trip_and_kernel") {
  constexpr int n = 1000;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.f);
  device_buffer dev(n);

  cg::cuda::stream s;
  auto start = cg::cuda::event::timed();
  auto stop = cg::cuda::event::timed();
  start.record(s);
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(dev.ptr, host.data(), n * sizeof(float),
                                     cudaMemcpyHostToDevice, s.get()));
  add_one<<<(n + 255) / 256, 256, 0, s.get()>>>(dev.ptr, n);
  CCGRAPH_CHECK_CUDA(cudaGetLastError());
  std::vector<float> back(n, -1.f);
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(back.data(), dev.ptr, n * sizeof(float),
                                     cudaMemcpyDeviceToHost, s.get()));
  stop.record(s);
  stop.synchronize();
  CHECK(stop.query());
  CHECK(cg::cuda::elapsed_ms(start, stop) >= 0.f);
  for (int i = 0; i < n; ++i) REQUIRE(back[i] == doctest::Approx(host[i] + 1.f));
}

GPU_TEST_CASE("cuda.event.cross_stream_join") {
  constexpr int n = 256;
  device_buffer dev(n);
  cg::cuda::stream producer;
  cg::cuda::stream consumer;
  cg::cuda::event ready;
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(dev.ptr, 0, n * sizeof(float), producer.get()));
  ready.record(producer);
  consumer.wait(ready);
  add_one<<<1, n, 0, consumer.get()>>>(dev.ptr, n);
  std::vector<float> back(n, -1.f);
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(back.data(), dev.ptr, n * sizeof(float),
                                     cudaMemcpyDeviceToHost, consumer.get()));
  consumer.synchronize();
  for (float v : back) REQUIRE(v == 1.f);
}

GPU_TEST_CASE("cuda.check.throws_and_clears") {
  void* p = nullptr;
  // An absurd allocation fails with cudaErrorMemoryAllocation, a non-sticky error.
  CHECK_THROWS_AS(CCGRAPH_CHECK_CUDA(cudaMalloc(&p, std::size_t{1} << 62)), cg::cuda_error);
  try {
    CCGRAPH_CHECK_CUDA(cudaMalloc(&p, std::size_t{1} << 62));
  } catch (const cg::cuda_error& e) {
    const std::string what = e.what();
    CHECK(what.find("cudaMalloc") != std::string::npos);             // the call
    CHECK(what.find("cudaErrorMemoryAllocation") != std::string::npos);  // CUDA's name
    CHECK(what.find("test_cuda_basics.cu:") != std::string::npos);   // file:line
  }
  // The failure was cleared: the next check does not see it again.
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK_NOTHROW(CCGRAPH_CHECK_CUDA(cudaDeviceSynchronize()));

  CHECK_THROWS_AS(CCGRAPH_CHECK_NCCL(ncclCommCount(nullptr, nullptr)), cg::nccl_error);
  CHECK_THROWS_AS(CCGRAPH_CHECK_CUDA(cudaSetDevice(-1)), cg::cuda_error);
  CHECK(cudaGetLastError() == cudaSuccess);
}

GPU_TEST_CASE("cuda.graph.capture_and_replay") {
  constexpr int n = 512;
  device_buffer dev(n);
  cg::cuda::stream s;
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(dev.ptr, 0, n * sizeof(float), s.get()));
  s.synchronize();

  CHECK_FALSE(cg::cuda::is_capturing(s.get()));
  cg::cuda::graph g = cg::cuda::capture(s, [&] {
    CHECK(cg::cuda::is_capturing(s.get()));
    add_one<<<(n + 127) / 128, 128, 0, s.get()>>>(dev.ptr, n);
    add_one<<<(n + 127) / 128, 128, 0, s.get()>>>(dev.ptr, n);
  });
  REQUIRE(g);
  CHECK(g.num_nodes() == 2);
  CHECK(g.num_edges() == 1);
  CHECK_FALSE(cg::cuda::is_capturing(s.get()));

  cg::cuda::graph_exec exec(g);
  exec.upload(s);
  for (int i = 0; i < 3; ++i) exec.launch(s);
  std::vector<float> back(n, -1.f);
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(back.data(), dev.ptr, n * sizeof(float),
                                     cudaMemcpyDeviceToHost, s.get()));
  s.synchronize();
  for (float v : back) REQUIRE(v == 6.f);  // 3 replays x 2 kernels

  // An exception inside capture ends it and leaves the stream usable.
  CHECK_THROWS_AS((void)cg::cuda::capture(s, [] { throw cg::error("boom"); }), cg::error);
  CHECK_FALSE(cg::cuda::is_capturing(s.get()));
  CHECK_NOTHROW(s.synchronize());
}

GPU_TEST_CASE("cuda.nccl.all_reduce.world1") {
  std::vector<cg::cuda::nccl_comm> comms = cg::cuda::nccl_comm::init_all({0});
  REQUIRE(comms.size() == 1);
  cg::cuda::nccl_comm& comm = comms[0];
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  CHECK(comm.device() == 0);
  CHECK(comm.async_error() == ncclSuccess);

  constexpr int n = 64;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 1.f);
  device_buffer in(n);
  device_buffer out(n);
  cg::cuda::stream s;
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(in.ptr, host.data(), n * sizeof(float),
                                     cudaMemcpyHostToDevice, s.get()));
  CCGRAPH_CHECK_NCCL(ncclAllReduce(in.ptr, out.ptr, n, ncclFloat, ncclSum, comm.get(), s.get()));
  std::vector<float> back(n, -1.f);
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(back.data(), out.ptr, n * sizeof(float),
                                     cudaMemcpyDeviceToHost, s.get()));
  s.synchronize();
  CHECK(back == host);  // the sum over one rank is the input

  cg::cuda::nccl_comm moved = std::move(comm);
  CHECK(moved);
  CHECK_FALSE(comm);  // NOLINT(bugprone-use-after-move)
  moved.abort();
  CHECK_FALSE(moved);
}
}  // namespace gpu_test_cuda_basics
