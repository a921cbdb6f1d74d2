// interop/dlpack.hpp and tensor/from_blob.hpp on a GPU: device memory is found by its pointer,
// exported as kDLCUDA with the device's index, imported back without a copy, and released once.
#include <ccgraph/cuda.hpp>
#include <ccgraph/interop/dlpack.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cuda_runtime.h>

#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_dlpack {

namespace cg = ccgraph;

GPU_TEST_CASE("dlpack.cuda.from_blob_finds_device_memory_by_its_pointer") {
  float* p = nullptr;
  REQUIRE(cudaMalloc(&p, 6 * sizeof(float)) == cudaSuccess);
  const std::vector<float> host{1, 2, 3, 4, 5, 6};
  REQUIRE(cudaMemcpy(p, host.data(), sizeof(float) * 6, cudaMemcpyHostToDevice) == cudaSuccess);
  int freed = 0;
  {
    auto t = cg::from_blob(p, {2, 3}, [&](float* q) {
      (void)cudaFree(q);
      ++freed;
    });
    CHECK(t.device() == cg::device::cuda(0));
    CHECK(t.to_vector() == host);
    cg::tensor<float> u = t * 2.f;  // device kernels read it in place
    CHECK(u.to_vector() == std::vector<float>{2, 4, 6, 8, 10, 12});
  }
  CHECK(freed == 1);

  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, 4 * sizeof(float)) == cudaSuccess);
  auto h = cg::from_blob(pinned, {4}, [](float* q) { (void)cudaFreeHost(q); });
  CHECK(h.device().is_cpu());  // pinned host memory is host memory
}

GPU_TEST_CASE("dlpack.cuda.export_and_import_a_device_tensor") {
  cg::device_guard on_gpu(cg::device::cuda(0));
  auto t = cg::tensor<float>::from({1, 2, 3, 4, 5, 6}, {2, 3});
  REQUIRE(t.device() == cg::device::cuda(0));
  cg::tensor<float> s = t * 3.f;  // queued on the stream: to_dlpack must finish it before handing it out
  DLManagedTensor* m = cg::to_dlpack(s.transpose(0, 1));
  CHECK(m->dl_tensor.device.device_type == kDLCUDA);
  CHECK(m->dl_tensor.device.device_id == 0);
  std::vector<float> raw(6);
  REQUIRE(cudaMemcpy(raw.data(), m->dl_tensor.data, sizeof(float) * 6, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(raw == std::vector<float>{3, 6, 9, 12, 15, 18});
  auto back = cg::from_dlpack<float>(m);
  CHECK(back.device() == cg::device::cuda(0));
  CHECK(back.to_vector() == std::vector<float>{3, 12, 6, 15, 9, 18});
}

}  // namespace gpu_test_dlpack
