// ccgraph/comm/communicator.hpp: what a backend is given to run one collective, and the
// interface every backend (threads, nccl, the tracer's fake) implements.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include <ccgraph/core/env.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/core/timeout.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/tensor/async.hpp>
#include <ccgraph/tensor/storage.hpp>

namespace ccgraph::detail {

/// How long a backend waits for its peers by default: $CCGRAPH_TIMEOUT_MS (a positive whole
/// number of milliseconds; anything else is an error naming it) if set, else 300 s (every
/// backend's options start from this).
inline std::chrono::milliseconds default_timeout() {
  return env_milliseconds("CCGRAPH_TIMEOUT_MS", std::chrono::milliseconds(300000));
}

/// A contiguous, type-erased tensor: storage (kept alive), element offset and meta.
struct buffer {
  std::shared_ptr<storage> st;
  std::int64_t offset = 0;
  tensor_meta meta;

  /// Typed pointer to the first element.
  template <class T>
  T* data() const {
    return static_cast<T*>(st->data()) + offset;
  }
};

/// What a compiled graph's schedule runs between a collective and its first wait. The graph
/// runner sets it from the graph, so it is equal on every rank; eager calls cannot know.
enum class overlap_hint : std::uint8_t {
  unknown,  ///< an eager call: the caller may overlap anything with it
  none,     ///< only other collectives and waits: nothing can run beside it
  compute,  ///< compute, but no matmul
  matmul,   ///< a matmul
};

/// One collective as issued by one rank: the op with its attributes, the resolved group, the
/// (contiguous) inputs and the outputs the backend must fill.
struct collective_request {
  ops::collective_op op;
  group_info group;
  int rank = 0;  // the issuing (global) rank
  std::vector<buffer> inputs;
  std::vector<buffer> outputs;
  /// What runs between this collective and its wait. With `matmul` a device backend may run
  /// it on fewer SMs and make the matmul leave SMs to it; with `none` it may run it in the
  /// caller's stream order, as there is nothing for a second stream to overlap.
  overlap_hint overlap = overlap_hint::unknown;
  /// Where the user called the collective (the public call, or the traced node a compiled
  /// graph runs); line 0 when unknown. Mismatch errors name it.
  std::source_location source{};
  /// Time the collective (a profiled executor call): a host backend stamps its work
  /// (work::enable_timing), a device backend records timing events around it on the stream it
  /// runs on (work::device_events). Off: no clock is read, no event made.
  bool timed = false;

  /// The schedule overlaps a matmul with this collective.
  bool overlapped() const { return overlap == overlap_hint::matmul; }

  /// Input metas, for messages and matching.
  std::vector<tensor_meta> input_metas() const {
    std::vector<tensor_meta> m;
    for (auto& b : inputs) m.push_back(b.meta);
    return m;
  }
  /// "all_reduce(f32[4, 4], op=sum, group=[0, 1])".
  std::string describe() const { return ops::describe(op, input_metas(), group); }
};

/// A backend's per-rank endpoint. `launch` starts the collective asynchronously and returns the
/// completion its outputs are pending on; it throws at once for errors it can see at issue time
/// (a world already aborted, ranks that disagree about the collective).
class communicator {
 public:
  virtual ~communicator() = default;
  /// Starts `req`; the returned work completes when the outputs are written.
  virtual work_ptr launch(std::shared_ptr<collective_request> req) = 0;
  /// Orders the calling thread's later work after every collective launched so far (a device
  /// backend: its communication stream joins the caller's stream, as a CUDA Graph capture
  /// requires before it ends). Host backends need nothing.
  virtual void join() {}
};

}  // namespace ccgraph::detail
