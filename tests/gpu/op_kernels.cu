// The one GPU test translation unit that compiles and installs every op's CUDA kernels
// (<ccgraph/cuda.hpp> without CCGRAPH_CUDA_NO_OP_KERNELS). tests/CMakeLists.txt defines that macro
// for every other file of ccgraph_gpu_tests, so the kernels compile once for the whole binary,
// as a user's program with several nvcc translation units does.
#include <ccgraph/cuda.hpp>
