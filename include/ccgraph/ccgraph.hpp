// ccgraph/ccgraph.hpp: everything that runs on the host: tensors, pointwise expressions, CPU
// compute, groups, the functional collectives, tracing into graphs, the graph IR and executor,
// the threads backend, and DTensor. Never includes a CUDA header; <ccgraph/cuda.hpp> adds the GPU backend.
// The rendezvous stores (tcp_store, file_store: sockets and files, which a threads program never
// needs) are <ccgraph/runtime/store.hpp>, included by <ccgraph/cuda.hpp>.
#pragma once

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/device.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/half.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/core/tensor_meta.hpp>

#include <ccgraph/tensor/from_blob.hpp>
#include <ccgraph/tensor/print.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/tensor.hpp>

#include <ccgraph/expr/expr.hpp>
#include <ccgraph/expr/functors.hpp>

#include <ccgraph/group/device_mesh.hpp>
#include <ccgraph/group/group.hpp>

#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/ops/matmul.hpp>
#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/ops/shape_ops.hpp>
#include <ccgraph/ops/user_op.hpp>

#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/tensor/any_tensor.hpp>

#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ir/node_op.hpp>
#include <ccgraph/ir/print.hpp>

#include <ccgraph/trace/ops.hpp>
#include <ccgraph/trace/symbolic.hpp>
#include <ccgraph/trace/trace.hpp>
#include <ccgraph/trace/trace_state.hpp>

#include <ccgraph/comm/communicator.hpp>
#include <ccgraph/runtime/compiled_function.hpp>
#include <ccgraph/runtime/cpu_collectives.hpp>
#include <ccgraph/runtime/executor.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/runtime/threads.hpp>
#include <ccgraph/autograd/checkpoint.hpp>
#include <ccgraph/autograd/data_parallel.hpp>
#include <ccgraph/autograd/grad.hpp>
#include <ccgraph/autograd/optim.hpp>  // templates only over headers above: no measurable cost
#include <ccgraph/schedule/schedule.hpp>

// DTensor (placements, dtensor<T>, redistribute, comm_counter): small templates over the
// collectives above, ~0.3 s of CPU on this umbrella's ~9 s (bench/compile_time.sh).
#include <ccgraph/dtensor.hpp>
// cg::dtensor<T> arguments and results of cg::compile_function (the two halves above meet).
#include <ccgraph/dist/compiled_dtensor.hpp>
