// ccgraph/dtensor.hpp: DTensor for ccgraph: placements (shard, replicate, partial), dtensor<T>
// and its redistributions over a device mesh, ops on dtensors with sharding propagation
// (dist/ops.hpp, dist/sharding.hpp), the tensor-parallel styles and parallelize_module
// (dist/parallel.hpp), FSDP's fully_shard (dist/fsdp.hpp), and the collective counter. Part of
// <ccgraph/ccgraph.hpp>; alone it serves tensors (tracing dtensors needs the tracer, which the
// umbrella brings).
#pragma once

#include <ccgraph/dist/dtensor.hpp>
#include <ccgraph/dist/placement.hpp>
#include <ccgraph/dist/redistribute.hpp>
#include <ccgraph/ops/comm_counter.hpp>
#include <ccgraph/dist/ops.hpp>
#include <ccgraph/dist/sharding.hpp>
#include <ccgraph/dist/parallel.hpp>
#include <ccgraph/dist/fsdp.hpp>
// cg::dtensor<T> as a compile_function argument and result: without it, a dtensor in
// compile_function's type list would be taken for a host value.
#include <ccgraph/dist/compiled_dtensor.hpp>
