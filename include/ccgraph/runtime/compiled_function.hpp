// ccgraph/runtime/compiled_function.hpp: a function compiled once per input signature, as
// torch.compile recompiles for new shapes. The first call with each set of input shapes traces
// the function, schedules the graph and compiles it (in CUDA Graph mode it is recorded on that
// first call and replayed afterwards); later calls with those shapes only run it. For one
// function the input shapes (its element types are fixed) determine the traced program, and so
// its cg::structural_hash: the shapes are the cache key, which needs no tracing to look up.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/runtime/executor.hpp>
#include <ccgraph/runtime/rank_context.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/tensor/tensor.hpp>
#include <ccgraph/trace/trace.hpp>

namespace ccgraph {

/// How a compiled_function schedules and runs the graph of each input signature.
struct function_options {
  /// Scheduling passes applied to each traced graph, in order (cg::schedule); none by default.
  std::vector<std::string> passes{};
  /// Their options (cost model, overlap, bucketing).
  schedule_options schedule{};
  /// How each graph runs: `.cuda_graph = true` records one CUDA Graph per signature.
  compile_options compile{};
  /// Most input signatures kept; a new one past it drops the oldest (its graph and CUDA Graph
  /// recording with it). At least 1.
  std::size_t max_signatures = 64;
};

/// `fn` (a generic callable over tensors, as for cg::trace) compiled per input signature on
/// the rank it was made for: call it with tensors of element types Ts. Made by
/// cg::compile_function; call it on that rank's thread.
template <class F, class... Ts>
class compiled_function {
  using graph_type = decltype(trace(std::declval<F&>(), input<Ts>(shape_t{})...));
  using compiled_type = compiled_graph<typename graph_type::result_type, Ts...>;

 public:
  /// What a call returns: what `fn` returns, with tensors for its values.
  using result_type = typename graph_type::result_type;

  compiled_function(F fn, rank_context& ctx, function_options opt)
      : fn_(std::move(fn)), ctx_(&ctx), opt_(std::move(opt)) {
    CCGRAPH_CHECK(opt_.max_signatures >= 1, "compile_function: max_signatures must be at least 1, got ",
                  opt_.max_signatures);
  }

  /// Runs `fn` on `inputs`: the compiled graph of their shapes, traced, scheduled and compiled
  /// first if these shapes are new. An error while doing so (a bad shape for the function, an
  /// unknown pass) is thrown here and nothing is kept, so a later call tries again.
  result_type operator()(const tensor<Ts>&... inputs) {
    std::vector<shape_t> key{inputs.shape()...};
    auto it = by_shape_.find(key);
    if (it == by_shape_.end()) it = add(std::move(key), inputs...);
    return it->second(inputs...);
  }

  /// Input signatures compiled for and kept.
  std::size_t signatures() const noexcept { return by_shape_.size(); }
  /// Calls that traced, scheduled and compiled the function (one per new signature, counting
  /// signatures dropped since).
  std::size_t traces() const noexcept { return traces_; }
  /// The compiled graph of a signature (null if not kept), e.g. to inspect its recording.
  const compiled_type* compiled_for(const std::vector<shape_t>& shapes) const {
    auto it = by_shape_.find(shapes);
    return it == by_shape_.end() ? nullptr : &it->second;
  }

 private:
  using cache = std::map<std::vector<shape_t>, compiled_type>;

  typename cache::iterator add(std::vector<shape_t> key, const tensor<Ts>&... inputs) {
    const graph_type g = schedule(trace(fn_, input<Ts>(inputs.shape())...), opt_.passes, opt_.schedule);
    compiled_type compiled(g, *ctx_, opt_.compile);
    ++traces_;
    if (by_shape_.size() >= opt_.max_signatures) {
      by_shape_.erase(order_.front());
      order_.pop_front();
    }
    order_.push_back(key);
    return by_shape_.emplace(std::move(key), std::move(compiled)).first;
  }

  F fn_;
  rank_context* ctx_;
  function_options opt_;
  cache by_shape_;
  std::deque<std::vector<shape_t>> order_;  // signatures, oldest first
  std::size_t traces_ = 0;
};

/// Compiles `fn` for the rank `ctx` per input signature; Ts are its inputs' element types:
///   auto f = cg::compile_function<float>([](auto x) { ... }, ctx, {.passes = {"overlap"}});
///   auto y = f(x);   // traced, scheduled and compiled for x's shape on the first call
template <class... Ts, class F>
compiled_function<std::decay_t<F>, Ts...> compile_function(F&& fn, rank_context& ctx, function_options opt = {}) {
  static_assert(sizeof...(Ts) > 0, "compile_function: name the inputs' element types, e.g. compile_function<float>(fn, ctx)");
  return compiled_function<std::decay_t<F>, Ts...>(std::forward<F>(fn), ctx, std::move(opt));
}

}  // namespace ccgraph
