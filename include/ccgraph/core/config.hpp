// ccgraph/core/config.hpp: the one place that knows whether nvcc is compiling.
#pragma once

/// Marks functions callable from host and device code; empty without nvcc so that the IR,
/// tracer, scheduler and CPU backend compile with a plain C++ compiler.
#if defined(__CUDACC__)
#define CCGRAPH_HOST_DEVICE __host__ __device__
#define CCGRAPH_DEVICE __device__
#else
#define CCGRAPH_HOST_DEVICE
#define CCGRAPH_DEVICE
#endif

/// Library version (kept in step with the project version in CMakeLists.txt).
#define CCGRAPH_VERSION_MAJOR 0
#define CCGRAPH_VERSION_MINOR 1
#define CCGRAPH_VERSION_PATCH 0
