# Loaded by the ccgraphConfig.cmake that Conan's CMakeDeps generates (a `cmake_build_modules`
# entry of conanfile.py). CUDA and NCCL are not Conan packages: this finds them on the system,
# at consume time, and defines ccgraph::cuda (the same target ccgraph's own CMake package has)
# when both are there. Sets ccgraph_cuda_FOUND either way.
#   NCCL outside the toolkit: set NCCL_ROOT (CMake or environment variable).
if(TARGET ccgraph::cuda)
  set(ccgraph_cuda_FOUND TRUE)
  return()
endif()

set(ccgraph_cuda_FOUND FALSE)
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  list(PREPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")  # FindNCCL.cmake lies here
  find_package(NCCL QUIET)
  list(POP_FRONT CMAKE_MODULE_PATH)
endif()
if(CUDAToolkit_FOUND AND NCCL_FOUND)
  add_library(ccgraph::cuda INTERFACE IMPORTED)
  set_target_properties(ccgraph::cuda PROPERTIES
    # ${CMAKE_DL_LIBS}: NVTX (cuda/nvtx.hpp) finds a tool with dlopen, in libdl before glibc 2.34.
    INTERFACE_LINK_LIBRARIES "ccgraph::ccgraph;CUDA::cudart;CUDA::cublasLt;CUDA::cublas;NCCL::NCCL;${CMAKE_DL_LIBS}"
    INTERFACE_COMPILE_OPTIONS "$<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr;--extended-lambda>")
  set(ccgraph_cuda_FOUND TRUE)
endif()
