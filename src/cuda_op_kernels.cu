// The one nvcc translation unit of the in-tree GPU programs that compiles and installs every
// op's CUDA kernels (<ccgraph/cuda.hpp> without CCGRAPH_CUDA_NO_OP_KERNELS; see
// cuda/install_ops.hpp). CMakeLists.txt builds it once as the object library
// ccgraph_cuda_op_kernels; the GPU tests, examples and benches link it and compile their own
// files with CCGRAPH_CUDA_NO_OP_KERNELS, as a user's program with several .cu files does,
// instead of each paying minutes of nvcc for the same kernels. It also compiles and installs
// every op's gradient rules (CCGRAPH_CUDA_GRADIENT_KERNELS): a unit that differentiates a
// program would otherwise compile them, and their pointwise kernels, again.
#define CCGRAPH_CUDA_GRADIENT_KERNELS
#include <ccgraph/cuda.hpp>
