// ccgraph/runtime/compiled_function.hpp: a function compiled once per program it traces to, as
// torch.compile recompiles when a guard fails. By default every call traces the function (about
// 2 us per node, no scheduling or compiling) and looks its graph up among those compiled
// before: input shapes, host arguments and every host value the function reads (split sizes,
// a broadcast's src, pointwise scalars, captured or passed) are in the graph, so a call whose
// program changed gets its own graph, never an old one's results. A hit runs the compiled graph
// (in CUDA Graph mode, replays its recording). function_guard::arguments skips the trace on a
// hit for functions that depend on their arguments alone.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/ir/analysis.hpp>
#include <ccgraph/runtime/executor.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/schedule/schedule.hpp>
#include <ccgraph/tensor/tensor.hpp>
#include <ccgraph/trace/trace.hpp>

namespace ccgraph {

/// What decides whether a call of a compiled_function can run a graph compiled before.
enum class function_guard : std::uint8_t {
  /// Trace the function on every call and reuse a graph only for the same program (equal input
  /// shapes, host arguments and every host value the function reads, captured ones included:
  /// all of them are in the traced graph). The default: never a stale graph.
  trace,
  /// The input shapes and host arguments alone are the key: a hit runs without tracing. For a
  /// function whose program depends on nothing but its arguments, which the caller promises:
  /// a captured value that changes between calls is not seen, and the old graph runs.
  arguments,
};

/// How a compiled_function schedules and runs the graph of each program.
struct function_options {
  /// Scheduling passes applied to each traced graph, in order (cg::schedule); none by default.
  std::vector<std::string> passes{};
  /// Their options (cost model, overlap, bucketing).
  schedule_options schedule{};
  /// How each graph runs: `.cuda_graph = true` records one CUDA Graph per program.
  compile_options compile{};
  /// Most programs kept; a new one past it drops the oldest (its graph and CUDA Graph
  /// recording with it). At least 1.
  std::size_t max_signatures = 64;
  /// What a call is matched with a compiled graph by (see function_guard).
  function_guard guard = function_guard::trace;
};

/// Marks an argument of a compiled function as a host value of type T (a number, split sizes)
/// rather than a tensor: compile_function<float, cg::host_arg<int>>(fn, ctx) takes
/// (tensor<float>, int). Types that are not tensor element types (std::vector<std::int64_t>,
/// std::optional<...>) are host arguments without it; a number needs it, as float or
/// std::int64_t alone name tensors.
template <class T>
struct host_arg {
  /// The argument's type.
  using type = T;
};

namespace detail {

/// The layout of a plain tensor argument or result: none (all of it is its shape, already in
/// the cache key).
struct no_layout {
  friend bool operator==(no_layout, no_layout) { return true; }
  void hash(hasher&) const {}
};

/// An argument kind of a compiled function: a tensor of element type X, a tensor with a layout
/// (a specialisation, e.g. cg::dtensor<T> in dist/compiled_dtensor.hpp), or a host value. A
/// tensor kind says what a call takes (param_type), the tensor of it the graph runs on
/// (local), what else of it the compiled graph is guarded on (layout_type, layout: checked
/// against the rank context, part of the cache key, equal by ==, hashed by hash), and what
/// the traced function is given for its symbolic local value (traced).
template <class X>
struct arg_kind {
  static constexpr bool is_tensor = false;
  using host_type = X;    // the value kept in the cache key
  using param_type = X;   // what a call takes
};
template <class X>
  requires is_element_v<X>
struct arg_kind<X> {
  static constexpr bool is_tensor = true;
  using host_type = X;  // unused: named where a host kind's is (function_types)
  using element_type = X;
  using param_type = tensor<X>;
  using layout_type = no_layout;
  static const tensor<X>& local(const tensor<X>& t) { return t; }
  static no_layout layout(const tensor<X>&, std::size_t /*index*/, const rank_context&) { return {}; }
  static const symbolic<X>& traced(const symbolic<X>& s, const no_layout&) { return s; }
};
template <class T>
struct arg_kind<host_arg<T>> {
  static constexpr bool is_tensor = false;
  using host_type = T;
  using param_type = T;
};

/// How a value the traced function returns crosses back out of a compiled function: `lower`
/// gives what the graph returns for it (symbolic values) and keeps the rest of it (its layout)
/// in `layout_type`; `lift` rebuilds it from the compiled graph's tensors and that layout. The
/// primary template passes a value through (a symbolic value or an expression: the graph
/// returns a tensor for it); tuples and vectors map their elements; dist/compiled_dtensor.hpp
/// adds traced dtensors (the local value out, placements, mesh and global shape kept).
template <class X>
struct result_boundary {
  using layout_type = no_layout;
  static X lower(const X& x, layout_type&) { return x; }
  template <class V>
  static V lift(V v, const layout_type&) {
    return v;
  }
};
template <class... Xs>
struct result_boundary<std::tuple<Xs...>> {
  using layout_type = std::tuple<typename result_boundary<Xs>::layout_type...>;
  static auto lower(const std::tuple<Xs...>& x, layout_type& l) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{result_boundary<Xs>::lower(std::get<I>(x), std::get<I>(l))...};
    }(std::index_sequence_for<Xs...>{});
  }
  template <class... Vs>
  static auto lift(std::tuple<Vs...> v, const layout_type& l) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{result_boundary<Xs>::lift(std::move(std::get<I>(v)), std::get<I>(l))...};
    }(std::index_sequence_for<Xs...>{});
  }
};
template <class X>
struct result_boundary<std::vector<X>> {
  using layout_type = std::vector<typename result_boundary<X>::layout_type>;
  static auto lower(const std::vector<X>& x, layout_type& l) {
    using E = decltype(result_boundary<X>::lower(x.front(), std::declval<typename result_boundary<X>::layout_type&>()));
    l.clear();
    std::vector<E> out;
    for (const X& e : x) out.push_back(result_boundary<X>::lower(e, l.emplace_back()));
    return out;
  }
  template <class V>
  static auto lift(std::vector<V> v, const layout_type& l) {
    using E = decltype(result_boundary<X>::lift(std::move(v.front()), std::declval<const typename result_boundary<X>::layout_type&>()));
    std::vector<E> out;
    for (std::size_t i = 0; i < v.size(); ++i) out.push_back(result_boundary<X>::lift(std::move(v[i]), l.at(i)));
    return out;
  }
};

/// What a compiled function takes for argument kind X: tensor<X> for an element type, else the
/// host value.
template <class X>
using function_param_t = typename arg_kind<X>::param_type;

/// Hashes a host argument into `h`: numbers by value (floating ones by their bits), strings,
/// and vectors, arrays, optionals, pairs and tuples of those; any other type by std::hash.
template <class T>
void hash_host(hasher& h, const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    const double d = static_cast<double>(v);
    std::int64_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    h.add(bits);
  } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
    h.add(static_cast<std::int64_t>(v));
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    h.add(std::string_view(v));
  } else if constexpr (requires { v.hash(h); }) {  // a layout (no_layout, dtensor_layout)
    v.hash(h);
  } else if constexpr (requires { v.has_value(); *v; }) {
    h.add(v.has_value());
    if (v.has_value()) hash_host(h, *v);
  } else if constexpr (requires { std::tuple_size<T>::value; }) {
    std::apply([&](const auto&... x) { (hash_host(h, x), ...); }, v);
  } else if constexpr (requires { v.begin(); v.end(); v.size(); }) {
    h.add(static_cast<std::int64_t>(v.size()));
    for (const auto& x : v) hash_host(h, x);
  } else {
    static_assert(requires { std::hash<T>{}(v); },
                  "compile_function: a host argument must be a number, a string, a container of those, or hashable by "
                  "std::hash");
    h.add(static_cast<std::int64_t>(std::hash<T>{}(v)));
  }
}

/// Equality of host arguments, floating values by their bits (so a NaN matches itself, and
/// -0.0 differs from 0.0, as a result may).
template <class T>
bool host_equal(const T& a, const T& b) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::memcmp(&a, &b, sizeof a) == 0;
  } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_convertible_v<const T&, std::string_view>) {
    return a == b;
  } else if constexpr (requires { a.has_value(); *a; }) {
    return a.has_value() == b.has_value() && (!a.has_value() || host_equal(*a, *b));
  } else if constexpr (requires { std::tuple_size<T>::value; }) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (host_equal(std::get<I>(a), std::get<I>(b)) && ...);
    }(std::make_index_sequence<std::tuple_size_v<T>>{});
  } else if constexpr (requires { a.begin(); a.size(); }) {
    if (a.size() != b.size()) return false;
    auto j = b.begin();
    for (auto i = a.begin(); i != a.end(); ++i, ++j)
      if (!host_equal(*i, *j)) return false;
    return true;
  } else {
    return a == b;
  }
}

/// Positions of the tensor arguments among kinds Xs..., and of each argument among its kind.
template <class... Xs>
struct arg_layout {
  static constexpr std::size_t count = sizeof...(Xs);
  static constexpr std::array<bool, count> is_tensor{arg_kind<Xs>::is_tensor...};
  /// Index of argument `i` among the tensors (if a tensor) or among the host values.
  static constexpr std::size_t index_in_kind(std::size_t i) {
    std::size_t k = 0;
    for (std::size_t j = 0; j < i; ++j) k += is_tensor[j] == is_tensor[i] ? 1 : 0;
    return k;
  }
};

template <class... Xs>
struct function_types;
/// The tensor argument kinds and host value types of argument kinds Xs..., in order.
template <>
struct function_types<> {
  using tensor_kinds = std::tuple<>;
  using hosts = std::tuple<>;
};
template <class X, class... Xs>
struct function_types<X, Xs...> {
  using rest = function_types<Xs...>;
  template <class A, class B>
  struct cons;
  template <class A, class... Bs>
  struct cons<A, std::tuple<Bs...>> {
    using type = std::tuple<A, Bs...>;
  };
  using tensor_kinds = std::conditional_t<arg_kind<X>::is_tensor, typename cons<X, typename rest::tensor_kinds>::type,
                                          typename rest::tensor_kinds>;
  using hosts = std::conditional_t<arg_kind<X>::is_tensor, typename rest::hosts,
                                   typename cons<std::decay_t<typename arg_kind<X>::host_type>, typename rest::hosts>::type>;
};

/// Of the tensor argument kinds Ks: their element types (the graph's inputs) and layouts.
template <class Kinds>
struct tensor_kinds_of;
template <class... Ks>
struct tensor_kinds_of<std::tuple<Ks...>> {
  using elements = std::tuple<typename arg_kind<Ks>::element_type...>;
  using layouts = std::tuple<typename arg_kind<Ks>::layout_type...>;
};

/// `fn` called with the symbolic local values of the tensor arguments (in tensor order; each
/// given to fn as its kind's `traced` makes of it with its layout) and host values (in host
/// order), interleaved back into the function's own argument order Xs...; `raw` returns what
/// fn returns.
template <class F, class Hosts, class Layouts, class... Xs>
struct raw_call {
  F* fn;
  const Hosts* hosts;
  const Layouts* layouts;

  template <class... Syms>
  auto raw(const Syms&... syms) const {
    using L = arg_layout<Xs...>;
    const auto tensors = std::forward_as_tuple(syms...);
    auto arg = [&]<std::size_t I>(std::integral_constant<std::size_t, I>) -> decltype(auto) {
      using K = std::tuple_element_t<I, std::tuple<Xs...>>;
      if constexpr (L::is_tensor[I])
        return arg_kind<K>::traced(std::get<L::index_in_kind(I)>(tensors), std::get<L::index_in_kind(I)>(*layouts));
      else
        return std::get<L::index_in_kind(I)>(*hosts);
    };
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::invoke(*fn, arg(std::integral_constant<std::size_t, I>{})...);
    }(std::make_index_sequence<L::count>{});
  }
};

/// What fn returns on the traced arguments of element types Es.
template <class Raw, class Elements>
struct raw_result;
template <class Raw, class... Es>
struct raw_result<Raw, std::tuple<Es...>> {
  using type = std::remove_cvref_t<decltype(std::declval<const Raw&>().raw(std::declval<const symbolic<Es>&>()...))>;
};

/// raw_call whose result crosses the boundary (result_boundary::lower): what the graph returns,
/// with the rest of the result (its layout) kept in `*out`.
template <class F, class Hosts, class Layouts, class Out, class... Xs>
struct interleaved_call : raw_call<F, Hosts, Layouts, Xs...> {
  Out* out;

  template <class... Syms>
  auto operator()(const Syms&... syms) const {
    auto r = this->raw(syms...);
    return result_boundary<decltype(r)>::lower(r, *out);
  }
};

/// The typed graph `Call` traces to on tensors of element types Tensors.
template <class Call, class Tensors>
struct traced_graph_of;
template <class Call, class... Ts>
struct traced_graph_of<Call, std::tuple<Ts...>> {
  using type = decltype(trace(std::declval<Call&>(), input<Ts>(shape_t{})...));
};

template <class R, class Tensors>
struct compiled_graph_for;
template <class R, class... Ts>
struct compiled_graph_for<R, std::tuple<Ts...>> {
  using type = compiled_graph<R, Ts...>;
};

}  // namespace detail

/// `fn` (a generic callable, as for cg::trace) compiled per program on the rank it was made for.
/// Xs are its arguments, in order: a tensor element type for a tensor argument, cg::dtensor<T>
/// for a dtensor one (with <ccgraph/dtensor.hpp> or the umbrella, which bring
/// dist/compiled_dtensor.hpp: fn is given a traced dtensor, and a dtensor
/// it returns comes back a cg::dtensor<T> laid out as traced), a host value type (or
/// cg::host_arg<T>) for a host one. Made by cg::compile_function; call it on that rank's thread.
template <class F, class... Xs>
class compiled_function {
  using types = detail::function_types<Xs...>;
  using hosts_type = typename types::hosts;
  using tensors_type = typename detail::tensor_kinds_of<typename types::tensor_kinds>::elements;
  using layouts_type = typename detail::tensor_kinds_of<typename types::tensor_kinds>::layouts;
  using raw_type = detail::raw_call<F, hosts_type, layouts_type, Xs...>;
  using boundary = detail::result_boundary<typename detail::raw_result<raw_type, tensors_type>::type>;
  using out_layout_type = typename boundary::layout_type;
  using call_type = detail::interleaved_call<F, hosts_type, layouts_type, out_layout_type, Xs...>;
  using graph_type = typename detail::traced_graph_of<call_type, tensors_type>::type;
  using compiled_type = typename detail::compiled_graph_for<typename graph_type::result_type, tensors_type>::type;

 public:
  /// What a call returns: what `fn` returns, with tensors for its values and cg::dtensor<T> for
  /// its dtensors.
  using result_type =
      decltype(boundary::lift(std::declval<typename graph_type::result_type>(), std::declval<const out_layout_type&>()));

  compiled_function(F fn, rank_context& ctx, function_options opt)
      : fn_(std::move(fn)), ctx_(&ctx), opt_(std::move(opt)) {
    CCGRAPH_CHECK(opt_.max_signatures >= 1, "compile_function: max_signatures must be at least 1, got ",
                  opt_.max_signatures);
  }

  /// Runs `fn` on `args`: the compiled graph of its program, traced, scheduled and compiled
  /// first if the program is new (see function_guard for what makes it new). An error while
  /// doing so (a bad shape for the function, an unknown pass) is thrown here and nothing is
  /// kept, so a later call tries again.
  result_type operator()(const detail::function_param_t<Xs>&... args) {
    const auto all = std::forward_as_tuple(args...);
    const entry& e = entry_for(all);
    return boundary::lift(run(e.compiled, all, [](const compiled_type& c, const auto&... t) { return c(t...); }), e.out);
  }

  /// Like a call, and measures each node of the graph it runs (compiled_graph::profile): the
  /// results and the measured timeline, whose events point into
  /// `compiled_for(shapes)->exec().graph_ref()`. Refused in cuda_graph mode.
  profiled<result_type> profile(const detail::function_param_t<Xs>&... args) {
    const auto all = std::forward_as_tuple(args...);
    const entry& e = entry_for(all);
    auto p = run(e.compiled, all, [](const compiled_type& c, const auto&... t) { return c.profile(t...); });
    return {boundary::lift(std::move(p.result), e.out), std::move(p.measured)};
  }

  /// Programs compiled for and kept.
  std::size_t signatures() const noexcept { return cache_.size(); }
  /// Calls that traced the function: every call under function_guard::trace, else the calls
  /// that compiled.
  std::size_t traces() const noexcept { return traces_; }
  /// Calls that scheduled and compiled a new graph (counting those dropped since).
  std::size_t compiles() const noexcept { return compiles_; }
  /// The newest compiled graph kept for these input shapes (null if none), e.g. to inspect its
  /// recording. A dtensor argument's shape here is its local shape.
  const compiled_type* compiled_for(const std::vector<shape_t>& shapes) const {
    for (auto it = cache_.rbegin(); it != cache_.rend(); ++it)
      if (it->shapes == shapes) return &it->compiled;
    return nullptr;
  }

 private:
  struct entry {
    std::uint64_t key;
    std::vector<shape_t> shapes;
    layouts_type layouts;
    hosts_type hosts;
    std::optional<graph_type> traced;  // under function_guard::trace: what a hit must equal
    out_layout_type out;               // the layout of what fn returned (dtensors' placements)
    compiled_type compiled;
  };
  using layout = detail::arg_layout<Xs...>;

  /// The compiled graph for the arguments `all`: traced, scheduled and compiled first if the
  /// program is new (see function_guard for what makes it new). The tensors' local shapes and
  /// layouts (a dtensor's mesh, placements, global shape and strides) are always in the key:
  /// a graph does not hold what a dtensor result's layout follows from.
  template <class All>
  entry& entry_for(const All& all) {
    std::vector<shape_t> shapes;
    layouts_type layouts;
    hosts_type hosts = split(all, shapes, layouts, *ctx_);
    std::optional<graph_type> traced;
    out_layout_type out{};
    detail::hasher h;
    for (const auto& s : shapes) h.add(s);
    detail::hash_host(h, layouts);
    if (opt_.guard == function_guard::trace) {
      // The graph holds every host value the program depends on: host arguments that leave it
      // unchanged need no graph of their own.
      traced.emplace(trace_with(hosts, shapes, layouts, out));
      h.add(static_cast<std::int64_t>(structural_hash(*traced)));
      detail::hash_host(h, out);
    } else {
      detail::hash_host(h, hosts);
    }
    entry* hit = find(h.h, shapes, layouts, hosts, traced ? &*traced : nullptr, out);
    if (!hit) hit = &add(h.h, std::move(shapes), std::move(layouts), std::move(hosts), std::move(traced), std::move(out));
    return *hit;
  }

  /// The host values of `all`, in host order; the tensors' (local) shapes go to `shapes` and
  /// their layouts to `layouts`, each checked against `ctx` by its kind.
  template <class All>
  static hosts_type split(const All& all, std::vector<shape_t>& shapes, layouts_type& layouts, const rank_context& ctx) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (layout::is_tensor[I]) {
              using K = detail::arg_kind<std::tuple_element_t<I, std::tuple<Xs...>>>;
              shapes.push_back(K::local(std::get<I>(all)).shape());
              std::get<layout::index_in_kind(I)>(layouts) = K::layout(std::get<I>(all), I, ctx);
            }
          }(),
          ...);
      return host_values(all, std::index_sequence<I...>{});
    }(std::make_index_sequence<layout::count>{});
  }
  template <class All, std::size_t... I>
  static hosts_type host_values(const All& all, std::index_sequence<I...>) {
    return std::tuple_cat([&] {
      if constexpr (layout::is_tensor[I]) return std::tuple<>{};
      else return std::tuple<std::decay_t<std::tuple_element_t<I, All>>>{std::get<I>(all)};
    }()...);
  }

  /// Traces fn with these host values on inputs of these shapes and layouts; the layout of
  /// what it returns goes to `out`.
  graph_type trace_with(const hosts_type& hosts, const std::vector<shape_t>& shapes, const layouts_type& layouts,
                        out_layout_type& out) {
    call_type call{{&fn_, &hosts, &layouts}, &out};
    ++traces_;
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return trace(call, input<std::tuple_element_t<I, tensors_type>>(shapes[I])...);
    }(std::make_index_sequence<std::tuple_size_v<tensors_type>>{});
  }

  entry* find(std::uint64_t key, const std::vector<shape_t>& shapes, const layouts_type& layouts,
              const hosts_type& hosts, const graph_type* traced, const out_layout_type& out) {
    for (entry& e : cache_) {
      if (e.key != key || e.shapes != shapes || !detail::host_equal(e.layouts, layouts)) continue;
      if (traced ? structurally_equal(*e.traced, *traced) && detail::host_equal(e.out, out)
                 : detail::host_equal(e.hosts, hosts))
        return &e;
    }
    return nullptr;
  }

  entry& add(std::uint64_t key, std::vector<shape_t> shapes, layouts_type layouts, hosts_type hosts,
             std::optional<graph_type> traced, out_layout_type out) {
    // The passes that change collectives agree with the other ranks through this function's
    // own rank context, whichever thread calls it.
    schedule_options so = opt_.schedule;
    if (!so.context) so.context = ctx_;
    const graph_type g = schedule(traced ? *traced : trace_with(hosts, shapes, layouts, out), opt_.passes, so);
    compiled_type compiled(g, *ctx_, opt_.compile);
    ++compiles_;
    if (cache_.size() >= opt_.max_signatures) cache_.pop_front();
    return cache_.emplace_back(entry{key, std::move(shapes), std::move(layouts), std::move(hosts), std::move(traced),
                                     std::move(out), std::move(compiled)});
  }

  /// `call(c, tensors...)` with the (local) tensors of the tensor arguments of `all`.
  template <class All, class Call>
  static auto run(const compiled_type& c, const All& all, Call call) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::apply([&](const auto&... t) { return call(c, t...); }, std::tuple_cat([&] {
        if constexpr (layout::is_tensor[I])
          return std::tie(detail::arg_kind<std::tuple_element_t<I, std::tuple<Xs...>>>::local(std::get<I>(all)));
        else
          return std::tuple<>{};
      }()...));
    }(std::make_index_sequence<layout::count>{});
  }

  F fn_;
  rank_context* ctx_;
  function_options opt_;
  std::list<entry> cache_;  // oldest first
  std::size_t traces_ = 0;
  std::size_t compiles_ = 0;
};

/// Compiles `fn` for the rank `ctx` per program; Xs are its arguments' kinds: a tensor element
/// type for a tensor, cg::dtensor<T> for a dtensor (<ccgraph/dtensor.hpp>; guarded on its
/// placements, mesh, global and local shape too), a host value type (cg::host_arg<T> for a
/// number) for a host argument:
///   auto f = cg::compile_function<float>([](auto x) { ... }, ctx, {.passes = {"overlap"}});
///   auto y = f(x);   // traced, scheduled and compiled for x's shape on the first call
///   auto moe = cg::compile_function<float, std::vector<std::int64_t>, std::vector<std::int64_t>>(
///       [&](auto x, const auto& out_splits, const auto& in_splits) {
///         return cg::all_to_all_single(x, out_splits, in_splits, g); }, ctx);
///   auto h = cg::compile_function<cg::dtensor<float>>([](auto d) { return d + d; }, ctx);
///   auto p = h(partial_x);   // a cg::dtensor<float>, Partial as traced: no collective added
template <class... Xs, class F>
compiled_function<std::decay_t<F>, Xs...> compile_function(F&& fn, rank_context& ctx, function_options opt = {}) {
  static_assert(sizeof...(Xs) > 0, "compile_function: name the arguments' types, e.g. compile_function<float>(fn, ctx)");
  static_assert((detail::arg_kind<Xs>::is_tensor || ...), "compile_function: the function needs a tensor argument");
  return compiled_function<std::decay_t<F>, Xs...>(std::forward<F>(fn), ctx, std::move(opt));
}

}  // namespace ccgraph
