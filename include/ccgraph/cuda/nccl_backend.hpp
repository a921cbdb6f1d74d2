// ccgraph/cuda/nccl_backend.hpp: moved to <ccgraph/nccl/backend.hpp>
// (the NCCL backend is a backend, above the low-level CUDA layer). This header forwards there, so existing includes keep compiling.
#pragma once

#include <ccgraph/nccl/backend.hpp>
