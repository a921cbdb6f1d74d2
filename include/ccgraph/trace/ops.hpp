// ccgraph/trace/ops.hpp: what ops do on symbolic values: a traced pointwise expression becomes
// one fused node (memoised, so a value read twice is computed once); matmul, cat, copy and the
// collectives record their nodes. Shapes and dtypes go through the same inference as eager.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ccgraph/expr/expr.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/tensor/any_tensor.hpp>
#include <ccgraph/tensor/print.hpp>
#include <ccgraph/trace/symbolic.hpp>

namespace ccgraph {
namespace detail {

/// A scalar of a traced expression as text that reads back to the same value: "2." for whole
/// numbers (as tensors print them), else the shortest round-trip form ("0.12345"). The text is
/// part of the pointwise node's attributes, so the structural hash and the memo of materialised
/// expressions tell apart scalars that differ in any bit (4 significant digits would not).
template <class T>
std::string scalar_text(T v) {
  if constexpr (std::is_integral_v<T>) {
    return format_element(v);
  } else {
    const auto c = static_cast<compute_t<T>>(v);
    const double d = static_cast<double>(c);
    if (std::abs(d) < 1e15 && d == static_cast<double>(static_cast<std::int64_t>(d)) && !std::signbit(d))
      return format_element(v);
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, c);
    return ec == std::errc() ? std::string(buf, end) : format_element(v);
  }
}

/// A traced pointwise expression as a small program over blocks of elements: instruction k
/// writes register k from earlier registers, a graph input, or a scalar. Each op instruction
/// calls its tag's `apply` (the op's one definition) over a whole block, so the interpreter
/// dispatches once per op per block, not per element.
template <class T>
struct pointwise_program {
  static constexpr std::int64_t block = 512;
  using block_fn = void (*)(T* out, const T* a, const T* b, std::int64_t n);
  struct instr {
    block_fn fn = nullptr;  // null: a load
    int a = -1, b = -1;     // operand registers
    int input = -1;         // load: graph input index; -1 with fn null: the scalar
    T scalar{};
  };
  std::vector<instr> code;

  template <class Op>
  static void apply_block(T* out, const T* a, const T* b, std::int64_t n) {
    if constexpr (Op::arity == 1) {
      for (std::int64_t i = 0; i < n; ++i) out[i] = Op::apply(a[i]);
    } else {
      for (std::int64_t i = 0; i < n; ++i) out[i] = Op::apply(a[i], b[i]);
    }
  }

  /// Runs the program over `inputs` (broadcast to their common shape) into a new tensor.
  tensor<T> run(const std::vector<tensor<T>>& inputs) const {
    shape_t shape = inputs.at(0).shape();
    for (auto& t : inputs) shape = broadcast_shapes(shape, t.shape(), "pointwise");
    auto out = tensor<T>::empty(shape);
    run_into(inputs, out);
    return out;
  }

  /// Runs the program over `inputs` into `out`, whose shape is the inputs' broadcast shape and
  /// which shares no byte with them (any strides; contiguous is written directly).
  void run_into(const std::vector<tensor<T>>& inputs, const tensor<T>& result) const {
    shape_t shape = inputs.at(0).shape();
    for (auto& t : inputs) shape = broadcast_shapes(shape, t.shape(), "pointwise");
    CCGRAPH_CHECK(result.shape() == shape, "pointwise: output of shape ", shape_str(result.shape()),
                  " for a result of shape ", shape_str(shape));
    if (!result.is_contiguous()) {
      tensor<T> tmp = run(inputs);
      tensor<T>(result).copy_(tmp);
      return;
    }
    std::vector<tensor<T>> flat;  // each input as a contiguous tensor of the output shape
    for (auto& t : inputs) {
      if (t.shape() == shape && t.is_contiguous()) {
        flat.push_back(t);
      } else {
        auto e = tensor<T>::empty(shape);
        e.copy_(t);
        flat.push_back(std::move(e));
      }
    }
    const tensor<T>& out = result;
    const std::int64_t n = out.numel();
    std::vector<const T*> in_ptr;
    for (auto& f : flat) in_ptr.push_back(f.data());
    T* o = out.data();
    std::vector<T> regs(code.size() * static_cast<std::size_t>(block));
    for (std::int64_t base = 0; base < n; base += block) {
      const std::int64_t len = std::min(block, n - base);
      for (std::size_t k = 0; k < code.size(); ++k) {
        const instr& ins = code[k];
        T* r = regs.data() + k * static_cast<std::size_t>(block);
        if (ins.fn) {
          ins.fn(r, regs.data() + static_cast<std::size_t>(ins.a) * block,
                 ins.b >= 0 ? regs.data() + static_cast<std::size_t>(ins.b) * block : nullptr, len);
        } else if (ins.input >= 0) {
          std::copy(in_ptr[static_cast<std::size_t>(ins.input)] + base,
                    in_ptr[static_cast<std::size_t>(ins.input)] + base + len, r);
        } else {
          std::fill(r, r + len, ins.scalar);
        }
      }
      const T* last = regs.data() + (code.size() - 1) * static_cast<std::size_t>(block);
      std::copy(last, last + len, o + base);
    }
  }
};

/// What recording one expression produces: its program, the distinct graph inputs it reads,
/// the text printed for it ("mul(relu(%0), 2.)"), the memo key (the same text over global
/// value names), and the distinct op names in evaluation order (for "fused_relu_mul").
template <class T>
struct recorded_expr {
  pointwise_program<T> program;
  std::vector<value_ref> inputs;
  std::vector<std::string> op_names;
};

inline std::string value_key(const value_ref& r) {
  return "%" + std::to_string(reinterpret_cast<std::uintptr_t>(r.src)) + "." + std::to_string(r.index);
}

// Typed trees of traced expressions: the same expression type, each operand either computed
// or read from one of the node's inputs, decided when the expression is recorded (a
// sub-expression that is already a node is read, as in the program above). A device runs one
// kernel generated from the tree; `load(p, o, i)` reads input s at p[s][o[s + 1] + i].

/// Input `slot` at element i: p[slot][o[slot + 1] + i]. The slot is known only at run time;
/// selecting it with an unrolled compare chain keeps the pointer and offset arrays in
/// registers (a run-time index would move them to local memory in a kernel).
template <class T, std::size_t M>
CCGRAPH_HOST_DEVICE T load_slot(const std::array<const T*, M>& p, const std::int64_t* o, int slot, std::int64_t i) {
  const T* q = p[0];
  std::int64_t off = o[1];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::size_t j = 1; j < M; ++j)
    if (static_cast<int>(j) == slot) {
      q = p[j];
      off = o[j + 1];
    }
  return q[off + i];
}

/// Input `slot`'s elements i, ..., i+V-1 of a flat layout (the pack form of load_slot).
template <int V, bool Vec, class T, std::size_t M>
CCGRAPH_HOST_DEVICE elem_pack<T, V> load_slot_pack(const std::array<const T*, M>& p, int slot, std::int64_t i) {
  const T* q = p[0];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::size_t j = 1; j < M; ++j)
    if (static_cast<int>(j) == slot) q = p[j];
  return load_pack_at<V, Vec>(q + i);
}

/// A traced tree leaf: the node's input `slot`.
template <class T>
struct traced_slot {
  int slot = -1;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const std::array<const T*, M>& p, const std::int64_t* o, std::int64_t i) const {
    return load_slot(p, o, slot, i);
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const std::array<const T*, M>& p, std::int64_t i) const {
    return load_slot_pack<V, Vec>(p, slot, i);
  }
};
/// A traced tree leaf: a scalar.
template <class T>
struct traced_scalar {
  T v;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const std::array<const T*, M>&, const std::int64_t*, std::int64_t) const { return v; }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const std::array<const T*, M>&, std::int64_t) const {
    return fill_pack<V>(v);
  }
};
/// A traced op: computed from its operands, or read from input `slot` when that is >= 0.
template <class T, class Op, class... Ks>
struct traced_op;
template <class T, class Op, class K0>
struct traced_op<T, Op, K0> {
  int slot = -1;
  K0 a;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const std::array<const T*, M>& p, const std::int64_t* o, std::int64_t i) const {
    return slot >= 0 ? load_slot(p, o, slot, i) : Op::apply(a.load(p, o, i));
  }
  // The slot test is made once per pack, not once per element.
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const std::array<const T*, M>& p, std::int64_t i) const {
    if (slot >= 0) return load_slot_pack<V, Vec>(p, slot, i);
    return to_pack<T>(apply_pack<Op>(a.template load_pack<V, Vec>(p, i)));
  }
};
template <class T, class Op, class K0, class K1>
struct traced_op<T, Op, K0, K1> {
  int slot = -1;
  K0 a;
  K1 b;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const std::array<const T*, M>& p, const std::int64_t* o, std::int64_t i) const {
    return slot >= 0 ? load_slot(p, o, slot, i) : Op::apply(a.load(p, o, i), b.load(p, o, i));
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const std::array<const T*, M>& p, std::int64_t i) const {
    if (slot >= 0) return load_slot_pack<V, Vec>(p, slot, i);
    return to_pack<T>(apply_pack<Op>(a.template load_pack<V, Vec>(p, i), b.template load_pack<V, Vec>(p, i)));
  }
};

/// The traced tree type of expression X over element type T.
template <class T, class X>
struct traced_tree {
  using type = traced_scalar<T>;  // scalar leaves
};
template <class T, class U>
struct traced_tree<T, symbolic_leaf<U>> {
  using type = traced_slot<T>;
};
template <class T, class Op, class... Args>
struct traced_tree<T, pointwise_expr<Op, Args...>> {
  using type = traced_op<T, Op, typename traced_tree<T, Args>::type...>;
};
template <class T, class X>
using traced_tree_t = typename traced_tree<T, std::remove_cvref_t<X>>::type;

/// What record_expr returns for one sub-expression: its register in the program, its text,
/// its memo key, and its typed tree.
template <class T, class X>
struct recorded_part {
  int reg;
  std::string text;
  std::string key;
  traced_tree_t<T, X> tree;
};

/// Walks expression `x`, appending its instructions; returns its register, text, key and tree. A
/// sub-expression already recorded as a node (its key is in the trace's memo) is read as that
/// node's value instead of being recomputed: a value used by several consumers is computed once.
template <class T, class X>
recorded_part<T, X> record_expr(const X& x, recorded_expr<T>& rec, const trace_state& st) {
  using P = pointwise_program<T>;
  auto load_input = [&](const value_ref& r) {
    std::size_t i = 0;
    while (i < rec.inputs.size() && !(rec.inputs[i] == r)) ++i;
    if (i == rec.inputs.size()) rec.inputs.push_back(r);
    typename P::instr ins;
    ins.input = static_cast<int>(i);
    rec.program.code.push_back(ins);
    return std::tuple<int, std::string, std::string, int>{static_cast<int>(rec.program.code.size()) - 1,
                                                           "%" + std::to_string(i), value_key(r),
                                                           static_cast<int>(i)};
  };
  if constexpr (is_symbolic_leaf_v<X>) {
    auto [reg, text, key, slot] = load_input(x.value.ref());
    return {reg, text, key, traced_slot<T>{slot}};
  } else if constexpr (is_scalar_leaf_v<X>) {
    typename P::instr ins;
    ins.scalar = x.value;
    rec.program.code.push_back(ins);
    const std::string text = scalar_text(x.value);
    return {static_cast<int>(rec.program.code.size()) - 1, text, text, traced_scalar<T>{x.value}};
  } else if constexpr (is_tensor_leaf_v<X>) {
    CCGRAPH_THROW(error, "trace: a pointwise expression mixes a traced value with a concrete tensor of shape ",
                  shape_str(x.value.shape()), "; pass the tensor to the traced function as an input");
  } else {
    using Op = typename X::op_type;
    // Record the operands into a scratch copy first: if this whole sub-expression is already a
    // node, none of its instructions are kept.
    recorded_expr<T> scratch = rec;
    std::string text(Op::name), key(Op::name);
    text += '(';
    key += '(';
    std::vector<int> regs;
    bool first = true;
    traced_tree_t<T, X> tree{};
    auto part = [&](const auto& a) {
      auto r = record_expr<T>(a, scratch, st);
      regs.push_back(r.reg);
      text += (first ? "" : ", ") + r.text;
      key += (first ? "" : ", ") + r.key;
      first = false;
      return r.tree;
    };
    const auto& args = x.args();
    tree.a = part(std::get<0>(args));
    if constexpr (Op::arity == 2) tree.b = part(std::get<1>(args));
    text += ')';
    key += ')';
    if (auto it = st.pointwise_memo.find(key); it != st.pointwise_memo.end()) {
      auto [reg, t, k, slot] = load_input(it->second);
      tree.slot = slot;
      return {reg, t, k, tree};
    }
    rec = std::move(scratch);
    typename P::instr ins;
    ins.fn = &P::template apply_block<Op>;
    ins.a = regs[0];
    ins.b = regs.size() > 1 ? regs[1] : -1;
    rec.program.code.push_back(ins);
    if (std::find(rec.op_names.begin(), rec.op_names.end(), Op::name) == rec.op_names.end())
      rec.op_names.emplace_back(Op::name);
    return {static_cast<int>(rec.program.code.size()) - 1, text, key, tree};
  }
}

/// A traced tree with the node's input pointers: the kernel tree a device runs (M: the most
/// inputs the expression can have, one per symbolic leaf).
template <class T, class Tree, std::size_t M>
struct traced_kernel {
  std::array<const T*, M> p;
  Tree t;
  CCGRAPH_HOST_DEVICE T load(const std::int64_t* o, std::int64_t i) const { return t.load(p, o, i); }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(std::int64_t i) const { return t.template load_pack<V, Vec>(p, i); }
  CCGRAPH_HOST_DEVICE bool aligned16() const {
    bool ok = true;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (std::size_t j = 0; j < M; ++j) ok = ok && (!p[j] || ::ccgraph::detail::aligned16(p[j]));
    return ok;
  }
};

/// Replays a recorded expression on the node's inputs: the block program on the host, the
/// typed tree as one generated kernel on a device.
template <class T, class Tree, std::size_t M>
struct traced_pointwise_kernel final : pointwise_kernel {
  pointwise_program<T> program;
  Tree tree;
  traced_pointwise_kernel(pointwise_program<T> p, Tree t) : program(std::move(p)), tree(t) {}
  any_tensor run(const std::vector<any_tensor>& inputs) const override {
    const auto ins = unpack(inputs);
    if (!ins.at(0).device().is_cpu()) {
      shape_t shape = ins[0].shape();
      for (auto& t : ins) shape = broadcast_shapes(shape, t.shape(), "pointwise");
      auto out = tensor<T>::empty(shape, ins[0].device());
      run_device(ins, out);
      return out;
    }
    return program.run(ins);
  }
  void run_into(const std::vector<any_tensor>& inputs, const any_tensor& out) const override {
    const auto ins = unpack(inputs);
    const tensor<T>& o = get_tensor<T>(out, "pointwise");
    if (!o.device().is_cpu()) return run_device(ins, o);
    program.run_into(ins, o);
  }

 private:
  static std::vector<tensor<T>> unpack(const std::vector<any_tensor>& inputs) {
    std::vector<tensor<T>> ins;
    ins.reserve(inputs.size());
    for (auto& t : inputs) ins.push_back(get_tensor<T>(t, "pointwise"));
    return ins;
  }
  void run_device(const std::vector<tensor<T>>& ins, const tensor<T>& out) const {
    CCGRAPH_CHECK(ins.size() <= M, "pointwise: ", ins.size(), " inputs for an expression of ", M, " operands");
    traced_kernel<T, Tree, M> k{{}, tree};
    std::array<strides_t, M + 1> strides;
    strides[0] = out.strides();
    for (std::size_t j = 0; j < M; ++j) {
      if (j < ins.size()) {
        CCGRAPH_CHECK(ins[j].device() == out.device(), "pointwise: input ", j, " on ", ins[j].device(),
                      " but the result is on ", out.device());
        strides[j + 1] = tensor<T>::detail_broadcast_strides(ins[j], out.shape());
        k.p[j] = ins[j].data();  // orders this stream after a collective still writing it
      } else {
        strides[j + 1] = strides_t(out.shape().size(), 0);
        k.p[j] = nullptr;
      }
    }
    launch_device_pointwise("pointwise", out.device(), k, out.data(), out.shape(), strides);
  }
};

/// Records a traced expression as one pointwise node ("fused_" + its distinct op names), or
/// returns the node already recorded for the same expression over the same inputs.
template <class E>
symbolic<typename E::value_type> materialize(const E& e) {
  using T = typename E::value_type;
  trace_state* state = current_trace_ptr();
  CCGRAPH_CHECK(state != nullptr, "pointwise: a symbolic value used outside of cg::trace");
  recorded_expr<T> rec;
  auto part = record_expr<T>(e, rec, *state);
  const std::string& text = part.text;
  const std::string& key = part.key;
  if (auto it = state->pointwise_memo.find(key); it != state->pointwise_memo.end())
    return symbolic<T>(state, it->second);
  if (rec.op_names.empty()) return symbolic<T>(state, rec.inputs.at(0));  // the whole expression was a node
  std::string fused = "fused";
  for (auto& n : rec.op_names) fused += "_" + n;
  constexpr std::size_t max_inputs = structure<E>::tensor_leaves;
  ops::pointwise op{fused, text,
                    std::make_shared<traced_pointwise_kernel<T, traced_tree_t<T, E>, max_inputs>>(
                        std::move(rec.program), part.tree)};
  node* n = state->g.add(std::move(op), rec.inputs, {}, E::op_type::name);
  state->pointwise_memo.emplace(key, value_ref{n, 0});
  return symbolic<T>(state, {n, 0});
}

/// Records `op` on symbolic arguments and returns its (single) output.
template <class T>
symbolic<T> record(node_op op, const std::vector<value_ref>& args, std::string_view hint) {
  trace_state* st = current_trace_ptr();
  CCGRAPH_CHECK(st != nullptr, hint, ": a symbolic value used outside of cg::trace");
  return symbolic<T>(st, {st->g.add(std::move(op), args, {}, hint), 0});
}

/// Collectives on symbolic values: the collective node, then one wait_tensor per output, which
/// consumers read (PyTorch's traced form). The fake world resolves the group.
template <class T>
struct collective_backend<symbolic<T>> {
  static trace_state& state(const char* what) {
    trace_state* st = current_trace_ptr();
    CCGRAPH_CHECK(st != nullptr, what, ": a symbolic value used outside of cg::trace");
    return *st;
  }
  static group_info resolve(const group& g, const char* what) { return state(what).resolve(g, what); }
  static int rank(const char* what) { return state(what).rank; }
  static std::vector<symbolic<T>> issue(const char* what, ops::collective_op op, const group_info& gi,
                                        const std::vector<symbolic<T>>& inputs) {
    trace_state& st = state(what);
    std::vector<value_ref> args;
    for (auto& x : inputs) args.push_back(x.ref());
    const std::string_view hint = ops::name_of(op);
    node* c = st.g.add(to_node_op(op), args, gi, hint);
    std::vector<symbolic<T>> outs;
    for (int k = 0; k < c->num_outputs(); ++k) {
      node* w = st.g.add(ops::wait_tensor{}, {{c, k}}, {}, "wait_tensor");
      outs.emplace_back(&st, value_ref{w, 0});
    }
    return outs;
  }
};

}  // namespace detail

template <class T>
template <expression E>
symbolic<T>::symbolic(const E& e) : symbolic(detail::materialize(e)) {
  static_assert(std::is_same_v<typename E::value_type, T>,
                "symbolic<T>(expression): mixing dtypes: the expression's element type differs");
}

/// A traced operand: a symbolic value or an expression over symbolic values.
template <class X>
concept traced_operand = is_traced_v<X> && pointwise_operand<X>;

/// matmul of traced operands records a matmul node (inference: detail::matmul_shape).
template <pointwise_operand A, pointwise_operand B>
  requires(is_traced_v<A> || is_traced_v<B>)
auto matmul(const A& a, const B& b) {
  static_assert(is_same_dtype_v<A, B>,
                "matmul: mixing dtypes: both operands must have the same element type; convert "
                "one of them with .to<U>()");
  using T = value_type_t<A>;
  const symbolic<T> sa = a, sb = b;
  return detail::record<T>(ops::matmul{}, {sa.ref(), sb.ref()}, "matmul");
}

/// cat of symbolic values records a cat node.
template <class T>
symbolic<T> cat(const std::vector<symbolic<T>>& xs, std::int64_t dim = 0) {
  std::vector<value_ref> args;
  for (auto& x : xs) args.push_back(x.ref());
  CCGRAPH_CHECK(!xs.empty(), "cat: expected a non-empty list of tensors");
  return detail::record<T>(ops::cat{dim}, args, "cat");
}
/// cat for a braced list of symbolic values.
template <class T>
symbolic<T> cat(std::initializer_list<symbolic<T>> xs, std::int64_t dim = 0) {
  return cat(std::vector<symbolic<T>>(xs), dim);
}

/// Functional copy_: a node holding `src` (broadcast) with `dst`'s meta.
template <class T, class S>
  requires is_traced_v<S> || scalar_operand<S>
symbolic<T> copy(const symbolic<T>& dst, const S& src) {
  if constexpr (scalar_operand<S>) {
    symbolic<T> filled = dst * T(0) + detail::cast<T>(src);
    return detail::record<T>(ops::copy{}, {dst.ref(), filled.ref()}, "copy");
  } else {
    const symbolic<T> s = src;
    return detail::record<T>(ops::copy{}, {dst.ref(), s.ref()}, "copy");
  }
}

/// A symbolic value is already waited (its wait_tensor node follows the collective): the value
/// itself.
template <class T>
symbolic<T> wait_tensor(const symbolic<T>& t) {
  return symbolic<T>(t.state(), t.ref());
}

/// Evaluates an expression: a tensor eagerly, a symbolic value (one fused node) when traced.
template <expression E>
  requires is_traced_v<E>
symbolic<typename E::value_type> eval(const E& e) {
  return symbolic<typename E::value_type>(e);
}

/// A symbolic value is already materialised: eval returns it, so generic code can call eval on
/// whatever an op gave it, as it does on tensors.
template <class T>
const symbolic<T>& eval(const symbolic<T>& s) {
  return s;
}

}  // namespace ccgraph
