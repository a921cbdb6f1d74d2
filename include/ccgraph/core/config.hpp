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

/// Header-only (the default) or separately compiled, as Boost.Asio does it. Define
/// CCGRAPH_SEPARATE_COMPILATION in every translation unit of a program, and include
/// <ccgraph/impl/src.hpp> in exactly one of them: the non-template functions of the IR, the
/// printer, the analyses, the scheduler and the executor are then compiled once there, and every
/// other unit only declares them. CCGRAPH_SEPARATE_GRADIENTS (also in every unit) adds every
/// op's gradient rules to that unit (autograd/grad.hpp).
#if defined(CCGRAPH_SEPARATE_COMPILATION)
#define CCGRAPH_HEADER_ONLY 0
#else
#define CCGRAPH_HEADER_ONLY 1
#endif

/// Declares a non-template function whose definition lives in an impl/*.ipp file: `inline` when
/// header-only, an ordinary external function when separately compiled.
#if CCGRAPH_HEADER_ONLY
#define CCGRAPH_DECL inline
#else
#define CCGRAPH_DECL
#endif
