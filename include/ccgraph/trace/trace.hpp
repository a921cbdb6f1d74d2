// ccgraph/trace/trace.hpp: cg::trace runs a generic function on symbolic values and returns the
// typed graph it recorded: the same function also runs eagerly on tensors, unchanged.
#pragma once

#include <cstddef>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/trace/ops.hpp>
#include <ccgraph/trace/symbolic.hpp>
#include <ccgraph/trace/trace_state.hpp>

namespace ccgraph {

/// Describes one input of a traced function: element type, shape, and whether the caller will
/// pass a pending (async) tensor, in which case the graph starts with its wait.
template <class T>
struct input_spec {
  static_assert(is_element_v<T>, "input<T>: T must be a tensor element type");
  using value_type = T;
  shape_t shape;
  bool pending = false;
  /// The same input, passed as a pending tensor (a collective result not yet waited).
  input_spec as_pending() const { return {shape, true}; }
};

/// A traced function's input of element type T and this shape.
template <element T>
input_spec<T> input(shape_t shape) {
  return {std::move(shape), false};
}

namespace detail {

template <class X>
struct traced_result;  // maps what a traced function returns to what the compiled one returns

template <class T>
struct traced_result<symbolic<T>> {
  using type = tensor<T>;
};
template <class... Xs>
struct traced_result<std::tuple<Xs...>> {
  using type = std::tuple<typename traced_result<Xs>::type...>;
};
template <class T>
struct traced_result<std::vector<symbolic<T>>> {
  using type = std::vector<tensor<T>>;
};
template <class X>
  requires is_expression_v<X>
struct traced_result<X> {
  using type = tensor<typename X::value_type>;
};

template <class T>
auto spec_of(const input_spec<T>& s) {
  return s;
}
template <class T>
auto spec_of(const tensor<T>& t) {
  return input_spec<T>{t.shape(), t.pending_work() != nullptr && !t.pending_work()->ready()};
}

/// Collects the graph outputs of a traced result. A returned collective result is its wait's
/// output, as in PyTorch's traced graphs: the wait stays in the graph (compile_options::
/// pending_outputs is what returns such a result pending instead).
struct output_collector {
  std::vector<value_ref> refs;

  template <class T>
  void add(const symbolic<T>& s) {
    refs.push_back(s.ref());
  }
  template <class E>
    requires is_expression_v<E>
  void add(const E& e) {
    add(symbolic<typename E::value_type>(e));
  }
  template <class... Xs>
  void add(const std::tuple<Xs...>& t) {
    std::apply([&](const auto&... x) { (add(x), ...); }, t);
  }
  template <class T>
  void add(const std::vector<symbolic<T>>& v) {
    for (auto& x : v) add(x);
  }
};

}  // namespace detail

/// A graph recorded by cg::trace that remembers the traced function's signature: R is what the
/// compiled graph returns (a tensor, a std::tuple of tensors or a std::vector of tensors) and Ts
/// are the element types of its inputs. It is a cg::graph for inspection and passes.
template <class R, class... Ts>
class typed_graph : public graph {
 public:
  /// What calling the compiled graph returns.
  using result_type = R;
  /// The inputs' element types.
  using input_types = std::tuple<Ts...>;

  typed_graph() = default;
  explicit typed_graph(graph g) : graph(std::move(g)) {}
};

/// Records `fn` called with one symbolic value per input (cg::input<T>(shape), or an example
/// tensor, whose pending state is kept) and returns the typed graph. Collectives resolve their
/// groups for the rank and world of `opt` (by default the calling thread's rank context, else
/// rank 0 of a world known only through explicit rank lists); no backend is involved. What the
/// recording asked for on the whole graph runs on it last (a gradient taken inside: the
/// recompute_pointwise pass, see cg::grad_options).
template <class F, class... Inputs>
auto trace(trace_options opt, F&& fn, const Inputs&... inputs) {
  auto specs = std::make_tuple(detail::spec_of(inputs)...);
  detail::trace_state st;
  const rank_context* ctx = detail::current_rank_ptr();
  st.rank = opt.rank >= 0 ? opt.rank : (ctx ? ctx->rank() : 0);
  const int world = opt.world_size > 0 ? opt.world_size : (ctx ? ctx->world_size() : 0);
  st.registry = std::make_shared<group_registry>(world);
  if (ctx && world == ctx->world_size()) st.registry->copy_names_from(ctx->registry());
  CCGRAPH_CHECK(world <= 0 || (st.rank >= 0 && st.rank < world), "trace: rank ", st.rank,
                " is out of range for world size ", world);

  struct scope {
    detail::trace_state*& slot;
    detail::trace_state* prev;
    ~scope() { slot = prev; }
  } guard{detail::current_trace_ptr(), detail::current_trace_ptr()};
  detail::current_trace_ptr() = &st;

  auto make_arg = [&](const auto& spec) {
    using T = typename std::remove_cvref_t<decltype(spec)>::value_type;
    tensor_meta meta;  // set field by field: nvcc 13 misparses a braced dtype_v<T> here
    meta.dtype = dtype_v<T>;
    meta.shape = spec.shape;
    node* p = st.g.add_placeholder(meta, spec.pending);
    if (!spec.pending) return symbolic<T>(&st, {p, 0});
    node* w = detail::add_wait(st.g, {p, 0});
    return symbolic<T>(&st, {w, 0});
  };
  // Braced initialisation evaluates left to right: placeholders are numbered in input order.
  auto args = std::apply(
      [&](const auto&... s) {
        return std::tuple<symbolic<typename std::remove_cvref_t<decltype(s)>::value_type>...>{make_arg(s)...};
      },
      specs);
  auto result = std::apply(fn, args);
  using R = typename detail::traced_result<std::remove_cvref_t<decltype(result)>>::type;

  detail::output_collector out;
  out.add(result);
  st.g.set_output(out.refs);
  for (const auto& f : st.finish) f.second(st.g);
  return std::apply(
      [&](const auto&... s) {
        return typed_graph<R, typename std::remove_cvref_t<decltype(s)>::value_type...>(std::move(st.g));
      },
      specs);
}

/// cg::trace with default options.
template <class F, class... Inputs>
  requires(!std::is_same_v<std::remove_cvref_t<F>, trace_options>)
auto trace(F&& fn, const Inputs&... inputs) {
  return trace(trace_options{}, std::forward<F>(fn), inputs...);
}

}  // namespace ccgraph
