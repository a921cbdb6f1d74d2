// ccgraph/dtensor.hpp: DTensor for ccgraph: placements (shard, replicate, partial), dtensor<T>
// and its redistributions over a device mesh, and the collective counter. Include it after (or
// with) <ccgraph/ccgraph.hpp> to trace dtensors: from_local on a symbolic value needs the tracer.
#pragma once

#include <ccgraph/dtensor/dtensor.hpp>
#include <ccgraph/dtensor/placement.hpp>
#include <ccgraph/dtensor/redistribute.hpp>
#include <ccgraph/ops/comm_counter.hpp>
