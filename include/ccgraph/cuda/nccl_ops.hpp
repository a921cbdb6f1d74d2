// ccgraph/cuda/nccl_ops.hpp: moved to <ccgraph/nccl/ops.hpp>
// (the NCCL backend is a backend, above the low-level CUDA layer). This header forwards there, so existing includes keep compiling.
#pragma once

#include <ccgraph/nccl/ops.hpp>
