// The host umbrella header must never pull in the CUDA runtime: users without a GPU (and CI)
// compile it with a plain C++ compiler and no CUDA toolkit on the include path.
#include <ccgraph/ccgraph.hpp>

#ifdef __CUDA_RUNTIME_H__
#error "<ccgraph/ccgraph.hpp> includes cuda_runtime.h; CUDA code belongs behind <ccgraph/cuda.hpp>"
#endif
#ifdef CUDART_VERSION
#error "<ccgraph/ccgraph.hpp> includes a CUDA runtime header; move it behind <ccgraph/cuda.hpp>"
#endif
#ifdef NCCL_H_
#error "<ccgraph/ccgraph.hpp> includes nccl.h; move it behind <ccgraph/cuda.hpp>"
#endif
#ifdef NVTX_VERSION
#error "<ccgraph/ccgraph.hpp> includes NVTX (nvtx3/nvToolsExt.h); it belongs behind <ccgraph/cuda.hpp>"
#endif
