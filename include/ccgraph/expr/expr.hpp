// ccgraph/expr/expr.hpp: lazy pointwise expression trees. Building one does no work beyond
// checking shapes; evaluating one runs every op of the tree in a single loop over the output,
// with no intermediate tensors. The tree's type carries its structure (ops, leaves, depth, dtype)
// at compile time, so the tracer, the cost model and the CUDA code generator can read it.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/expr/functors.hpp>
#include <ccgraph/expr/fwd.hpp>
#include <ccgraph/tensor/kernel_tree.hpp>
#include <ccgraph/tensor/philox.hpp>
#include <ccgraph/tensor/random.hpp>
#include <ccgraph/tensor/strided.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

template <pointwise_op Op, class... Args>
class pointwise_expr;

// ---------------------------------------------------------------------------------------------
// Operands
// ---------------------------------------------------------------------------------------------

namespace detail {
/// True for operand types that become a leaf through the detail::leaf_type_of customisation
/// point (the tracer's symbolic values).
template <class X>
inline constexpr bool has_leaf_type_v = requires { typename leaf_type_of<std::remove_cvref_t<X>>::type; };
}  // namespace detail

/// True for what pointwise math takes as a tensor operand: a tensor<T>, a lazy expression, or a
/// value with a detail::leaf_type_of (a symbolic value while tracing).
template <class X>
inline constexpr bool is_pointwise_operand_v =
    is_tensor_v<std::remove_cvref_t<X>> || is_expression_v<X> || detail::has_leaf_type_v<X>;

/// A tensor<T>, a lazy pointwise expression, or a symbolic value.
template <class X>
concept pointwise_operand = is_pointwise_operand_v<X>;

/// True for plain numbers that pointwise math broadcasts against tensors: arithmetic types, bf16
/// and f16. A scalar of another type than the tensor's is converted, as in PyTorch's `a * 2.0`.
template <class X>
inline constexpr bool is_scalar_operand_v =
    std::is_arithmetic_v<std::remove_cvref_t<X>> || std::is_same_v<std::remove_cvref_t<X>, bf16> ||
    std::is_same_v<std::remove_cvref_t<X>, f16>;

/// An arithmetic scalar, bf16 or f16.
template <class X>
concept scalar_operand = is_scalar_operand_v<X>;

/// True when L and R can be the two operands of a pointwise operator: at least one of them is a
/// tensor or expression and the other is one too or a scalar. The element types are checked
/// afterwards, so that mixing them is a readable static_assert instead of a missing overload.
template <class L, class R>
inline constexpr bool is_pointwise_operand_pair_v =
    (is_pointwise_operand_v<L> && (is_pointwise_operand_v<R> || is_scalar_operand_v<R>)) ||
    (is_scalar_operand_v<L> && is_pointwise_operand_v<R>);

/// Two operands of a pointwise operator (see is_pointwise_operand_pair_v).
template <class L, class R>
concept pointwise_operand_pair = is_pointwise_operand_pair_v<L, R>;

namespace detail {
template <class X>
struct value_type_of {
  using type = std::remove_cvref_t<X>;  // scalars
};
template <class X>
  requires pointwise_operand<X>
struct value_type_of<X> {
  using type = typename std::remove_cvref_t<X>::value_type;
};
}  // namespace detail

/// The element type of a tensor or expression (a scalar's own type for scalars).
template <class X>
using value_type_t = typename detail::value_type_of<X>::type;

/// True unless L and R are both tensors/expressions with different element types: the rule
/// behind every "mixing dtypes" static_assert (a scalar mixes with anything).
template <class L, class R>
inline constexpr bool is_same_dtype_v = !(is_pointwise_operand_v<L> && is_pointwise_operand_v<R>) ||
                                        std::is_same_v<value_type_t<L>, value_type_t<R>>;

// ---------------------------------------------------------------------------------------------
// Leaves
// ---------------------------------------------------------------------------------------------

namespace detail {

/// A tensor operand, held by value: tensors are shared handles, so `auto e = a + b;` never
/// dangles, and a pending tensor is waited on only when the expression is evaluated.
template <element T>
struct tensor_leaf {
  using value_type = T;
  tensor<T> value;
  const shape_t& shape() const { return value.shape(); }
};

/// A scalar operand of an expression of element type T; broadcasts as shape []. Its value is
/// kept in compute_t<T> (float for bf16/f16), the type the ops compute in, so a bf16 expression
/// `v * 0.999` multiplies by 0.999f and rounds once, as PyTorch's ops take their scalars in
/// opmath; rounding the scalar to bf16 first would make it 1 (and 1 - 0.999 zero).
template <element T>
struct scalar_leaf {
  using value_type = T;
  /// The type the value is held and read in.
  using stored_type = compute_t<T>;
  stored_type value;
  const shape_t& shape() const {
    static const shape_t scalar_shape;
    return scalar_shape;
  }
};

/// A random operand: the values of distribution `Dist` (tensor/philox.hpp) over its own shape,
/// broadcast like a tensor. Eagerly its draw is reserved from the generator when the leaf is
/// made, so evaluating the expression twice gives the same values; in a traced expression each
/// run of the graph reserves a new draw from `gen` (or, without one, from the default generator
/// of the thread that runs it). `id` tells two draws apart in a trace's memo.
template <class Dist>
struct random_leaf {
  using value_type = typename Dist::value_type;
  Dist dist;
  shape_t shape_;
  philox_stream at;
  std::optional<generator> gen;
  std::uint64_t id = 0;
  const shape_t& shape() const { return shape_; }
  /// True when the values depend on the draws (not a constant mask).
  bool draws() const { return dist_draws(dist); }
};

/// A process-wide serial number for random leaves.
inline std::uint64_t next_random_id() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

template <class X>
inline constexpr bool is_random_leaf_v = false;
template <class D>
inline constexpr bool is_random_leaf_v<random_leaf<D>> = true;

template <class X>
inline constexpr bool is_tensor_leaf_v = false;
template <class T>
inline constexpr bool is_tensor_leaf_v<tensor_leaf<T>> = true;

template <class X>
inline constexpr bool is_scalar_leaf_v = false;
template <class T>
inline constexpr bool is_scalar_leaf_v<scalar_leaf<T>> = true;

/// The element type a leaf or node yields in a kernel tree: a scalar leaf's stored_type (its
/// compute type), else its value_type.
template <class X>
struct kernel_value {
  using type = typename X::value_type;
};
template <class T>
struct kernel_value<scalar_leaf<T>> {
  using type = typename scalar_leaf<T>::stored_type;
};

template <class X>
inline constexpr bool is_node_v = false;
template <class Op, class... Args>
inline constexpr bool is_node_v<pointwise_expr<Op, Args...>> = true;

// ---- compile-time structure; tensor<T> counts as a single leaf ----

template <class X>
struct structure {  // leaves; symbolic leaves count as tensor operands
  static constexpr std::size_t tensor_leaves =
      is_tensor_leaf_v<X> || is_tensor_v<X> || is_symbolic_leaf_v<X> || is_symbolic_v<X> ? 1 : 0;
  static constexpr std::size_t scalar_leaves = is_scalar_leaf_v<X> ? 1 : 0;
  static constexpr std::size_t random_leaves = is_random_leaf_v<X> ? 1 : 0;
  /// Leaves that take an operand index (kernel_tree.hpp): tensors and random operands.
  static constexpr std::size_t indexed_leaves = tensor_leaves + random_leaves;
  static constexpr std::size_t ops = 0;
  static constexpr std::size_t depth = 0;
  template <class Tag>
  static constexpr std::size_t count = 0;
  static constexpr std::array<std::string_view, 0> op_names{};
};

template <class V, std::size_t... Ns>
constexpr auto concat_arrays(const std::array<V, Ns>&... arrays) {
  std::array<V, (Ns + ... + 0)> out{};
  std::size_t i = 0;
  auto put = [&](const auto& a) {
    for (const auto& x : a) out[i++] = x;
  };
  (put(arrays), ...);
  return out;
}

template <class Op, class... Args>
struct structure<pointwise_expr<Op, Args...>> {
  static constexpr std::size_t tensor_leaves = (structure<Args>::tensor_leaves + ...);
  static constexpr std::size_t scalar_leaves = (structure<Args>::scalar_leaves + ...);
  static constexpr std::size_t random_leaves = (structure<Args>::random_leaves + ...);
  static constexpr std::size_t indexed_leaves = tensor_leaves + random_leaves;
  static constexpr std::size_t ops = 1 + (structure<Args>::ops + ...);
  static constexpr std::size_t depth = 1 + std::max({structure<Args>::depth...});
  template <class Tag>
  static constexpr std::size_t count =
      (std::is_same_v<Op, Tag> ? 1 : 0) + (structure<Args>::template count<Tag> + ...);
  // Evaluation order: operands left to right, then the node itself (post-order).
  static constexpr auto op_names =
      concat_arrays(structure<Args>::op_names..., std::array<std::string_view, 1>{Op::name});
};

template <std::size_t N>
constexpr std::size_t count_distinct(const std::array<std::string_view, N>& a) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < N; ++i) {
    bool seen = false;
    for (std::size_t j = 0; j < i; ++j) seen = seen || a[j] == a[i];
    n += seen ? 0 : 1;
  }
  return n;
}

template <class E>
struct distinct_op_names {
  static constexpr auto all = structure<E>::op_names;
  static constexpr std::size_t size = count_distinct(all);
  static constexpr std::array<std::string_view, size> value = [] {
    std::array<std::string_view, size> out{};
    std::size_t n = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
      bool seen = false;
      for (std::size_t j = 0; j < n; ++j) seen = seen || out[j] == all[i];
      if (!seen) out[n++] = all[i];
    }
    return out;
  }();
};

template <class E>
struct fused_name {
  static constexpr auto names = distinct_op_names<E>::value;
  static constexpr std::size_t length = [] {
    std::size_t n = 5;  // "fused"
    for (auto s : names) n += 1 + s.size();
    return n;
  }();
  static constexpr std::array<char, length + 1> chars = [] {
    std::array<char, length + 1> out{};
    std::size_t i = 0;
    for (char c : std::string_view("fused")) out[i++] = c;
    for (auto s : names) {
      out[i++] = '_';
      for (char c : s) out[i++] = c;
    }
    return out;
  }();
  static constexpr std::string_view value{chars.data(), length};
};

}  // namespace detail

/// Number of nodes of op `Tag` (e.g. ops::add) in expression type E, at compile time.
template <class E, class Tag>
inline constexpr std::size_t count_ops_v = detail::structure<std::remove_cvref_t<E>>::template count<Tag>;

/// Number of op nodes in expression type E (0 for a tensor).
template <class E>
inline constexpr std::size_t op_count_v = detail::structure<std::remove_cvref_t<E>>::ops;

/// Number of tensor operands (leaves, tensor or symbolic) of expression type E; a tensor used
/// twice counts twice.
template <class E>
inline constexpr std::size_t leaf_count_v = detail::structure<std::remove_cvref_t<E>>::tensor_leaves;

/// Number of scalar operands of expression type E.
template <class E>
inline constexpr std::size_t scalar_count_v = detail::structure<std::remove_cvref_t<E>>::scalar_leaves;

/// Number of random operands (dropout masks) of expression type E.
template <class E>
inline constexpr std::size_t random_count_v = detail::structure<std::remove_cvref_t<E>>::random_leaves;

/// Longest chain of op nodes from the root to a leaf (0 for a tensor, 1 for `relu(a)`).
template <class E>
inline constexpr std::size_t expression_depth_v = detail::structure<std::remove_cvref_t<E>>::depth;

/// Names of every op node of E in evaluation order (operands first), duplicates kept.
template <class E>
inline constexpr auto all_op_names_v = detail::structure<std::remove_cvref_t<E>>::op_names;

/// The distinct op names of E in evaluation order: {"relu", "mul", "add"} for `relu(a) * b + c`.
template <class E>
inline constexpr auto op_names_v = detail::distinct_op_names<std::remove_cvref_t<E>>::value;

/// The name a traced chain gets as one fused pointwise node: "fused_relu_mul_add".
template <class E>
inline constexpr std::string_view fused_name_v = detail::fused_name<std::remove_cvref_t<E>>::value;

// ---------------------------------------------------------------------------------------------
// Evaluation
// ---------------------------------------------------------------------------------------------

namespace detail {

// Kernel trees (tensor/kernel_tree.hpp): the leaves are tensor_kernel and scalar_kernel; an op
// node holds its operands' trees.

/// Op applied element by element to packs (kernel_tree.hpp): the pack form of a tree node.
template <class Op, class A, int V>
CCGRAPH_HOST_DEVICE auto apply_pack(const elem_pack<A, V>& x) {
  elem_pack<decltype(Op::apply(x.v[0])), V> r;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < V; ++j) r.v[j] = Op::apply(x.v[j]);
  return r;
}
template <class Op, class A, class B, int V>
CCGRAPH_HOST_DEVICE auto apply_pack(const elem_pack<A, V>& x, const elem_pack<B, V>& y) {
  elem_pack<decltype(Op::apply(x.v[0], y.v[0])), V> r;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < V; ++j) r.v[j] = Op::apply(x.v[j], y.v[j]);
  return r;
}

template <class Op, class A, class B, class C, int V>
CCGRAPH_HOST_DEVICE auto apply_pack(const elem_pack<A, V>& x, const elem_pack<B, V>& y, const elem_pack<C, V>& z) {
  elem_pack<decltype(Op::apply(x.v[0], y.v[0], z.v[0])), V> r;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < V; ++j) r.v[j] = Op::apply(x.v[j], y.v[j], z.v[j]);
  return r;
}

template <class Op, class... Ks>
struct node_kernel;

/// Kernel node of a unary op.
template <class Op, class K0>
struct node_kernel<Op, K0> {
  K0 a;
  CCGRAPH_HOST_DEVICE auto load(const std::int64_t* o, std::int64_t i) const { return Op::apply(a.load(o, i)); }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE auto load_pack(std::int64_t i) const { return apply_pack<Op>(a.template load_pack<V, Vec>(i)); }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE auto load_pack_off(const std::int64_t* o) const {
    return apply_pack<Op>(a.template load_pack_off<V, Vec>(o));
  }
  CCGRAPH_HOST_DEVICE bool aligned16() const { return a.aligned16(); }
};

/// Kernel node of a binary op.
template <class Op, class K0, class K1>
struct node_kernel<Op, K0, K1> {
  K0 a;
  K1 b;
  CCGRAPH_HOST_DEVICE auto load(const std::int64_t* o, std::int64_t i) const {
    return Op::apply(a.load(o, i), b.load(o, i));
  }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE auto load_pack(std::int64_t i) const {
    return apply_pack<Op>(a.template load_pack<V, Vec>(i), b.template load_pack<V, Vec>(i));
  }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE auto load_pack_off(const std::int64_t* o) const {
    return apply_pack<Op>(a.template load_pack_off<V, Vec>(o), b.template load_pack_off<V, Vec>(o));
  }
  CCGRAPH_HOST_DEVICE bool aligned16() const { return a.aligned16() && b.aligned16(); }
};

/// Kernel node of a ternary op (where, clamp, dropout).
template <class Op, class K0, class K1, class K2>
struct node_kernel<Op, K0, K1, K2> {
  K0 a;
  K1 b;
  K2 c;
  CCGRAPH_HOST_DEVICE auto load(const std::int64_t* o, std::int64_t i) const {
    return Op::apply(a.load(o, i), b.load(o, i), c.load(o, i));
  }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE auto load_pack(std::int64_t i) const {
    return apply_pack<Op>(a.template load_pack<V, Vec>(i), b.template load_pack<V, Vec>(i),
                          c.template load_pack<V, Vec>(i));
  }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE auto load_pack_off(const std::int64_t* o) const {
    return apply_pack<Op>(a.template load_pack_off<V, Vec>(o), b.template load_pack_off<V, Vec>(o),
                          c.template load_pack_off<V, Vec>(o));
  }
  CCGRAPH_HOST_DEVICE bool aligned16() const { return a.aligned16() && b.aligned16() && c.aligned16(); }
};

/// Builds the kernel tree of `x`, numbering its indexed leaves (tensors, random operands) from
/// I in visiting order. Reading a leaf's pointer through tensor::data() waits for it if it is
/// pending.
template <std::size_t I, class X>
auto make_kernel(const X& x) {
  if constexpr (is_tensor_leaf_v<X>) {
    return tensor_kernel<typename X::value_type, I>{x.value.data()};
  } else if constexpr (is_scalar_leaf_v<X>) {
    return scalar_kernel<typename X::stored_type>{x.value};
  } else if constexpr (is_random_leaf_v<X>) {
    return random_kernel<decltype(x.dist), I>{x.dist, x.at};
  } else {
    using op = typename X::op_type;
    const auto& args = x.args();
    using args_t = std::remove_cvref_t<decltype(args)>;
    // A node yields its own element type: an op whose operands are all scalars in compute_t<T>
    // (where(c, 0.5, 1.0) of bf16) computes in float, so its result is rounded to T here, as
    // the traced paths round every node's.
    auto as_node = [](auto k) {
      using R = decltype(k.load(static_cast<const std::int64_t*>(nullptr), 0));
      if constexpr (std::is_same_v<R, typename X::value_type>)
        return k;
      else
        return cast_kernel<typename X::value_type, decltype(k)>{k};
    };
    auto a = make_kernel<I>(std::get<0>(args));
    if constexpr (op::arity == 1) {
      return as_node(node_kernel<op, decltype(a)>{a});
    } else {
      constexpr std::size_t i1 = I + structure<std::tuple_element_t<0, args_t>>::indexed_leaves;
      auto b = make_kernel<i1>(std::get<1>(args));
      if constexpr (op::arity == 2) {
        return as_node(node_kernel<op, decltype(a), decltype(b)>{a, b});
      } else {
        auto c = make_kernel<i1 + structure<std::tuple_element_t<1, args_t>>::indexed_leaves>(std::get<2>(args));
        return as_node(node_kernel<op, decltype(a), decltype(b), decltype(c)>{a, b, c});
      }
    }
  }
}

/// Calls `f(leaf)` for every leaf of `x` (tensor_leaf, scalar_leaf, random_leaf or a symbolic
/// leaf) in the order make_kernel numbers them: what the tracer reads an expression's inputs with.
template <class X, class F>
void visit_leaves(const X& x, F&& f) {
  if constexpr (is_node_v<X>)
    std::apply([&](const auto&... a) { (visit_leaves(a, f), ...); }, x.args());
  else
    f(x);
}

/// A copy of expression `x` whose tensor leaves are `leaves[I]`, `leaves[I+1]`, ... in visiting
/// order: how an executor re-runs a recorded expression on new buffers. Shapes are re-checked.
template <std::size_t I = 0, class X, class T>
X rebind_leaves(const X& x, const std::vector<tensor<T>>& leaves) {
  if constexpr (is_tensor_leaf_v<X>) {
    static_assert(std::is_same_v<typename X::value_type, T>,
                  "rebind_leaves: the expression has tensor operands of another element type");
    CCGRAPH_CHECK(I < leaves.size(), "rebind_leaves: expression needs more than ", leaves.size(),
                  " tensors");
    return X{leaves[I]};
  } else if constexpr (is_scalar_leaf_v<X> || is_random_leaf_v<X>) {
    return x;
  } else {
    using args_t = std::remove_cvref_t<decltype(x.args())>;
    constexpr std::size_t i1 = I + structure<std::tuple_element_t<0, args_t>>::tensor_leaves;
    if constexpr (X::op_type::arity == 1) {
      return X(rebind_leaves<I>(std::get<0>(x.args()), leaves));
    } else if constexpr (X::op_type::arity == 2) {
      return X(rebind_leaves<I>(std::get<0>(x.args()), leaves), rebind_leaves<i1>(std::get<1>(x.args()), leaves));
    } else {
      constexpr std::size_t i2 = i1 + structure<std::tuple_element_t<1, args_t>>::tensor_leaves;
      return X(rebind_leaves<I>(std::get<0>(x.args()), leaves), rebind_leaves<i1>(std::get<1>(x.args()), leaves),
               rebind_leaves<i2>(std::get<2>(x.args()), leaves));
    }
  }
}

/// out[i] = k(offsets, i) for i in [0, n): the loop over contiguous runs (the whole tensor, or
/// one row). Blocks of a fixed size go through a local buffer so that the compiler sees neither
/// an unknown trip count nor possible aliasing between the output and the operands: g++ -O2
/// vectorises the inner loops of simple arithmetic.
template <class K, class T>
void pointwise_run(const K& k, T* out, const std::int64_t* offsets, std::int64_t n) {
  constexpr std::int64_t block = 64 / sizeof(T) < 16 ? 16 : 64 / sizeof(T);
  std::int64_t i = 0;
  for (; i + block <= n; i += block) {
    T buf[block];
    for (std::int64_t j = 0; j < block; ++j) buf[j] = k.load(offsets, i + j);
    for (std::int64_t j = 0; j < block; ++j) out[i + j] = buf[j];
  }
  for (; i < n; ++i) out[i] = k.load(offsets, i);
}

/// Strides that read a contiguous operand of `shape` broadcast to `target` (0 on broadcast
/// dims): how a random operand is indexed.
inline strides_t broadcast_contiguous_strides(const shape_t& shape, const shape_t& target) {
  const strides_t own = contiguous_strides(shape);
  strides_t st(target.size(), 0);
  const std::size_t lead = target.size() - shape.size();
  for (std::size_t i = 0; i < shape.size(); ++i)
    st[lead + i] = shape[i] == 1 && target[lead + i] != 1 ? 0 : own[i];
  return st;
}

/// Each indexed operand's strides over `out`'s shape (0 along broadcast dims), the output's
/// first: how the strided loops and the device kernel index every operand.
template <class E, class T>
std::array<strides_t, structure<E>::indexed_leaves + 1> operand_strides(const E& e, const tensor<T>& out) {
  std::array<strides_t, structure<E>::indexed_leaves + 1> strides;
  strides[0] = out.strides();
  std::size_t next = 1;
  visit_leaves(e, [&](const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (is_tensor_leaf_v<L>)
      strides[next++] = tensor<typename L::value_type>::detail_broadcast_strides(leaf.value, out.shape());
    else if constexpr (is_random_leaf_v<L>)
      strides[next++] = broadcast_contiguous_strides(leaf.shape(), out.shape());
  });
  return strides;
}

/// Evaluates expression `e` into `out` (shape e.shape(), any strides) in one loop. `out` may be
/// one of the operands only when it has the same layout and shape (no broadcast reads).
template <class E>
void evaluate_into(const E& e, const tensor<typename E::value_type>& out) {
  using T = typename E::value_type;
  constexpr std::size_t n_leaves = structure<E>::indexed_leaves;
  const shape_t& shape = e.shape();
  CCGRAPH_CHECK(out.shape() == shape, "evaluate_into: output of shape ", shape_str(out.shape()),
                " for an expression of shape ", shape_str(shape));
  const device dev = out.device();
  visit_leaves(e, [&](const auto& leaf) {
    if constexpr (is_tensor_leaf_v<std::remove_cvref_t<decltype(leaf)>>)
      CCGRAPH_CHECK(leaf.value.device() == dev, "pointwise: operand of shape ",
                    shape_str(leaf.value.shape()), " on ", leaf.value.device(), " but the result is on ",
                    dev, "; move it with .to(device)");
  });
  if (dev.is_cuda()) {
    // One kernel for the whole tree. Reading the leaves' pointers (make_kernel) orders this
    // stream after any collective still writing them.
    const auto k = make_kernel<1>(e);
    launch_device_pointwise("pointwise", dev, k, out.data(), shape, operand_strides(e, out));
    return;
  }
  const auto k = make_kernel<1>(e);
  T* o = out.data();
  bool flat = out.is_contiguous();
  visit_leaves(e, [&](const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (is_tensor_leaf_v<L>)
      flat = flat && leaf.value.shape() == shape && leaf.value.is_contiguous();
    else if constexpr (is_random_leaf_v<L>)
      flat = flat && leaf.shape() == shape;
  });
  if (flat) {
    const std::array<std::int64_t, n_leaves + 1> zero{};
    pointwise_run(k, o, zero.data(), out.numel());
    return;
  }
  // Strided/broadcast path: one offset per operand.
  const std::array<strides_t, n_leaves + 1> strides = operand_strides(e, out);
  std::array<const strides_t*, n_leaves + 1> ptrs;
  // A strided path has rank >= 1 (rank 0 is always flat); a last dim of size 1 has any stride.
  bool rows = true;
  for (std::size_t i = 0; i <= n_leaves; ++i) {
    ptrs[i] = &strides[i];
    rows = rows && (strides[i].back() == 1 || shape.back() <= 1);
  }
  if (rows) {
    // Every operand is contiguous along the last dim (a bias row, a narrowed block, ...): walk
    // the outer dims and run the vectorised loop over each row.
    const shape_t outer(shape.begin(), shape.end() - 1);
    const std::int64_t inner = shape.back();
    for_each_offset<n_leaves + 1>(outer, ptrs, [&](const auto& off) {
      pointwise_run(k, o + off[0], off.data(), inner);
    });
    return;
  }
  for_each_offset<n_leaves + 1>(shape, ptrs, [&](const auto& off) { o[off[0]] = k.load(off.data(), 0); });
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The node type
// ---------------------------------------------------------------------------------------------

/// A lazy pointwise op applied to operands that are expressions, tensor leaves or scalar leaves.
/// Construction computes and checks the broadcast shape (a mismatch throws at once, naming both
/// shapes) and does nothing else; `eval()` runs the whole tree in one loop. Build these with the
/// operators and functions of ccgraph/ops/pointwise.hpp rather than by hand.
template <pointwise_op Op, class... Args>
class pointwise_expr : public detail::expr_base {
  static_assert(sizeof...(Args) == static_cast<std::size_t>(Op::arity),
                "pointwise_expr: number of operands differs from the op's arity");

 public:
  /// The op of this node (a tag of ccgraph::ops).
  using op_type = Op;
  /// The element type of the result (the operands' for arithmetic, bool for comparisons).
  using value_type = op_result_t<Op, typename Args::value_type...>;
  static_assert(Op::template accepts<typename Args::value_type...>,
                "pointwise expression: mixing dtypes: the operands' element types do not fit the op "
                "(arithmetic takes one element type; where a bool condition and two of one type)");

  /// Takes the operands and checks that their shapes broadcast together.
  explicit pointwise_expr(Args... args) : args_(std::move(args)...), shape_(result_shape()) {}

  /// The broadcast shape of the operands: the shape of the result.
  const shape_t& shape() const { return shape_; }
  /// Number of dimensions of the result.
  int dim() const { return static_cast<int>(shape_.size()); }
  /// Number of elements of the result.
  std::int64_t numel() const { return numel_of(shape_); }
  /// The runtime element-type tag of the result.
  static constexpr ccgraph::dtype dtype() { return dtype_v<value_type>; }
  /// The operands (expressions, detail::tensor_leaf or detail::scalar_leaf).
  const std::tuple<Args...>& args() const { return args_; }

  /// Evaluates the tree into a new contiguous tensor, in one loop; waits on pending operands.
  /// Where the result is computed: the device of the first tensor operand (all must agree).
  ccgraph::device device() const {
    ccgraph::device d = default_device();
    bool found = false;
    detail::visit_leaves(*this, [&](const auto& leaf) {
      if constexpr (detail::is_tensor_leaf_v<std::remove_cvref_t<decltype(leaf)>>) {
        if (!found) d = leaf.value.device();
        found = true;
      }
    });
    return d;
  }
  tensor<value_type> eval() const {
    static_assert(!is_traced_v<pointwise_expr>,
                  "eval: an expression over traced (symbolic) values is not computed here; it "
                  "becomes one pointwise graph node when converted to symbolic<T> or returned");
    auto out = tensor<value_type>::empty(shape_, device());
    detail::evaluate_into(*this, out);
    return out;
  }
  /// The values in row-major order (evaluates).
  std::vector<value_type> to_vector() const { return eval().to_vector(); }
  /// This expression converted to element type U, lazily: one more node of the same loop.
  template <element U>
  pointwise_expr<ops::to<U>, pointwise_expr> to() const {
    return pointwise_expr<ops::to<U>, pointwise_expr>(*this);
  }

 private:
  shape_t result_shape() const {
    // Op::name views a string literal, so data() is null-terminated.
    if constexpr (Op::arity == 1)
      return std::get<0>(args_).shape();
    else if constexpr (Op::arity == 2)
      return broadcast_shapes(std::get<0>(args_).shape(), std::get<1>(args_).shape(), Op::name.data());
    else
      return broadcast_shapes(broadcast_shapes(std::get<0>(args_).shape(), std::get<1>(args_).shape(), Op::name.data()),
                              std::get<2>(args_).shape(), Op::name.data());
  }

  std::tuple<Args...> args_;
  shape_t shape_;
};

namespace detail {

/// An expression is traced when one of its leaves is a symbolic value.
template <class Op, class... Args>
struct expr_is_traced<pointwise_expr<Op, Args...>>
    : std::bool_constant<((is_symbolic_leaf_v<Args> || expr_is_traced<Args>::value) || ...)> {};

template <class T, class X>
struct operand_node {
  using type = scalar_leaf<T>;
};
template <class T, class X>
  requires is_expression_v<X>
struct operand_node<T, X> {
  using type = std::remove_cvref_t<X>;
};
template <class T, class X>
  requires is_tensor_v<std::remove_cvref_t<X>>
struct operand_node<T, X> {
  using type = tensor_leaf<typename std::remove_cvref_t<X>::value_type>;
};
template <class T, class X>
  requires has_leaf_type_v<X>
struct operand_node<T, X> {
  using type = typename leaf_type_of<std::remove_cvref_t<X>>::type;
};

/// The node type an operand becomes in an expression whose scalars convert to T (tensors,
/// expressions and symbolic values keep their own element type).
template <class T, class X>
using operand_node_t = typename operand_node<T, X>::type;

/// A scalar as an operand of an expression of element type T: converted to compute_t<T>, the
/// type T's ops compute in (an integer T's scalar is converted to T itself: `i * 2.5` is i * 2).
template <class T, class X>
compute_t<T> scalar_value(X x) {
  if constexpr (std::is_floating_point_v<compute_t<T>>)
    return cast<compute_t<T>>(x);
  else
    return static_cast<compute_t<T>>(cast<T>(x));
}

/// Wraps one operand for an expression of element type T: an expression as is, a tensor as a
/// leaf, a symbolic value as its leaf_type_of, a scalar as scalar_value<T>.
template <class T, class X>
operand_node_t<T, X> to_operand(X&& x) {
  if constexpr (is_expression_v<X>)
    return std::forward<X>(x);
  else if constexpr (is_scalar_operand_v<X>)
    return scalar_leaf<T>{scalar_value<T>(x)};
  else
    return operand_node_t<T, X>{std::forward<X>(x)};
}

/// The element type of an op over these operands: that of the first tensor or expression.
template <class X, class... Xs>
struct operands_value {
  using type = typename operands_value<Xs...>::type;
};
template <class X, class... Xs>
  requires pointwise_operand<X>
struct operands_value<X, Xs...> {
  using type = value_type_t<X>;
};

/// Builds the node `Op(xs...)` with scalar operands converted to T; the callers have already
/// checked the element types.
template <class Op, class T, class... Xs>
auto make_expr_as(Xs&&... xs) {
  return pointwise_expr<Op, operand_node_t<T, Xs>...>(to_operand<T>(std::forward<Xs>(xs))...);
}

/// Builds the node `Op(xs...)`, scalars converted to the first tensor operand's element type.
template <class Op, class... Xs>
auto make_expr(Xs&&... xs) {
  return make_expr_as<Op, typename operands_value<Xs...>::type>(std::forward<Xs>(xs)...);
}

}  // namespace detail
}  // namespace ccgraph
