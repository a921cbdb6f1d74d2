// ccgraph/trace/symbolic.hpp: symbolic<T>, what a traced function receives instead of tensors.
// It has a tensor's shape, dtype and view methods; every op on it records a graph node.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/expr/fwd.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/trace/trace_state.hpp>

namespace ccgraph {

/// A value of the graph being traced, typed by its element type. Created by cg::trace for the
/// inputs and by every op applied to symbolic values; views and ops record nodes. A symbolic
/// result of a collective is its wait_tensor node's output (the wait follows the collective),
/// returned results included.
template <class T>
class symbolic : public pointwise_operators::operand_tag {  // finds the pointwise operators
  static_assert(is_element_v<T>, "symbolic<T>: T must be a tensor element type");

 public:
  using value_type = T;

  /// Wraps output `ref` of the traced graph.
  symbolic(detail::trace_state* st, value_ref ref) : st_(st), ref_(ref) {
    CCGRAPH_CHECK(ref.src->dtype(ref.index) == dtype_v<T>, "symbolic<", dtype_v<T>, ">: value %",
                  ref.src->name(), " is ", ref.src->meta(ref.index).str());
  }
  /// Materialises a traced pointwise expression as one fused node (see trace/ops.hpp).
  template <expression E>
  symbolic(const E& e);  // NOLINT: implicit, like tensor<T>'s

  /// The graph value this stands for.
  value_ref ref() const { return ref_; }
  /// The trace this value belongs to.
  detail::trace_state* state() const { return st_; }
  /// Sizes of the dimensions.
  const shape_t& shape() const { return ref_.src->shape(ref_.index); }
  /// Size of dimension `d`.
  std::int64_t size(std::int64_t d) const { return shape()[normalize_dim(d, shape().size(), "size")]; }
  /// Number of dimensions.
  int dim() const { return static_cast<int>(shape().size()); }
  /// Number of elements.
  std::int64_t numel() const { return numel_of(shape()); }
  /// The element-type tag.
  static constexpr ccgraph::dtype dtype() { return dtype_v<T>; }

  // Views and shape ops record nodes; same names and semantics as tensor<T>'s.
  /// reshape (one size may be -1).
  symbolic reshape(shape_t s) const { return view_op<ops::reshape>("reshape", resolve_shape(std::move(s))); }
  /// view (as reshape).
  symbolic view(shape_t s) const { return reshape(std::move(s)); }
  /// flatten to 1-d.
  symbolic flatten() const { return reshape({numel()}); }
  /// narrow along `dim`.
  symbolic narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const {
    if (start < 0) start += size(dim);
    return view_op<ops::narrow>("narrow", dim, start, length);
  }
  /// chunk along `dim` (PyTorch's sizes), as narrow nodes.
  std::vector<symbolic> chunk(std::int64_t chunks, std::int64_t dim = 0) const {
    CCGRAPH_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
    const int d = normalize_dim(dim, shape().size(), "chunk");
    const std::int64_t n = shape()[static_cast<std::size_t>(d)];
    const std::int64_t step = std::max<std::int64_t>(1, (n + chunks - 1) / chunks);
    std::vector<symbolic> out;
    for (std::int64_t start = 0; start < n || (n == 0 && out.empty()); start += step)
      out.push_back(narrow(d, start, std::min(step, n - start)));
    return out;
  }
  /// select along `dim`.
  symbolic select(std::int64_t dim, std::int64_t index) const { return view_op<ops::select>("select", dim, index); }
  /// transpose two dims. The transpose of a transpose of the same two dims is its source: no
  /// view that undoes another is recorded, so passes see the producer itself (a weight's
  /// gradient comes out of matmul's rule transposed and its transpose's rule turns it back:
  /// decompose_matmul_collectives then finds the matmul right under the gradient's all_reduce).
  symbolic transpose(std::int64_t d0, std::int64_t d1) const {
    if (const auto* t = std::get_if<ops::transpose>(&ref_.src->kind())) {
      const std::size_t r = shape().size();
      const int a0 = normalize_dim(d0, r, "transpose"), a1 = normalize_dim(d1, r, "transpose");
      const int b0 = normalize_dim(t->dim0, r, "transpose"), b1 = normalize_dim(t->dim1, r, "transpose");
      if (std::min(a0, a1) == std::min(b0, b1) && std::max(a0, a1) == std::max(b0, b1))
        return symbolic(st_, ref_.src->args().front());
    }
    return view_op<ops::transpose>("transpose", d0, d1);
  }
  /// permute dims.
  symbolic permute(const std::vector<std::int64_t>& dims) const { return view_op<ops::permute>("permute", dims); }
  /// unsqueeze at `dim`.
  symbolic unsqueeze(std::int64_t dim) const { return view_op<ops::unsqueeze>("unsqueeze", dim); }
  /// contiguous.
  symbolic contiguous() const { return view_op<ops::contiguous>("contiguous"); }
  /// repeat.
  symbolic repeat(const std::vector<std::int64_t>& times) const { return view_op<ops::repeat>("repeat", times); }
  /// This value converted to element type U: a pointwise node (tensor::to<U>()'s conversion).
  template <class U>
  symbolic<U> to() const;  // defined in trace/ops.hpp

 private:
  /// Records op Op{args...} on this value. The op is built as a named variable: nvcc's front
  /// end drops the type of `ops::transpose{d0, d1}` passed straight to a node_op parameter
  /// inside this class (whose members share the ops' names), and the build fails.
  template <class Op, class... A>
  symbolic view_op(std::string_view hint, A&&... args) const {
    Op op{std::forward<A>(args)...};
    return unary(node_op(std::move(op)), hint);
  }
  symbolic unary(node_op&& op, std::string_view hint) const {
    return symbolic(st_, {st_->g.add(std::move(op), {ref_}, {}, hint), 0});
  }
  shape_t resolve_shape(shape_t s) const {
    // Resolve -1 now so the recorded attribute is the real shape.
    std::int64_t known = 1;
    int infer = -1;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] == -1) {
        CCGRAPH_CHECK(infer < 0, "reshape: only one dimension can be -1 in ", shape_str(s));
        infer = static_cast<int>(i);
      } else {
        known *= s[i];
      }
    }
    if (infer >= 0 && known != 0 && numel() % known == 0) s[static_cast<std::size_t>(infer)] = numel() / known;
    return s;
  }

  detail::trace_state* st_;
  value_ref ref_;
};

template <class T>
inline constexpr bool is_symbolic_v<symbolic<T>> = true;

/// Any symbolic<T>.
template <class X>
concept symbolic_type = is_symbolic_v<std::remove_cvref_t<X>>;

/// The indices of `xs` in the order their traced graph computes them (by producing node, a
/// stable sort: equal producers keep their order); for tensors, 0, 1, ... Per-value work
/// issued in this order (the gradients' all_reduces, the optimizer's updates) can start as
/// each value is ready: the schedule passes keep collectives in program order, and sink_waits
/// puts a node reading a collective's result no earlier than where the program has it.
template <class V>
std::vector<std::size_t> production_order(const std::vector<V>& xs) {
  std::vector<std::size_t> order(xs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  if constexpr (is_symbolic_v<V>) {
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const auto& g = xs[a].state()->g;
      return g.position(xs[a].ref().src) < g.position(xs[b].ref().src);
    });
  }
  return order;
}

namespace detail {

/// The expression leaf of a symbolic operand: the value, by value (it is a small handle).
template <element T>
struct symbolic_leaf {
  using value_type = T;
  symbolic<T> value;
  const shape_t& shape() const { return value.shape(); }
};

template <class T>
struct leaf_type_of<symbolic<T>> {
  using type = symbolic_leaf<T>;
};

}  // namespace detail

template <class T>
inline constexpr bool is_symbolic_leaf_v<detail::symbolic_leaf<T>> = true;

namespace detail {
/// Records op `o` on traced inputs and returns its outputs (their metas, and errors, from
/// op_traits<O>::infer).
template <class O>
std::vector<value_ref> record_op_erased(const O& o, trace_state* st, const std::vector<value_ref>& args) {
  CCGRAPH_CHECK(st != nullptr, O::name, ": a symbolic value used outside of cg::trace");
  // A user op's nodes are named after it ("mylib::swiglu" gives %swiglu).
  std::string_view hint = O::name;
  if constexpr (std::is_same_v<O, ops::user>) hint = std::string_view(o.op).substr(std::string_view(o.op).rfind(':') + 1);
  node* n = st->g.add(node_op(o), args, {}, hint);  // a dependent temporary: no variant code here
  std::vector<value_ref> outs;
  for (int k = 0; k < n->num_outputs(); ++k) outs.push_back({n, k});
  return outs;
}

/// An op on traced values: records its node (whose metas, and errors, come from
/// op_traits<O>::infer).
template <class T>
struct op_apply<symbolic<T>> {
  template <class O, class... Ts>
  static symbolic<T> apply(const O& o, const symbolic<T>& x, const Ts&... xs) {
    trace_state* st = x.state();
    node* n = st->g.add(node_op(o), {x.ref(), xs.ref()...}, {}, O::name);
    return symbolic<T>(st, {n, 0});
  }
  /// apply_op_n (ops/op_traits.hpp) on traced values: records one node with the outputs Rs....
  template <class... Rs, class O, class... Ts>
  static std::tuple<symbolic<Rs>...> apply_n(const O& o, const symbolic<T>& x0, const symbolic<Ts>&... xs) {
    const std::vector<value_ref> outs = record_op_erased(o, x0.state(), {x0.ref(), xs.ref()...});
    CCGRAPH_CHECK(outs.size() == sizeof...(Rs), O::name, ": expected ", sizeof...(Rs), " outputs, the op gave ",
                  outs.size());
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<symbolic<Rs>...>{symbolic<Rs>(x0.state(), outs[I])...};
    }(std::index_sequence_for<Rs...>{});
  }
  /// apply_op_list on traced values.
  template <class R, class O>
  static std::vector<symbolic<R>> apply_list(const O& o, const std::vector<symbolic<T>>& xs) {
    CCGRAPH_CHECK(!xs.empty(), O::name, ": expected a non-empty list of tensors");
    std::vector<value_ref> args;
    args.reserve(xs.size());
    for (const auto& x : xs) args.push_back(x.ref());
    std::vector<symbolic<R>> r;
    for (const auto& v : record_op_erased(o, xs[0].state(), args)) r.emplace_back(xs[0].state(), v);
    return r;
  }
};
}  // namespace detail

}  // namespace ccgraph
