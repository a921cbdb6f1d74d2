// ccgraph/cuda.hpp: the CUDA/NCCL entry header. Everything in <ccgraph/ccgraph.hpp> plus the
// CUDA layer; link ccgraph::cuda. Host-only code includes <ccgraph/ccgraph.hpp> instead.
#pragma once

#include <ccgraph/ccgraph.hpp>

#include <ccgraph/cuda/compat.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/graph.hpp>
#include <ccgraph/cuda/nccl_comm.hpp>
#include <ccgraph/cuda/stream.hpp>
