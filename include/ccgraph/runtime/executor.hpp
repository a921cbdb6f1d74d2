// ccgraph/runtime/executor.hpp: cg::compile. Runs a (scheduled) graph on the calling rank's
// backend, as often as it is called: collectives are launched on the communication worker and
// later nodes proceed at once; wait_tensor nodes are the only synchronisation. Every node runs
// the same code as its eager counterpart. On the CPU, intermediate values live in one arena laid
// out by the memory planner (schedule/memory_plan.hpp), and compute writes into its planned
// buffers.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/ops/matmul.hpp>
#include <ccgraph/ops/shape_ops.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/schedule/memory_plan.hpp>
#include <ccgraph/schedule/timeline.hpp>
#include <ccgraph/tensor/any_tensor.hpp>
#include <ccgraph/trace/trace.hpp>

namespace ccgraph {

// input_update: schedule/memory_plan.hpp (the planner places updated results too).

/// {first_input + j, first_output + j} for j < count: parameters and optimizer state passed in
/// and returned in the same order, the layout of a traced training step.
CCGRAPH_DECL std::vector<input_update> update_inputs_range(std::size_t first_input, std::size_t first_output,
                                                     std::size_t count);

/// How a graph is compiled.
struct compile_options {
  /// Capture the graph into a CUDA Graph and replay it (nccl backend only).
  bool cuda_graph = false;
  /// Run over a memory plan (cg::plan_memory, made for the graph's order): intermediate values
  /// live at planned offsets of one arena, buffers are reused, and an all_reduce whose input
  /// dies there reduces in place. On CPU ranks the arena is reused by the next call unless a
  /// returned tensor still refers to it; on GPUs the outputs get buffers of their own (except
  /// in a CUDA Graph, which returns them from its arena), so the next call always reuses it,
  /// in stream order.
  bool memory_plan = true;
  /// With cuda_graph: return the graph's own output buffers, which the next call overwrites
  /// (no copy per call, like torch.compile's "reduce-overhead"); otherwise each call returns
  /// fresh tensors.
  bool static_outputs = false;
  /// Return a result whose wait_tensor node nothing but the graph's output reads still pending:
  /// that wait is not run (it is dropped from the compiled graph), and the caller waits at the
  /// result's first use, as eagerly, so the collective overlaps what the caller does next.
  /// Off (the default), every result comes back waited, as the graph says. A pending result's
  /// memory is the caller's: the memory plan never reuses it. In cuda_graph mode a replay's
  /// results are ordered on the rank's stream either way.
  bool pending_outputs = false;
  /// Inputs every call updates in place, as an optimizer updates its parameters and state:
  /// for each {input, output}, the graph's result `output` is written into the tensor passed
  /// as input `input` once the graph has run (after every read of the old value), and that
  /// very tensor is returned as the result. Numbers count the graph's placeholders and results
  /// (for compile_function: its tensor arguments and its flattened results); each pair's
  /// shapes and dtypes must match. In a CUDA Graph the write is part of the replay: pass the
  /// same tensors on every call and nothing else is copied. A call refuses, before running,
  /// an updated tensor whose elements share memory or that overlaps another input; with
  /// pending_outputs, a call that updates inputs waits for its results before writing.
  /// No copy where none is needed: a result that one pointwise node computes, after every
  /// other read of the input's old value, is written by that node straight into the input's
  /// tensor when the tensor passed is contiguous (memory_plan::updates_in_place; the same with
  /// memory_plan off); readers of the old value still see it, as they all ran before.
  std::vector<input_update> update_inputs{};
};

namespace detail {

/// A CUDA Graph recorded from one run of a graph, with the buffers it reads its inputs from and
/// writes its outputs to (the same addresses on every replay).
struct captured_graph {
  device dev;
  void* handle = nullptr;
  /// What the recording reads: the caller's own tensor where `bound` (read in place on every
  /// replay, so it must be passed again), else a static buffer each call's input is copied to.
  std::vector<any_tensor> inputs;
  std::vector<bool> bound;
  std::vector<any_tensor> outputs;
  std::shared_ptr<storage> arena;  // the memory plan's arena the recording uses
  captured_graph() = default;
  captured_graph(const captured_graph&) = delete;
  captured_graph& operator=(const captured_graph&) = delete;
  ~captured_graph() {
    if (handle)
      if (const device_runtime* rt = device_runtime_slot()) rt->destroy_graph(handle);
  }
};

/// A new contiguous tensor with `t`'s meta on `dev`.
CCGRAPH_DECL any_tensor empty_like(const any_tensor& t, device dev);

/// dst.copy_(src) for type-erased tensors of one dtype.
CCGRAPH_DECL void copy_any(const any_tensor& dst, const any_tensor& src);

/// The bytes of a storage a tensor's elements can touch, for overlap checks.
struct memory_span {
  const void* storage = nullptr;  // null: no elements
  std::int64_t begin = 0, end = 0;
  bool self_overlapping = false;  // a stride 0 on a dim of several elements
  bool overlaps(const memory_span& o) const {
    return storage && storage == o.storage && begin < o.end && o.begin < end;
  }
};
CCGRAPH_DECL memory_span span_of(const any_tensor& t);

/// True when each of `in` is contiguous, done and found at byte `slices[i]` of `out`'s
/// storage past `out`'s first byte: an elided cat's inputs (memory_plan::elided_cats) are then
/// its output already. Anything else (a backend that put its result elsewhere) and the cat runs.
CCGRAPH_DECL bool laid_out_in(const any_tensor& out, const std::vector<any_tensor>& in,
                              const std::vector<std::int64_t>& slices);

/// A tensor of meta `m` at byte `offset` of `arena` (contiguous).
CCGRAPH_DECL any_tensor arena_tensor(const std::shared_ptr<storage>& arena, const tensor_meta& m, std::int64_t offset);

/// The arena an executor reuses across calls, and the collectives of the last call that may
/// still touch it. Shared by copies of the executor; a call takes it out while it runs.
struct arena_cache {
  std::mutex mu;
  std::shared_ptr<storage> arena;
  std::vector<work_ptr> works;
  std::size_t allocations = 0;
};

/// Makes each result of `g` that is the output of a wait_tensor node read by nothing but the
/// output node the wait's own input, and drops those waits: what compile_options::
/// pending_outputs compiles.
CCGRAPH_DECL void return_pending(graph& g);

/// Per position of `g`'s order, for each collective: what runs between it and its first wait
/// (see collective_request::overlap); `unknown` for other nodes. Views, collectives and waits
/// launch no compute; a collective never waited counts everything after it.
CCGRAPH_DECL std::vector<overlap_hint> collective_overlaps(const graph& g);

}  // namespace detail

/// What a profiled call returns (basic_executor::run_profiled, compiled_graph::profile): the
/// call's results, and the timeline it measured, one event per node of the graph that ran
/// (basic_executor::graph_ref), on the same two tracks as the predicted one (cg::predict), in
/// microseconds from the call's start. cg::predicted_vs_measured_trace writes both into one
/// Chrome trace.
template <class R>
struct profiled {
  R result;
  timeline measured;
};

namespace detail {

/// Measures one call of an executor node by node: host clocks on a CPU rank; on a GPU rank,
/// CUDA timing events on the calling thread's stream around each node, a collective's own
/// (work::device_events) for its interval on the stream it ran on, read once they completed.
class run_profiler {
 public:
  CCGRAPH_DECL run_profiler(const graph& g, device dev);
  CCGRAPH_DECL ~run_profiler();
  run_profiler(const run_profiler&) = delete;
  run_profiler& operator=(const run_profiler&) = delete;
  /// Just before node `i` runs.
  CCGRAPH_DECL void before(std::size_t i);
  /// Just after node `i` ran; `launched`: its work when it is a collective.
  CCGRAPH_DECL void after(std::size_t i, work_ptr launched);
  /// Waits for every measured interval to be known (on a GPU, for the events to complete) and
  /// returns the measured timeline. Throws if a collective failed, or its backend did not time it.
  CCGRAPH_DECL timeline finish();

 private:
  struct mark {
    std::chrono::steady_clock::time_point host[2]{};
    void* event[2] = {nullptr, nullptr};
    work_ptr launched;
    bool ran = false;
  };
  double host_us(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - t0_).count();
  }
  const graph* g_;
  device dev_;
  const device_runtime* rt_ = nullptr;  // GPU ranks: events
  std::chrono::steady_clock::time_point t0_;
  void* base_ = nullptr;  // GPU ranks: the event the call's times count from
  std::vector<mark> marks_;
};

/// Handles of each node's NVTX range name (node_label), registered once in ccgraph's domain,
/// for an executor on `dev`; empty on a CPU rank, without a device runtime, or when no NVTX tool
/// listens (then only the first label is formatted).
CCGRAPH_DECL std::vector<void*> nvtx_names(const graph& g, device dev);

/// An open NVTX range, closed at the end of the scope (null: none).
struct nvtx_range {
  const device_runtime* rt = nullptr;
  nvtx_range(const device_runtime* r, void* name) : rt(r) {
    if (rt) rt->nvtx_push(name);
  }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;
  ~nvtx_range() {
    if (rt) rt->nvtx_pop();
  }
};

}  // namespace detail

/// A graph made runnable on one rank: an interpreter over its nodes in order, releasing each
/// value after its last reader; with a memory plan, over one arena of planned buffers. Use it as
/// `executor`: the template parameter only defers compiling its code (which visits every op and
/// instantiates their kernels) to the translation units that use it.
template <class Unused = void>
class basic_executor {
 public:
  basic_executor(graph g, rank_context& ctx, compile_options opt = {}) : g_(std::move(g)), ctx_(&ctx) {
    CCGRAPH_CHECK(!opt.cuda_graph || ctx.device().is_cuda(),
                  "compile: cuda_graph = true needs a CUDA rank (cg::cuda::run_gpus), but rank ",
                  ctx.rank(), " runs on ", ctx.device());
    if (opt.pending_outputs) detail::return_pending(g_);
    lint(g_);
    const auto& nodes = g_.nodes();
    if (opt.cuda_graph) {
      // A recorded CUDA Graph replays its kernels' arguments: a dropout would repeat its mask.
      for (const node* n : nodes)
        if (draws_random(n->kind()))
          CCGRAPH_THROW(error, "compile: node %", n->name(), " (", n->op(),
                        ") draws random numbers, which a CUDA Graph replay would repeat on every call; "
                        "compile this graph without cuda_graph");
    }
    // A graph traced for another world or rank (world_size = 8 run on 2 ranks, one MPMD part
    // run by a rank of another part) fails here, before any rank issues a collective.
    for (const auto& n : nodes)
      if (n->is_collective())
        check_group_fits(detail::concat("compile: %", n->name(), " = ", ops::name_of(*n->collective())),
                         *n->group(), ctx.rank(), ctx.world_size());
    last_use_.assign(nodes.size(), 0);
    for (std::size_t i = 0; i < nodes.size(); ++i)
      for (auto& a : nodes[i]->args()) last_use_[g_.position(a.src)] = i;
    overlaps_ = detail::collective_overlaps(g_);
    has_collectives_ = std::any_of(overlaps_.begin(), overlaps_.end(),
                                   [](detail::overlap_hint h) { return h != detail::overlap_hint::unknown; });
    inputs_ = g_.placeholders();
    updates_ = std::move(opt.update_inputs);
    check_updates();
    cuda_graph_ = opt.cuda_graph;
    static_outputs_ = opt.static_outputs;
    if (cuda_graph_) captured_ = std::make_shared<std::shared_ptr<detail::captured_graph>>();
    // A recorded CUDA Graph runs in the plan's arena, so it holds no allocation nodes.
    if (opt.memory_plan) {
      plan_ = plan_memory(g_, memory_plan_options{.update_inputs = updates_});
      cache_ = std::make_shared<detail::arena_cache>();
    }
    // Which node writes which updated input in place: the plan's decision, or (without a
    // plan) the same rule.
    write_into_.assign(nodes.size(), {});
    if (plan_) {
      for (const planned_update& u : plan_->updates_in_place)
        write_into_[u.value.position].push_back({u.value.index, u.update.input});
    } else if (const node* out = g_.output_node()) {
      const detail::liveness_info live(g_);
      const std::vector<std::size_t> sites = detail::in_place_update_sites(g_, live, updates_);
      for (std::size_t a = 0; a < sites.size(); ++a)
        if (sites[a] < nodes.size())
          write_into_[sites[a]].push_back({out->args()[updates_[a].output].index, updates_[a].input});
    }
    nvtx_ = detail::nvtx_names(g_, ctx.device());
    if (!nvtx_.empty()) nvtx_rt_ = detail::device_runtime_slot();
  }

  /// True when result `k`, which compile_options::update_inputs writes into an input, is
  /// computed straight into that input's tensor (no copy) whenever the tensor passed is
  /// contiguous; false when it is copied there after the run (or is not an updated result).
  bool update_in_place(std::size_t k) const {
    const node* out = g_.output_node();
    if (!out || k >= out->args().size() || !is_update_output(k)) return false;
    const value_ref r = out->args()[k];
    const std::size_t p = g_.position(r.src);
    if (p >= write_into_.size()) return false;
    return std::any_of(write_into_[p].begin(), write_into_[p].end(), [&](const auto& w) { return w.first == r.index; });
  }

  /// The graph being run (with compile_options::pending_outputs, without the waits of the
  /// results returned pending).
  const graph& graph_ref() const { return g_; }
  /// The memory plan the graph runs over, or null when it runs without one.
  const memory_plan* plan() const { return plan_ ? &*plan_ : nullptr; }
  /// How many arenas the calls so far allocated (a call reuses the previous call's arena when
  /// no returned tensor refers to it any more): 0 without a plan.
  std::size_t arena_allocations() const {
    if (!cache_) return 0;
    std::lock_guard lk(cache_->mu);
    return cache_->allocations;
  }

  /// True once a CUDA Graph was recorded (cuda_graph mode, after the first call).
  bool captured() const { return captured_ && *captured_; }

  /// The tensors a recorded CUDA Graph reads its inputs from (empty before the first call):
  /// the bound tensors themselves and the static buffers of copied inputs. Write a call's
  /// inputs there and pass these very tensors to skip any copy.
  std::vector<any_tensor> static_inputs() const {
    return captured() ? (*captured_)->inputs : std::vector<any_tensor>{};
  }

  /// The buffers a recorded CUDA Graph leaves its outputs in (empty before the first call):
  /// what static_outputs returns. A result the memory plan placed in the arena is read where
  /// the graph computed it; any other (a view of an input, an un-waited collective) is copied
  /// there at the end of each replay.
  std::vector<any_tensor> static_outputs() const {
    return captured() ? (*captured_)->outputs : std::vector<any_tensor>{};
  }

  /// True when output `i` of the recorded CUDA Graph is read in place from the memory plan's
  /// arena (no copy per replay); false before the first call.
  bool output_in_place(std::size_t i) const {
    return captured() && i < (*captured_)->outputs.size() && in_arena((*captured_)->outputs[i], (*captured_)->arena);
  }

  /// Runs the graph on `inputs` (one per placeholder, in order) and returns the outputs; an
  /// output that is an un-waited collective result (compile_options::pending_outputs) comes
  /// back pending.
  ///
  /// In cuda_graph mode the first call runs the graph eagerly (which creates every
  /// communicator and library handle, none of which may be created while recording) and then
  /// records it into a CUDA Graph, NCCL calls included; later calls replay it. The recording
  /// reads each input in place, bound by pointer to the tensor the first call passed (weights
  /// passed again on every call cost nothing); an input that a later call replaces by another
  /// tensor is from then on copied into a static buffer, for which the graph is recorded once
  /// more (the caller's tensors are never written, except those compile_options::update_inputs
  /// names). The compiled graph keeps bound tensors alive.
  std::vector<any_tensor> run(const std::vector<any_tensor>& inputs) const {
    CCGRAPH_CHECK(inputs.size() == inputs_.size(), "compiled graph: called with ", inputs.size(),
                  " inputs, expected ", inputs_.size());
    check_update_targets(inputs);
    if (!cuda_graph_) return write_back(inputs, interpret(inputs));
    if (!captured()) {
      auto results = write_back(inputs, interpret(inputs));
      capture(inputs, std::vector<bool>(inputs.size(), false));
      return results;
    }
    return replay(inputs);
  }

  /// Runs the graph like run() and measures what each node took: the results and the measured
  /// timeline (see profiled). On a CPU rank a node's interval is read from the host clock
  /// around it; a collective's, from when the rank's communication worker took it up to when
  /// it completed (all members done). On a GPU rank, from CUDA timing events recorded around
  /// each node on the rank's stream and around each collective on the stream it ran on; the
  /// call then waits for them (it synchronises). A wait_tensor's interval is its stall (how
  /// long compute stood waiting for the collective), shown before the wait as in the predicted
  /// timeline. The communication track shows one collective at a time: one that started
  /// before the previous one completed is shown from that completion. Refused in cuda_graph
  /// mode: a replay runs every node in one launch, which cannot be timed node by node; compile
  /// the graph once more without cuda_graph to profile it.
  profiled<std::vector<any_tensor>> run_profiled(const std::vector<any_tensor>& inputs) const {
    CCGRAPH_CHECK(!cuda_graph_, "compiled graph: profile: this graph replays a CUDA Graph (compile_options::cuda_graph), "
                                "whose nodes run in one launch and cannot be timed one by one; compile it again "
                                "without cuda_graph to measure each node");
    CCGRAPH_CHECK(inputs.size() == inputs_.size(), "compiled graph: profile: called with ", inputs.size(),
                  " inputs, expected ", inputs_.size());
    check_update_targets(inputs);
    detail::run_profiler prof(g_, ctx_->device());
    auto results = write_back(inputs, interpret_impl(inputs, nullptr, &prof));
    timeline measured = prof.finish();
    return {std::move(results), std::move(measured)};
  }

  /// The inputs each call updates in place (compile_options::update_inputs).
  const std::vector<input_update>& updated_inputs() const { return updates_; }

  /// True when input `i` of the recorded CUDA Graph is read in place from the tensor the
  /// caller passes (bound by pointer), false when it is copied into a static buffer (or before
  /// the first call).
  bool input_bound(std::size_t i) const {
    return captured() && i < (*captured_)->bound.size() && (*captured_)->bound[i];
  }

 private:
  /// The same view of the same memory.
  static bool same_tensor(const any_tensor& x, const any_tensor& y) {
    return x.index() == y.index() && ::ccgraph::detail::visit(
                                         [&](const auto& a) {
                                           using X = std::decay_t<decltype(a)>;
                                           const X& b = std::get<X>(y);
                                           return a.storage() == b.storage() &&
                                                  a.storage_offset() == b.storage_offset() &&
                                                  a.strides() == b.strides();
                                         },
                                         x);
  }

  std::vector<any_tensor> replay(const std::vector<any_tensor>& inputs) const {
    detail::captured_graph& cg = **captured_;
    // First decide, then copy: if a bound input moved, nothing is copied into this recording.
    std::vector<bool> same(inputs.size()), copied(inputs.size());
    bool moved = false;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      CCGRAPH_CHECK(meta_of(inputs[i]) == meta_of(cg.inputs[i]), "compiled graph: input ", i, " is ",
                    meta_of(inputs[i]).str(), " but the graph was recorded with ", meta_of(cg.inputs[i]).str());
      same[i] = same_tensor(inputs[i], cg.inputs[i]);
      moved = moved || (cg.bound[i] && !same[i]);
      copied[i] = !(cg.bound[i] && same[i]);
    }
    if (moved) {
      // A bound input was replaced: this call runs eagerly, and the graph is recorded again
      // with static buffers for the inputs that moved (once per input; later calls replay).
      auto results = write_back(inputs, interpret(inputs));
      detail::require_device_runtime("compiled graph", cg.dev).synchronize(cg.dev);  // the old recording goes next
      capture(inputs, copied);
      return results;
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (same[i])
        ::ccgraph::detail::visit([](const auto& x) { x.wait(); }, inputs[i]);  // a collective may still write it
      else
        detail::copy_any(cg.inputs[i], inputs[i]);
    }
    // NCCL orders the launches it makes, not a recording's replay: a recorded collective must
    // not run beside one of the same communicator launched outside it (an eager collective not
    // yet waited), so the replay waits for those first.
    if (has_collectives_) ctx_->comm().join();
    detail::require_device_runtime("compiled graph", cg.dev).replay(cg.dev, cg.handle);
    // The replay wrote each updated input's new value into what it reads the input from: a
    // static buffer holds it where the caller's tensor is not bound.
    std::vector<bool> updated(cg.outputs.size(), false);
    for (const input_update& u : updates_) {
      if (!same[u.input]) detail::copy_any(inputs[u.input], cg.inputs[u.input]);
      updated[u.output] = true;
    }
    std::vector<any_tensor> out;
    out.reserve(cg.outputs.size());
    for (std::size_t k = 0; k < cg.outputs.size(); ++k) {
      if (static_outputs_ || updated[k]) {
        out.push_back(cg.outputs[k]);
      } else {
        out.push_back(detail::empty_like(cg.outputs[k], cg.dev));
        detail::copy_any(out.back(), cg.outputs[k]);
      }
    }
    for (const input_update& u : updates_) out[u.output] = inputs[u.input];
    return out;
  }

  /// Checks compile_options::update_inputs against the graph (at compile).
  void check_updates() const {
    const node* out = g_.output_node();
    const std::size_t results = out ? out->args().size() : 0;
    for (std::size_t a = 0; a < updates_.size(); ++a) {
      const input_update& u = updates_[a];
      const std::string what =
          detail::concat("compile: update_inputs[", a, "] = {input ", u.input, ", output ", u.output, "}");
      CCGRAPH_CHECK(u.input < inputs_.size(), what, ": the graph has ", inputs_.size(), " inputs");
      CCGRAPH_CHECK(u.output < results, what, ": the graph has ", results, " results");
      const value_ref& r = out->args()[u.output];
      const tensor_meta& mo = r.src->meta(r.index);
      const tensor_meta& mi = inputs_[u.input]->meta();
      CCGRAPH_CHECK(mo == mi, what, ": the result is ", mo.str(), " but the input is ", mi.str());
      for (std::size_t b = 0; b < a; ++b) {
        CCGRAPH_CHECK(updates_[b].input != u.input, what, ": input ", u.input, " is already updated by update_inputs[",
                      b, "]");
        CCGRAPH_CHECK(updates_[b].output != u.output, what, ": result ", u.output,
                      " already updates input ", updates_[b].input);
      }
    }
  }

  /// Refuses, before anything runs, an updated input that cannot take its new value as one
  /// write: elements sharing memory, or memory shared with another input (which the write
  /// would change, or whose own update would race with it).
  void check_update_targets(const std::vector<any_tensor>& inputs) const {
    for (const input_update& u : updates_) {
      const detail::memory_span a = detail::span_of(inputs[u.input]);
      CCGRAPH_CHECK(!a.self_overlapping, "compiled graph: input ", u.input,
                    " is updated in place (compile_options::update_inputs) but its elements share memory (shape ",
                    meta_of(inputs[u.input]).str(), " with a stride 0); pass a contiguous copy");
      for (std::size_t j = 0; j < inputs.size(); ++j)
        CCGRAPH_CHECK(j == u.input || !a.overlaps(detail::span_of(inputs[j])), "compiled graph: input ", u.input,
                      " is updated in place (compile_options::update_inputs) but shares memory with input ", j,
                      "; pass a tensor of its own");
    }
  }

  /// Writes each updated input's new value (its result) into the input's tensor, which then
  /// stands for that result. Two results that would write the same memory twice, or one that
  /// reads memory another update writes, are refused before any write.
  std::vector<any_tensor> write_back(const std::vector<any_tensor>& targets, std::vector<any_tensor> results) const {
    for (const input_update& u : updates_) {
      const detail::memory_span src = detail::span_of(results[u.output]);
      for (const input_update& v : updates_)
        CCGRAPH_CHECK(v.input == u.input || !src.overlaps(detail::span_of(targets[v.input])), "compiled graph: result ",
                      u.output, ", written into input ", u.input, " (compile_options::update_inputs), is a view of input ",
                      v.input, ", which the call also updates; return a copy");
    }
    if (updates_.empty()) return results;
    // A result left pending (compile_options::pending_outputs) may be a collective still
    // reading an input this is about to overwrite: such calls wait for their results.
    for (const any_tensor& r : results) ::ccgraph::detail::visit([](const auto& x) { x.wait(); }, r);
    for (const input_update& u : updates_) {
      // Computed straight into the input (write_into_): nothing to copy.
      if (!same_tensor(results[u.output], targets[u.input])) detail::copy_any(targets[u.input], results[u.output]);
      results[u.output] = targets[u.input];
    }
    return results;
  }

  /// True when result `k` is written into an input (compile_options::update_inputs).
  bool is_update_output(std::size_t k) const {
    return std::any_of(updates_.begin(), updates_.end(), [&](const input_update& u) { return u.output == k; });
  }

  /// True when `t` is a finished result that lives in `arena` (so it need not be copied out).
  static bool in_arena(const any_tensor& t, const std::shared_ptr<detail::storage>& arena) {
    return arena && ::ccgraph::detail::visit([&](const auto& x) { return x.storage() == arena && !x.pending_work(); }, t);
  }

  /// Records one run of the graph on `inputs` into a CUDA Graph: bound by pointer, except those
  /// marked in `copied` and those that cannot be (on another device, or still pending), which
  /// the recording reads from static buffers holding a copy.
  void capture(const std::vector<any_tensor>& inputs, const std::vector<bool>& copied) const {
    auto cg = std::make_shared<detail::captured_graph>();
    cg->dev = ctx_->device();
    const detail::device_runtime& rt = detail::require_device_runtime("compile(cuda_graph)", cg->dev);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const any_tensor& t = inputs[i];
      const bool bindable = ::ccgraph::detail::visit([&](const auto& x) { return x.device() == cg->dev && !x.pending_work(); }, t);
      cg->bound.push_back(bindable && !copied[i]);
      if (cg->bound.back()) {
        cg->inputs.push_back(t);
      } else {
        cg->inputs.push_back(detail::empty_like(t, cg->dev));
        detail::copy_any(cg->inputs.back(), t);
      }
    }
    const node* out_node = g_.nodes().back();
    for (auto& a : out_node->args())
      cg->outputs.push_back(visit_any_dtype(a.src->meta(a.index).dtype, [&](auto tag) -> any_tensor {
        return tensor<decltype(tag)>::empty(a.src->meta(a.index).shape, cg->dev);
      }));
    if (plan_) cg->arena = detail::storage::allocate(cg->dev, static_cast<std::size_t>(plan_->arena_bytes));
    std::vector<std::pair<std::size_t, any_tensor>> aliased;  // outputs read from the arena
    rt.capture_begin(cg->dev);
    try {
      {
        auto results = write_back(cg->inputs, interpret(cg->inputs, cg->arena));
        // A result in the arena is its own static output: nothing later in the graph writes
        // there, and the arena lives as long as the recording. Any other result (a view of an
        // input, a pending collective, memory allocated while recording) is copied into its
        // static output, which waits for it; the run's own buffers are freed before the
        // recording ends, inside the graph.
        for (std::size_t i = 0; i < results.size(); ++i) {
          if (is_update_output(i))
            aliased.emplace_back(i, results[i]);  // the input it was written into
          else if (in_arena(results[i], cg->arena))
            aliased.emplace_back(i, results[i]);
          else
            detail::copy_any(cg->outputs[i], results[i]);
        }
      }
      ctx_->comm().join();
    } catch (...) {
      (void)rt.capture_end(cg->dev, false);
      throw;
    }
    cg->handle = rt.capture_end(cg->dev, true);
    // Only now: the buffers made for those outputs are freed here, which must not be recorded.
    for (auto& [i, t] : aliased) cg->outputs[i] = std::move(t);
    *captured_ = std::move(cg);
  }

 public:
  /// Runs the graph node by node (the interpreter; what a CUDA Graph records).
  /// `fixed_arena`: run in this arena instead of the reused one (a CUDA Graph's own). An
  /// updated result computed in place (update_in_place) is written into its tensor of `inputs`
  /// here already; run() then copies only the others.
  std::vector<any_tensor> interpret(const std::vector<any_tensor>& inputs,
                                    std::shared_ptr<detail::storage> fixed_arena = nullptr) const {
    return interpret_impl(inputs, std::move(fixed_arena), nullptr);
  }

 private:
  /// interpret(), measuring each node with `prof` when it is not null.
  std::vector<any_tensor> interpret_impl(const std::vector<any_tensor>& inputs,
                                         std::shared_ptr<detail::storage> fixed_arena,
                                         detail::run_profiler* prof) const {
    const auto& nodes = g_.nodes();
    std::shared_ptr<detail::storage> arena = plan_ ? (fixed_arena ? fixed_arena : acquire_arena()) : nullptr;
    // On a GPU a call's outputs live outside its arena (unless it is a recording's own): no
    // returned tensor then pins the arena, and the next call reuses it in stream order.
    const bool outputs_apart = plan_ && !fixed_arena && stream_ordered();
    work_ptr_list works;
    std::vector<std::vector<any_tensor>> env(nodes.size());
    std::vector<any_tensor> results;
    std::vector<any_tensor> outs;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const node* n = nodes[i];
      std::vector<any_tensor> in;
      in.reserve(n->args().size());
      for (auto& a : n->args()) in.push_back(env[g_.position(a.src)][static_cast<std::size_t>(a.index)]);
      if (std::holds_alternative<ops::output>(n->kind())) {
        if (prof) prof->before(i), prof->after(i, nullptr);
        results = std::move(in);
        break;
      }
      // Each output's memory: its planned buffer, or the input tensor an updated result is
      // computed straight into when that is one dense block here and done (every read of the
      // old value ran before: in_place_update_sites). All of a node's outputs or none: without
      // one, the node allocates its own and run() copies the updated results.
      outs.clear();
      if (plan_ || !write_into_[i].empty()) {
        for (int k = 0; k < n->num_outputs(); ++k) {
          const auto w = std::find_if(write_into_[i].begin(), write_into_[i].end(),
                                      [&](const auto& x) { return x.first == k; });
          if (w != write_into_[i].end()) {
            const any_tensor& t = inputs[w->second];
            const bool direct = ::ccgraph::detail::visit(
                [&](const auto& x) { return x.is_contiguous() && !x.pending_work() && x.device() == ctx_->device(); }, t);
            if (!direct) break;
            outs.push_back(t);
          } else if (const planned_buffer* b = plan_ ? plan_->buffer_at(i, k) : nullptr;
                     b && !(outputs_apart && b->is_output)) {
            outs.push_back(detail::arena_tensor(arena, n->meta(k), b->offset));
          } else {
            break;
          }
        }
        if (outs.size() != static_cast<std::size_t>(n->num_outputs())) outs.clear();
      }
      if (const elided_cat* c = plan_ ? plan_->elided_at(i) : nullptr;
          c && outs.size() == 1 && detail::laid_out_in(outs[0], in, c->slices)) {
        // A cat whose inputs were computed into its output's slices: nothing to copy.
        if (prof) prof->before(i), prof->after(i, nullptr);
        env[i] = outs;
      } else {
        detail::nvtx_range range(nvtx_rt_, nvtx_rt_ ? nvtx_[i] : nullptr);
        if (prof) {
          detail::work_ptr launched;
          prof->before(i);
          env[i] = run_node(*n, in, inputs, outs, overlaps_[i], true, &launched);
          prof->after(i, std::move(launched));
        } else {
          env[i] = run_node(*n, in, inputs, outs, overlaps_[i]);
        }
      }
      if (plan_ && n->is_collective() && !env[i].empty())  // a batch of sends only was waited
        ::ccgraph::detail::visit([&](const auto& t) { works.push_back(t.pending_work()); }, env[i].front());
      for (auto& a : n->args()) {
        const std::size_t p = g_.position(a.src);
        if (last_use_[p] == i) env[p].clear();
      }
    }
    if (plan_ && !fixed_arena) release_arena(std::move(arena), std::move(works));
    return results;
  }

  using work_ptr_list = std::vector<detail::work_ptr>;

  /// True when the rank's work runs in stream order (a GPU): what a call does is ordered after
  /// everything the previous call queued, so reusing its memory needs no host wait.
  bool stream_ordered() const { return ctx_->device().is_cuda(); }

  /// The previous call's arena if nothing refers to it any more (after its collectives are
  /// done: they read and write it on the communication worker), else a new one. On a GPU no
  /// returned tensor refers to it (outputs live apart), and the backend's own references to a
  /// collective's buffers end in stream order too, so it is always reused.
  std::shared_ptr<detail::storage> acquire_arena() const {
    std::shared_ptr<detail::storage> arena;
    work_ptr_list works;
    {
      std::lock_guard lk(cache_->mu);
      arena = std::move(cache_->arena);
      works = std::move(cache_->works);
      // Held only by the cache: no returned tensor refers to it, and the backend released its
      // collectives' buffers (it does so before completing them).
      if (arena && !stream_ordered() && arena.use_count() != 1) arena.reset();
    }
    if (arena) {
      try {
        for (auto& w : works)
          if (w) w->wait();  // orders the worker's accesses to the arena before ours
      } catch (...) {
        arena.reset();  // that collective's error belongs to whoever holds its result
      }
    }
    if (!arena) {
      arena = detail::storage::allocate(ctx_->device(), static_cast<std::size_t>(plan_->arena_bytes));
      std::lock_guard lk(cache_->mu);
      ++cache_->allocations;
    }
    return arena;
  }

  /// Hands the arena back for the next call, with the collectives that may still touch it.
  void release_arena(std::shared_ptr<detail::storage> arena, work_ptr_list works) const {
    std::lock_guard lk(cache_->mu);
    cache_->arena = std::move(arena);
    cache_->works = std::move(works);
  }

  /// Runs node `n` on `in`; `outs` (one per output, or empty) are its planned buffers, which
  /// its results are written into. A collective is `timed` (collective_request::timed) and
  /// its work handed out through `launched` when not null.
  std::vector<any_tensor> run_node(const node& n, const std::vector<any_tensor>& in,
                                   const std::vector<any_tensor>& inputs,
                                   const std::vector<any_tensor>& outs, detail::overlap_hint overlap,
                                   bool timed = false, detail::work_ptr* launched = nullptr) const {
    return visit_op(n.kind(), [&](const auto& o) -> std::vector<any_tensor> {
      using O = std::decay_t<decltype(o)>;
      using traits = op_traits<O>;
      if constexpr (traits::category == op_category::input) {
        const any_tensor& t = inputs[static_cast<std::size_t>(o.index)];
        CCGRAPH_CHECK(meta_of(t) == n.meta(), "compiled graph: input ", o.index, " is ", meta_of(t).str(),
                      " but the graph was traced with ", n.meta().str());
        return {t};
      } else if constexpr (traits::category == op_category::output) {
        CCGRAPH_THROW(error, "executor: the output node is not run");
      } else if constexpr (traits::category == op_category::collective) {
        // A batch of sends only has no output: its dtype is its inputs'.
        const dtype dt = n.num_outputs() > 0 ? n.dtype() : n.args().at(0).src->dtype(n.args()[0].index);
        return visit_any_dtype(dt, [&](auto tag) {
          using T = decltype(tag);
          std::vector<tensor<T>> xs, into;
          for (auto& t : in) xs.push_back(get_tensor<T>(t, O::name.data()));
          for (auto& t : outs) into.push_back(get_tensor<T>(t, O::name.data()));
          detail::work_ptr w;
          // The node's call site, so a mismatch on a compiled graph names the traced call.
          const std::source_location site = n.source();
          ::ccgraph::detail::call_site_scope scope(site, true);
          auto res = detail::launch_collective<T>(*ctx_, O::name.data(), o, *n.group(), xs,
                                                  outs.empty() ? nullptr : &into, overlap, &w, timed);
          if (launched) *launched = w;
          // No output carries its completion (a batch of sends only): waited here, as
          // batch_isend_irecv does eagerly.
          if (res.empty()) w->wait();
          return std::vector<any_tensor>(res.begin(), res.end());
        });
      } else if constexpr (traits::aliasing == alias_kind::view || traits::aliasing == alias_kind::view_or_copy) {
        ::ccgraph::detail::require_apply_view<O>();
        return ops::detail::run_view(o, run_args{in, outs, n.metas(), ctx_->device()});
      } else {
        return ::ccgraph::detail::run_op(o, run_args{in, outs, n.metas(), ctx_->device()});
      }
    });
  }

  graph g_;
  rank_context* ctx_;
  bool cuda_graph_ = false;
  bool static_outputs_ = false;
  // Shared by copies of the executor; set by the first call in cuda_graph mode.
  std::shared_ptr<std::shared_ptr<detail::captured_graph>> captured_;
  std::vector<std::size_t> last_use_;
  std::vector<detail::overlap_hint> overlaps_;  // per position: what runs beside a collective
  bool has_collectives_ = false;
  std::vector<node*> inputs_;
  std::vector<input_update> updates_;
  // Per position: (output, input) for each of its outputs written straight into an input.
  std::vector<std::vector<std::pair<int, std::size_t>>> write_into_;
  std::optional<memory_plan> plan_;
  std::shared_ptr<detail::arena_cache> cache_;
  // NVTX range names per position (detail::nvtx_names), and the runtime that pushes them: null
  // when no tool listens, so an unprofiled run pays one test per node.
  std::vector<void*> nvtx_;
  const detail::device_runtime* nvtx_rt_ = nullptr;
};

/// See basic_executor.
using executor = basic_executor<>;

// Under separate compilation the executor is compiled once, with the rest of ccgraph's compiled
// part (<ccgraph/impl/src.hpp>): it visits every op and instantiates their CPU kernels, which
// is half the compile time of a small program. Not in units nvcc compiles: theirs must hold the
// device kernels its copies launch, which only an nvcc unit has (so a CUDA program compiles its
// src.hpp unit with nvcc too, as README.md says).
#if !CCGRAPH_HEADER_ONLY && !defined(__CUDACC__)
extern template class basic_executor<void>;
#endif

namespace detail {
template <class R>
struct unflatten;
template <class T>
struct unflatten<tensor<T>> {
  static tensor<T> from(const std::vector<any_tensor>& v, std::size_t& k) {
    return get_tensor<T>(v.at(k++), "compiled graph");
  }
};
template <class... Ts>
struct unflatten<std::tuple<Ts...>> {
  static std::tuple<Ts...> from(const std::vector<any_tensor>& v, std::size_t& k) {
    return std::tuple<Ts...>{unflatten<Ts>::from(v, k)...};  // braces: left to right
  }
};
template <class T>
struct unflatten<std::vector<tensor<T>>> {
  static std::vector<tensor<T>> from(const std::vector<any_tensor>& v, std::size_t& k) {
    std::vector<tensor<T>> out;
    while (k < v.size()) out.push_back(get_tensor<T>(v[k++], "compiled graph"));
    return out;
  }
};
}  // namespace detail

/// A compiled typed graph: call it with tensors of the traced inputs' types; it returns what
/// the traced function returned, with tensors for symbolic values.
template <class R, class... Ts>
class compiled_graph {
 public:
  compiled_graph(const typed_graph<R, Ts...>& g, rank_context& ctx, compile_options opt)
      : exec_(g, ctx, opt) {}
  /// Runs the graph.
  R operator()(const tensor<Ts>&... inputs) const {
    const auto outs = exec_.run(std::vector<any_tensor>{any_tensor(inputs)...});
    std::size_t k = 0;
    return detail::unflatten<R>::from(outs, k);
  }
  /// Runs the graph and measures each node (executor::run_profiled): what the call returns,
  /// and the measured timeline.
  profiled<R> profile(const tensor<Ts>&... inputs) const {
    auto p = exec_.run_profiled(std::vector<any_tensor>{any_tensor(inputs)...});
    std::size_t k = 0;
    return {detail::unflatten<R>::from(p.result, k), std::move(p.measured)};
  }
  /// The underlying interpreter.
  const executor& exec() const { return exec_; }

 private:
  executor exec_;
};

/// Compiles a typed graph for the rank `ctx`; the result is called like the traced function.
template <class R, class... Ts>
compiled_graph<R, Ts...> compile(const typed_graph<R, Ts...>& g, rank_context& ctx, compile_options opt = {}) {
  return compiled_graph<R, Ts...>(g, ctx, opt);
}

/// Compiles an untyped graph; run it with executor::run. (A template, like basic_executor, only
/// so that it is compiled where it is used.)
template <class Unused = void>
basic_executor<Unused> compile(const graph& g, rank_context& ctx, compile_options opt = {}) {
  return basic_executor<Unused>(g, ctx, opt);
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/runtime/impl/executor.ipp>
#endif
