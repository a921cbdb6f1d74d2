// ccgraph/cuda.hpp: the CUDA/NCCL entry header. Everything in <ccgraph/ccgraph.hpp> plus the
// CUDA layer; link ccgraph::cuda. Host-only code includes <ccgraph/ccgraph.hpp> instead.
#pragma once

#include <ccgraph/ccgraph.hpp>

#include <ccgraph/cuda/blas.hpp>
#include <ccgraph/cuda/block_cache.hpp>
#include <ccgraph/cuda/compat.hpp>
#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/graph.hpp>
#include <ccgraph/nccl/backend.hpp>
#include <ccgraph/cuda/nccl_comm.hpp>
#include <ccgraph/cuda/peer_channel.hpp>
#include <ccgraph/cuda/runtime.hpp>
#include <ccgraph/cuda/stream.hpp>
#include <ccgraph/cuda/stream_memops.hpp>

// The element-wise and op kernels are CUDA C++ (__global__ functions): only nvcc can compile them. A
// translation unit built by a plain C++ compiler still gets the rest of the CUDA backend; its
// device expressions then fail with an error saying to compile it with nvcc.
#if defined(__CUDACC__)
#include <ccgraph/cuda/attention.cuh>
#include <ccgraph/cuda/element.cuh>
#include <ccgraph/cuda/index.cuh>
#include <ccgraph/cuda/linear.cuh>
#include <ccgraph/cuda/loss.cuh>
#include <ccgraph/cuda/normalization.cuh>
#include <ccgraph/cuda/optimizer.cuh>
#include <ccgraph/cuda/peer_reduce.cuh>
#include <ccgraph/cuda/pointwise.cuh>
#include <ccgraph/cuda/reduction.cuh>
// Last: every op's cuda_impl is visible, so the check that none is missing runs here.
#include <ccgraph/cuda/install_ops.hpp>
#endif
