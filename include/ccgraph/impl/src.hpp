// ccgraph/impl/src.hpp: the compiled part of ccgraph under separate compilation (Boost.Asio's
// model). Define CCGRAPH_SEPARATE_COMPILATION in every translation unit of the program and
// include this header in exactly one source file:
//
//   // ccgraph.cpp, compiled with -DCCGRAPH_SEPARATE_COMPILATION like the rest of the program
//   #include <ccgraph/impl/src.hpp>
//
// That unit defines the non-template functions every other unit only declares. Header-only use
// (the default, without the macro) needs none of this.
#pragma once

#include <ccgraph/core/config.hpp>

#if CCGRAPH_HEADER_ONLY
#error "<ccgraph/impl/src.hpp> compiles ccgraph's separately compiled part: define CCGRAPH_SEPARATE_COMPILATION in every unit of the program, this one included"
#endif

#include <ccgraph/ccgraph.hpp>

#include <ccgraph/core/impl/log.ipp>
#include <ccgraph/group/impl/device_mesh.ipp>
#include <ccgraph/group/impl/group.ipp>
#include <ccgraph/ir/impl/analysis.ipp>
#include <ccgraph/ir/impl/graph.ipp>
#include <ccgraph/ir/impl/node_op.ipp>
#include <ccgraph/ir/impl/print.ipp>
#include <ccgraph/ops/impl/attention.ipp>
#include <ccgraph/ops/impl/collective_ops.ipp>
#include <ccgraph/ops/impl/collectives.ipp>
#include <ccgraph/ops/impl/comm_counter.ipp>
#include <ccgraph/ops/impl/compute_ops.ipp>
#include <ccgraph/ops/impl/index_ops.ipp>
#include <ccgraph/ops/impl/normalization_ops.ipp>
#include <ccgraph/ops/impl/optimizer_ops.ipp>
#include <ccgraph/ops/impl/reduction_ops.ipp>
#include <ccgraph/ops/impl/user_op.ipp>
#include <ccgraph/runtime/impl/cpu_collectives.ipp>
#include <ccgraph/runtime/impl/executor.ipp>
#include <ccgraph/runtime/impl/preflight.ipp>
#include <ccgraph/runtime/impl/threads.ipp>
#include <ccgraph/runtime/impl/verify.ipp>
#include <ccgraph/schedule/impl/agreement.ipp>
#include <ccgraph/schedule/impl/bucketing.ipp>
#include <ccgraph/schedule/impl/cost_model.ipp>
#include <ccgraph/schedule/impl/decompose.ipp>
#include <ccgraph/schedule/impl/memory_plan.ipp>
#include <ccgraph/schedule/impl/recompute.ipp>
#include <ccgraph/schedule/impl/reorder.ipp>
#include <ccgraph/schedule/impl/rewrite.ipp>
#include <ccgraph/schedule/impl/schedule.ipp>
#include <ccgraph/schedule/impl/timeline.ipp>
#include <ccgraph/tensor/impl/any_tensor.ipp>
#include <ccgraph/trace/impl/ops.ipp>
#include <ccgraph/trace/impl/trace_state.ipp>

// The executor (runtime/executor.hpp declares it extern in the units of the program), and with
// CCGRAPH_SEPARATE_GRADIENTS every op's gradient rules (autograd/grad.hpp).
template class ccgraph::basic_executor<void>;
#if defined(CCGRAPH_SEPARATE_GRADIENTS)
#include <ccgraph/impl/gradient_rules.hpp>
#endif
