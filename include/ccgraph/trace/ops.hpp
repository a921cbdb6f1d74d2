// ccgraph/trace/ops.hpp: what ops do on symbolic values: a traced pointwise expression becomes
// one fused node (memoised, so a value read twice is computed once); matmul, cat, copy and the
// collectives record their nodes. Shapes and dtypes go through the same inference as eager.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/expr/expr.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/tensor/any_tensor.hpp>
#include <ccgraph/tensor/print.hpp>
#include <ccgraph/tensor/random.hpp>
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

/// One random operand of a recorded expression (a dropout mask): how to draw it (the
/// distribution, type-erased), its shape, and the generator a run reserves its draw from (none:
/// the default generator of the thread that runs the graph).
struct random_source {
  virtual ~random_source() = default;
  shape_t shape;
  std::optional<generator> gen;
  /// The element type of its values.
  virtual dtype type() const = 0;
  /// False for a constant mask (p = 0 or 1, eval mode): nothing to reserve.
  virtual bool draws() const = 0;
  /// out[0..n) = elements [first, first + n) of the draw that starts at `s`.
  virtual void fill(void* out, const philox_stream& s, std::int64_t first, std::int64_t n) const = 0;
  /// Counters one draw of `shape` consumes.
  virtual std::uint64_t counters() const = 0;
  /// Reserves this run's draw from its generator.
  philox_stream reserve() const {
    if (!draws()) return {};
    return (gen ? *gen : default_generator()).reserve(counters());
  }
};

template <class Dist>
struct random_source_of final : random_source {
  Dist d;
  dtype type() const override { return dtype_v<typename Dist::value_type>; }
  bool draws() const override { return dist_draws(d); }
  void fill(void* out, const philox_stream& s, std::int64_t first, std::int64_t n) const override {
    fill_random(static_cast<typename Dist::value_type*>(out), d, s, first, n);
  }
  std::uint64_t counters() const override { return counters_for<Dist>(numel_of(shape)); }
};

/// How a random operand reads in a recorded expression's text: "bernoulli(0.9)" for a mask.
template <class Dist>
std::string random_text(const Dist& d) {
  if constexpr (std::is_same_v<Dist, keep_dist>)
    return "bernoulli(" + scalar_text(static_cast<float>(static_cast<double>(d.threshold) / 4294967296.0)) + ")";
  else
    return "random";
}

/// A traced pointwise expression as a small program over blocks of elements: instruction k
/// writes register k (of its own element type) from earlier registers, a graph input, a scalar
/// or a random operand. Each op instruction calls its tag's `apply` (the op's one definition)
/// over a whole block, so the interpreter dispatches once per op per block, not per element.
/// (A template only so that its members, which visit every element type, are compiled where a
/// trace uses them rather than in every translation unit that includes this header.)
template <class = void>
struct basic_pointwise_program {
  static constexpr std::int64_t block = 512;
  using op_fn = void (*)(void* out, const void* const* args, std::int64_t n);
  using fill_fn = void (*)(void* out, const void* value, std::int64_t n);
  enum class kind : std::uint8_t { load, scalar, random, op };
  struct instr {
    kind k = kind::op;
    dtype type = dtype::f32;     // the register's element type
    op_fn fn = nullptr;          // op
    int args[3] = {-1, -1, -1};  // op: operand registers
    int index = -1;              // load: graph input; random: random source
    fill_fn fill = nullptr;      // scalar: broadcasts `value`
    alignas(8) unsigned char value[8] = {};
  };
  std::vector<instr> code;
  std::vector<std::shared_ptr<const random_source>> randoms;

  template <class Op, class R, class... A, std::size_t... I>
  static void apply_impl(R* out, const void* const* args, std::int64_t n, std::index_sequence<I...>) {
    const std::tuple<const A*...> p{static_cast<const A*>(args[I])...};
    for (std::int64_t i = 0; i < n; ++i) out[i] = cast<R>(Op::apply(std::get<I>(p)[i]...));
  }
  /// Op over a block: R out[i] = Op::apply(a[i], ...).
  template <class Op, class R, class... A>
  static void apply_block(void* out, const void* const* args, std::int64_t n) {
    apply_impl<Op, R, A...>(static_cast<R*>(out), args, n, std::index_sequence_for<A...>{});
  }
  template <class T>
  static void fill_block(void* out, const void* value, std::int64_t n) {
    T v;
    std::memcpy(&v, value, sizeof v);
    std::fill_n(static_cast<T*>(out), n, v);
  }

  /// True when a run draws random numbers (and so differs from the last run).
  bool draws_random() const {
    return std::any_of(randoms.begin(), randoms.end(), [](const auto& r) { return r->draws(); });
  }
  /// This run's draws, one per random operand, reserved from their generators in order.
  std::vector<philox_stream> reserve_draws() const {
    std::vector<philox_stream> out;
    for (auto& r : randoms) out.push_back(r->reserve());
    return out;
  }
  /// The broadcast shape of the inputs and random operands: the result's.
  shape_t result_shape(const std::vector<any_tensor>& inputs) const {
    shape_t shape = meta_of(inputs.at(0)).shape;
    for (auto& t : inputs) shape = broadcast_shapes(shape, meta_of(t).shape, "pointwise");
    for (auto& r : randoms) shape = broadcast_shapes(shape, r->shape, "pointwise");
    return shape;
  }

  /// Runs the program over `inputs` (broadcast to the result's shape) with this run's `draws`
  /// into `result`, which shares no byte with the inputs, or is itself an input of the result's
  /// shape and contiguous (each block is read before it is written: what the executor's
  /// in-place update of an input relies on); any strides, contiguous is written directly.
  void run_into(const std::vector<any_tensor>& inputs, const any_tensor& result,
                const std::vector<philox_stream>& draws) const {
    const shape_t shape = result_shape(inputs);
    const tensor_meta rm = meta_of(result);
    CCGRAPH_CHECK(rm.shape == shape, "pointwise: output of shape ", shape_str(rm.shape), " for a result of shape ",
                  shape_str(shape));
    const bool contiguous = ::ccgraph::detail::visit([](const auto& t) { return t.is_contiguous(); }, result);
    if (!contiguous) {
      const any_tensor tmp = empty_like_meta(rm);
      run_into(inputs, tmp, draws);
      ::ccgraph::detail::visit([&](const auto& o) {
        auto dst = o;
        dst.copy_(std::get<std::decay_t<decltype(o)>>(tmp));
      }, result);
      return;
    }
    // Each input as a contiguous tensor of the result's shape (kept alive in `keep`).
    std::vector<any_tensor> keep;
    std::vector<const unsigned char*> in_ptr;
    auto flatten = [&](const auto& t) {
      using X = std::decay_t<decltype(t)>;
      if (t.shape() == shape && t.is_contiguous()) {
        in_ptr.push_back(reinterpret_cast<const unsigned char*>(t.data()));
      } else {
        auto e = X::empty(shape);
        e.copy_(t);
        in_ptr.push_back(reinterpret_cast<const unsigned char*>(e.data()));
        keep.emplace_back(std::move(e));
      }
    };
    for (auto& t : inputs) ::ccgraph::detail::visit(flatten, t);
    // A random operand of another shape is drawn whole, then broadcast like an input.
    std::vector<const unsigned char*> rand_ptr(randoms.size(), nullptr);
    for (std::size_t r = 0; r < randoms.size(); ++r) {
      if (randoms[r]->shape == shape) continue;
      const any_tensor own = empty_like_meta({randoms[r]->type(), randoms[r]->shape});
      ::ccgraph::detail::visit([&](const auto& t) {
        randoms[r]->fill(t.data(), draws.at(r), 0, t.numel());
        const std::size_t before = in_ptr.size();
        flatten(t);
        rand_ptr[r] = in_ptr[before];
        in_ptr.pop_back();
      }, own);
    }
    const std::int64_t n = numel_of(shape);
    unsigned char* out = ::ccgraph::detail::visit([](const auto& t) { return reinterpret_cast<unsigned char*>(t.data()); }, result);
    std::vector<std::uint64_t> regs(code.size() * static_cast<std::size_t>(block));  // 8 bytes per element
    auto reg = [&](std::size_t k) { return reinterpret_cast<unsigned char*>(regs.data() + k * block); };
    for (std::int64_t base = 0; base < n; base += block) {
      const std::int64_t len = std::min(block, n - base);
      for (std::size_t k = 0; k < code.size(); ++k) {
        const instr& ins = code[k];
        const std::size_t es = element_size(ins.type);
        unsigned char* r = reg(k);
        switch (ins.k) {
          case kind::load:
            std::memcpy(r, in_ptr[static_cast<std::size_t>(ins.index)] + static_cast<std::size_t>(base) * es,
                        static_cast<std::size_t>(len) * es);
            break;
          case kind::scalar: ins.fill(r, ins.value, len); break;
          case kind::random: {
            const auto i = static_cast<std::size_t>(ins.index);
            if (rand_ptr[i])
              std::memcpy(r, rand_ptr[i] + static_cast<std::size_t>(base) * es, static_cast<std::size_t>(len) * es);
            else
              randoms[i]->fill(r, draws.at(i), base, len);
            break;
          }
          case kind::op: {
            const void* a[3] = {nullptr, nullptr, nullptr};
            for (int j = 0; j < 3; ++j)
              if (ins.args[j] >= 0) a[j] = reg(static_cast<std::size_t>(ins.args[j]));
            ins.fn(r, a, len);
            break;
          }
        }
      }
      const std::size_t es = element_size(code.back().type);
      std::memcpy(out + static_cast<std::size_t>(base) * es, reg(code.size() - 1), static_cast<std::size_t>(len) * es);
    }
  }
};

/// What recording one expression produces: its program, the distinct graph inputs it reads
/// (and their element types), and the distinct op names in evaluation order (for
/// "fused_relu_mul"). Random operands are numbered by their place in the expression's type
/// (what its kernel tree indexes them by): `random_site[r]` is operand r's source in the
/// program (-1 when a memoised node computes it) and `random_shape[r]` its shape.
using pointwise_program = basic_pointwise_program<>;

struct recorded_expr {
  pointwise_program program;
  std::vector<value_ref> inputs;
  std::vector<dtype> input_types;
  std::vector<std::string> op_names;
  std::vector<int> random_site;
  std::vector<shape_t> random_shape;
};

CCGRAPH_DECL std::string value_key(const value_ref& r);

// Typed trees of traced expressions: the same expression type, each operand either computed
// or read from one of the node's inputs, decided when the expression is recorded (a
// sub-expression that is already a node is read, as in the program above). A device runs one
// kernel generated from the tree; `load(p, o, i)` reads input s at p[s][o[s + 1] + i]; the
// inputs may have different element types, so p holds untyped pointers.

/// A node's input pointers as a device kernel reads them. Bit j of `one` marks input j as a
/// single element read for every output element (a 0-d value broadcast, as AdamW's step
/// count): it is read at p[j][0] whatever the layout, so its all-zero strides do not keep the
/// node off the vectorised flat kernel. Inputs past the 64th are never marked.
template <std::size_t M>
struct traced_ptrs {
  std::array<const void*, M> p{};
  std::uint64_t one = 0;
  CCGRAPH_HOST_DEVICE const void* operator[](std::size_t j) const { return p[j]; }
  CCGRAPH_HOST_DEVICE bool single(std::size_t j) const { return j < 64 && ((one >> j) & 1u) != 0; }
};

/// Input `slot`'s pointer, its offset o[slot + 1] (0 without offsets: a flat layout) and
/// whether it is a single element. The slot is known only at run time; selecting it with an
/// unrolled compare chain keeps the pointer and offset arrays in registers (a run-time index
/// would move them to local memory in a kernel).
struct traced_slot_ref {
  const void* q;
  std::int64_t off;
  bool single;
};
template <std::size_t M>
CCGRAPH_HOST_DEVICE traced_slot_ref select_slot(const traced_ptrs<M>& p, const std::int64_t* o, int slot) {
  traced_slot_ref r{p[0], o ? o[1] : 0, p.single(0)};
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (std::size_t j = 1; j < M; ++j)
    if (static_cast<int>(j) == slot) r = {p[j], o ? o[j + 1] : 0, p.single(j)};
  return r;
}

/// Input `slot` at element i: p[slot][o[slot + 1] + i] (p[slot][0] for a single element).
template <class T, std::size_t M>
CCGRAPH_HOST_DEVICE T load_slot(const traced_ptrs<M>& p, const std::int64_t* o, int slot, std::int64_t i) {
  const traced_slot_ref s = select_slot(p, o, slot);
  return s.single ? static_cast<const T*>(s.q)[0] : static_cast<const T*>(s.q)[s.off + i];
}

/// Input `slot`'s elements i, ..., i+V-1 of a flat layout (the pack form of load_slot).
template <int V, bool Vec, class T, std::size_t M>
CCGRAPH_HOST_DEVICE elem_pack<T, V> load_slot_pack(const traced_ptrs<M>& p, int slot, std::int64_t i) {
  const traced_slot_ref s = select_slot(p, nullptr, slot);
  if (s.single) return fill_pack<V>(static_cast<const T*>(s.q)[0]);
  return load_pack_at<V, Vec>(static_cast<const T*>(s.q) + i);
}

/// Input `slot`'s elements o[slot + 1], ..., o[slot + 1] + V - 1 (the strided kernel's packs).
template <int V, bool Vec, class T, std::size_t M>
CCGRAPH_HOST_DEVICE elem_pack<T, V> load_slot_pack_off(const traced_ptrs<M>& p, const std::int64_t* o, int slot) {
  const traced_slot_ref s = select_slot(p, o, slot);
  if (s.single) return fill_pack<V>(static_cast<const T*>(s.q)[0]);
  return load_pack_at<V, Vec>(static_cast<const T*>(s.q) + s.off);
}

/// A traced tree leaf: the node's input `slot`, of element type T.
template <class T>
struct traced_slot {
  int slot = -1;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const traced_ptrs<M>& p, const std::int64_t* o, std::int64_t i) const {
    return load_slot<T>(p, o, slot, i);
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const traced_ptrs<M>& p, std::int64_t i) const {
    return load_slot_pack<V, Vec, T>(p, slot, i);
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_off(const traced_ptrs<M>& p, const std::int64_t* o) const {
    return load_slot_pack_off<V, Vec, T>(p, o, slot);
  }
};
/// A traced tree leaf: a scalar.
template <class T>
struct traced_scalar {
  T v;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const traced_ptrs<M>&, const std::int64_t*, std::int64_t) const { return v; }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const traced_ptrs<M>&, std::int64_t) const {
    return fill_pack<V>(v);
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_off(const traced_ptrs<M>&, const std::int64_t*) const {
    return fill_pack<V>(v);
  }
};
/// A traced tree leaf: random operand number R, indexed by offsets o[J] (its own row-major
/// index space, broadcast); `s` is set before each run from that run's draw.
template <class Dist, std::size_t J, std::size_t R>
struct traced_random {
  Dist d;
  philox_stream s;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE typename Dist::value_type load(const traced_ptrs<M>&, const std::int64_t* o,
                                                     std::int64_t i) const {
    return draw_at(d, s, static_cast<std::uint64_t>(o[J] + i));
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<typename Dist::value_type, V> load_pack(const traced_ptrs<M>&,
                                                                       std::int64_t i) const {
    return random_kernel<Dist, J>{d, s}.template load_pack<V, Vec>(i);
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<typename Dist::value_type, V> load_pack_off(const traced_ptrs<M>&,
                                                                           const std::int64_t* o) const {
    return random_kernel<Dist, J>{d, s}.template load_pack<V, Vec>(o[J]);
  }
};
/// A traced op with result type T: computed from its operands (rounded to T: an op over scalars
/// alone computes in their compute type), or read from input `slot` when that is >= 0.
template <class T, class Op, class... Ks>
struct traced_op;
template <class T, class Op, class K0>
struct traced_op<T, Op, K0> {
  int slot = -1;
  K0 a;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const traced_ptrs<M>& p, const std::int64_t* o, std::int64_t i) const {
    return slot >= 0 ? load_slot<T>(p, o, slot, i) : cast<T>(Op::apply(a.load(p, o, i)));
  }
  // The slot test is made once per pack, not once per element.
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const traced_ptrs<M>& p, std::int64_t i) const {
    if (slot >= 0) return load_slot_pack<V, Vec, T>(p, slot, i);
    return to_pack<T>(apply_pack<Op>(a.template load_pack<V, Vec>(p, i)));
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_off(const traced_ptrs<M>& p, const std::int64_t* o) const {
    if (slot >= 0) return load_slot_pack_off<V, Vec, T>(p, o, slot);
    return to_pack<T>(apply_pack<Op>(a.template load_pack_off<V, Vec>(p, o)));
  }
};
template <class T, class Op, class K0, class K1>
struct traced_op<T, Op, K0, K1> {
  int slot = -1;
  K0 a;
  K1 b;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const traced_ptrs<M>& p, const std::int64_t* o, std::int64_t i) const {
    return slot >= 0 ? load_slot<T>(p, o, slot, i) : cast<T>(Op::apply(a.load(p, o, i), b.load(p, o, i)));
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const traced_ptrs<M>& p, std::int64_t i) const {
    if (slot >= 0) return load_slot_pack<V, Vec, T>(p, slot, i);
    return to_pack<T>(apply_pack<Op>(a.template load_pack<V, Vec>(p, i), b.template load_pack<V, Vec>(p, i)));
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_off(const traced_ptrs<M>& p, const std::int64_t* o) const {
    if (slot >= 0) return load_slot_pack_off<V, Vec, T>(p, o, slot);
    return to_pack<T>(
        apply_pack<Op>(a.template load_pack_off<V, Vec>(p, o), b.template load_pack_off<V, Vec>(p, o)));
  }
};
template <class T, class Op, class K0, class K1, class K2>
struct traced_op<T, Op, K0, K1, K2> {
  int slot = -1;
  K0 a;
  K1 b;
  K2 c;
  template <std::size_t M>
  CCGRAPH_HOST_DEVICE T load(const traced_ptrs<M>& p, const std::int64_t* o, std::int64_t i) const {
    return slot >= 0 ? load_slot<T>(p, o, slot, i)
                     : cast<T>(Op::apply(a.load(p, o, i), b.load(p, o, i), c.load(p, o, i)));
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(const traced_ptrs<M>& p, std::int64_t i) const {
    if (slot >= 0) return load_slot_pack<V, Vec, T>(p, slot, i);
    return to_pack<T>(apply_pack<Op>(a.template load_pack<V, Vec>(p, i), b.template load_pack<V, Vec>(p, i),
                                     c.template load_pack<V, Vec>(p, i)));
  }
  template <int V, bool Vec, std::size_t M>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_off(const traced_ptrs<M>& p, const std::int64_t* o) const {
    if (slot >= 0) return load_slot_pack_off<V, Vec, T>(p, o, slot);
    return to_pack<T>(apply_pack<Op>(a.template load_pack_off<V, Vec>(p, o), b.template load_pack_off<V, Vec>(p, o),
                                     c.template load_pack_off<V, Vec>(p, o)));
  }
};

/// The traced tree type of expression X whose random operands are numbered from R (their
/// offsets from M + 1 + R: after the output and the M inputs).
template <class X, std::size_t M, std::size_t R>
struct traced_tree {
  using type = traced_scalar<typename X::stored_type>;  // scalar leaves
};
template <class U, std::size_t M, std::size_t R>
struct traced_tree<symbolic_leaf<U>, M, R> {
  using type = traced_slot<U>;
};
template <class Dist, std::size_t M, std::size_t R>
struct traced_tree<random_leaf<Dist>, M, R> {
  using type = traced_random<Dist, M + 1 + R, R>;
};
template <class Op, class A0, std::size_t M, std::size_t R>
struct traced_tree<pointwise_expr<Op, A0>, M, R> {
  using type = traced_op<typename pointwise_expr<Op, A0>::value_type, Op, typename traced_tree<A0, M, R>::type>;
};
template <class Op, class A0, class A1, std::size_t M, std::size_t R>
struct traced_tree<pointwise_expr<Op, A0, A1>, M, R> {
  static constexpr std::size_t r1 = R + structure<A0>::random_leaves;
  using type = traced_op<typename pointwise_expr<Op, A0, A1>::value_type, Op, typename traced_tree<A0, M, R>::type,
                         typename traced_tree<A1, M, r1>::type>;
};
template <class Op, class A0, class A1, class A2, std::size_t M, std::size_t R>
struct traced_tree<pointwise_expr<Op, A0, A1, A2>, M, R> {
  static constexpr std::size_t r1 = R + structure<A0>::random_leaves;
  static constexpr std::size_t r2 = r1 + structure<A1>::random_leaves;
  using type = traced_op<typename pointwise_expr<Op, A0, A1, A2>::value_type, Op, typename traced_tree<A0, M, R>::type,
                         typename traced_tree<A1, M, r1>::type, typename traced_tree<A2, M, r2>::type>;
};
template <class X, std::size_t M, std::size_t R = 0>
using traced_tree_t = typename traced_tree<std::remove_cvref_t<X>, M, R>::type;

/// Sets every random leaf of tree `k` to its draw of this run (`draws[r]` for leaf r).
template <class K>
void bind_draws(K&, const std::vector<philox_stream>&) {}
template <class Dist, std::size_t J, std::size_t R>
void bind_draws(traced_random<Dist, J, R>& k, const std::vector<philox_stream>& draws) {
  k.s = draws.at(R);
}
template <class T, class Op, class... Ks>
void bind_draws(traced_op<T, Op, Ks...>& k, const std::vector<philox_stream>& draws) {
  bind_draws(k.a, draws);
  if constexpr (sizeof...(Ks) >= 2) bind_draws(k.b, draws);
  if constexpr (sizeof...(Ks) >= 3) bind_draws(k.c, draws);
}

/// What record_expr returns for one sub-expression: its register in the program, its text,
/// its memo key, and its typed tree.
template <class X, std::size_t M, std::size_t R>
struct recorded_part {
  int reg;
  std::string text;
  std::string key;
  traced_tree_t<X, M, R> tree;
};

template <class E>
symbolic<typename E::value_type> materialize(const E& e);

/// True for op nodes with a random operand (dropout).
template <class X>
inline constexpr bool has_random_operand_v = false;
template <class Op, class... Args>
inline constexpr bool has_random_operand_v<pointwise_expr<Op, Args...>> = (is_random_leaf_v<Args> || ...);

/// Walks expression `x` (its random operands numbered from R), appending its instructions;
/// returns its register, text, key and tree. A sub-expression already recorded as a node (its
/// key is in the trace's memo) is read as that node's value instead of being recomputed: a
/// value used by several consumers is computed once. An op with a random operand (dropout)
/// that is not the `root` of the recording becomes a node of its own first, so that every
/// consumer of one dropout expression reads one mask per run, as eagerly.
template <std::size_t M, std::size_t R, class X>
recorded_part<X, M, R> record_expr(const X& x, recorded_expr& rec, const trace_state& st, bool root = false) {
  using P = pointwise_program;
  auto push = [&](typename P::instr ins) {
    rec.program.code.push_back(ins);
    return static_cast<int>(rec.program.code.size()) - 1;
  };
  auto load_input = [&](const value_ref& r) {
    std::size_t i = 0;
    while (i < rec.inputs.size() && !(rec.inputs[i] == r)) ++i;
    if (i == rec.inputs.size()) {
      rec.inputs.push_back(r);
      rec.input_types.push_back(r.src->dtype(r.index));
    }
    typename P::instr ins;
    ins.k = P::kind::load;
    ins.type = r.src->dtype(r.index);
    ins.index = static_cast<int>(i);
    const int reg = push(ins);
    return std::tuple<int, std::string, std::string, int>{reg, "%" + std::to_string(i), value_key(r),
                                                           static_cast<int>(i)};
  };
  if constexpr (is_symbolic_leaf_v<X>) {
    auto [reg, text, key, slot] = load_input(x.value.ref());
    return {reg, text, key, traced_slot<typename X::value_type>{slot}};
  } else if constexpr (is_scalar_leaf_v<X>) {
    using T = typename X::value_type;
    using S = typename X::stored_type;  // the register holds the scalar as the ops read it
    typename P::instr ins;
    ins.k = P::kind::scalar;
    ins.type = dtype_v<S>;
    ins.fill = &P::template fill_block<S>;
    std::memcpy(ins.value, &x.value, sizeof(S));
    const std::string text = scalar_text(x.value);
    // The key names the scalar's type: where(c, 1.f, 0.f) and where(c, 1., 0.) differ.
    return {push(ins), text, text + ":" + std::string(to_string(dtype_v<T>)), traced_scalar<S>{x.value}};
  } else if constexpr (is_random_leaf_v<X>) {
    using Dist = decltype(x.dist);
    auto src = std::make_shared<random_source_of<Dist>>();
    src->d = x.dist;
    src->shape = x.shape();
    src->gen = x.gen;
    rec.program.randoms.push_back(src);
    if (rec.random_site.size() <= R) {
      rec.random_site.resize(R + 1, -1);
      rec.random_shape.resize(R + 1);
    }
    rec.random_site[R] = static_cast<int>(rec.program.randoms.size()) - 1;
    rec.random_shape[R] = x.shape();
    typename P::instr ins;
    ins.k = P::kind::random;
    ins.type = dtype_v<typename Dist::value_type>;
    ins.index = rec.random_site[R];
    const std::string text = random_text(x.dist);
    return {push(ins), text, text + "#" + std::to_string(x.id), traced_random<Dist, M + 1 + R, R>{x.dist, {}}};
  } else if constexpr (is_tensor_leaf_v<X>) {
    CCGRAPH_THROW(error, "trace: a pointwise expression mixes a traced value with a concrete tensor of shape ",
                  shape_str(x.value.shape()), "; pass the tensor to the traced function as an input");
  } else {
    using Op = typename X::op_type;
    using args_t = std::remove_cvref_t<decltype(x.args())>;
    if constexpr (has_random_operand_v<X>) {
      if (!root) {
        const symbolic<typename X::value_type> own = materialize(x);
        auto [reg, t, k, slot] = load_input(own.ref());
        traced_tree_t<X, M, R> tree{};
        tree.slot = slot;
        return {reg, t, k, tree};
      }
    }
    // Record the operands into a scratch copy first: if this whole sub-expression is already a
    // node, none of its instructions are kept.
    recorded_expr scratch = rec;
    std::string text(Op::name), key(Op::name);
    text += '(';
    key += '(';
    int regs[3] = {-1, -1, -1};
    int n = 0;
    traced_tree_t<X, M, R> tree{};
    auto part = [&](const auto& r) {
      regs[n] = r.reg;
      text += (n ? ", " : "") + r.text;
      key += (n ? ", " : "") + r.key;
      ++n;
      return r.tree;
    };
    const auto& args = x.args();
    constexpr std::size_t r1 = R + structure<std::tuple_element_t<0, args_t>>::random_leaves;
    tree.a = part(record_expr<M, R>(std::get<0>(args), scratch, st));
    if constexpr (Op::arity >= 2) tree.b = part(record_expr<M, r1>(std::get<1>(args), scratch, st));
    if constexpr (Op::arity >= 3) {
      constexpr std::size_t r2 = r1 + structure<std::tuple_element_t<1, args_t>>::random_leaves;
      tree.c = part(record_expr<M, r2>(std::get<2>(args), scratch, st));
    }
    text += ')';
    key += ')';
    if (auto it = st.pointwise_memo.find(key); it != st.pointwise_memo.end()) {
      // Random operands inside stay unrecorded (their sites -1): the node drew them.
      auto [reg, t, k, slot] = load_input(it->second);
      tree.slot = slot;
      return {reg, t, k, tree};
    }
    rec = std::move(scratch);
    typename P::instr ins;
    ins.k = P::kind::op;
    ins.type = dtype_v<typename X::value_type>;
    ins.fn = [] {
      // The operands' register types: a scalar's is its stored (compute) type.
      if constexpr (Op::arity == 1)
        return &P::template apply_block<Op, typename X::value_type, typename kernel_value<std::tuple_element_t<0, args_t>>::type>;
      else if constexpr (Op::arity == 2)
        return &P::template apply_block<Op, typename X::value_type, typename kernel_value<std::tuple_element_t<0, args_t>>::type,
                                        typename kernel_value<std::tuple_element_t<1, args_t>>::type>;
      else
        return &P::template apply_block<Op, typename X::value_type, typename kernel_value<std::tuple_element_t<0, args_t>>::type,
                                        typename kernel_value<std::tuple_element_t<1, args_t>>::type,
                                        typename kernel_value<std::tuple_element_t<2, args_t>>::type>;
    }();
    for (int j = 0; j < 3; ++j) ins.args[j] = regs[j];
    const int reg = push(ins);
    if (std::find(rec.op_names.begin(), rec.op_names.end(), Op::name) == rec.op_names.end())
      rec.op_names.emplace_back(Op::name);
    return {reg, text, key, tree};
  }
}

/// A traced tree with the node's input pointers: the kernel tree a device runs (M: the most
/// inputs the expression can have, one per symbolic leaf).
template <class T, class Tree, std::size_t M>
struct traced_kernel {
  traced_ptrs<M> p;
  Tree t;
  CCGRAPH_HOST_DEVICE T load(const std::int64_t* o, std::int64_t i) const { return t.load(p, o, i); }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack(std::int64_t i) const { return t.template load_pack<V, Vec>(p, i); }
  template <int V, bool Vec>
  CCGRAPH_HOST_DEVICE elem_pack<T, V> load_pack_off(const std::int64_t* o) const {
    return t.template load_pack_off<V, Vec>(p, o);
  }
  CCGRAPH_HOST_DEVICE bool aligned16() const {
    bool ok = true;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (std::size_t j = 0; j < M; ++j) ok = ok && (!p[j] || p.single(j) || ::ccgraph::detail::aligned16(p[j]));
    return ok;
  }
};

/// Replays a recorded expression (result type T) on the node's inputs: the block program on
/// the host, the typed tree as one generated kernel on a device. Each run reserves new draws for
/// the random operands, so a dropout mask differs from call to call.
template <class T, class Tree, std::size_t M, std::size_t NR>
struct traced_pointwise_kernel final : pointwise_kernel {
  pointwise_program program;
  Tree tree;
  std::vector<dtype> in_types;
  std::vector<int> random_site;      // by tree index: the program's random source, or -1
  std::vector<shape_t> random_shape;  // by tree index

  traced_pointwise_kernel(recorded_expr rec, Tree t)
      : program(std::move(rec.program)),
        tree(t),
        in_types(std::move(rec.input_types)),
        random_site(std::move(rec.random_site)),
        random_shape(std::move(rec.random_shape)) {
    random_site.resize(NR, -1);
    random_shape.resize(NR);
  }
  any_tensor run(const std::vector<any_tensor>& inputs) const override {
    const device dev = ::ccgraph::detail::visit([](const auto& t) { return t.device(); }, inputs.at(0));
    any_tensor out = tensor<T>::empty(program.result_shape(inputs), dev);
    run_into(inputs, out);
    return out;
  }
  void run_into(const std::vector<any_tensor>& inputs, const any_tensor& out) const override {
    const tensor<T>& o = get_tensor<T>(out, "pointwise");
    const std::vector<philox_stream> draws = program.reserve_draws();
    if (!o.device().is_cpu()) return run_device(inputs, o, draws);
    program.run_into(inputs, out, draws);
  }
  dtype result_dtype(dtype) const override { return dtype_v<T>; }
  void check_inputs(const std::vector<tensor_meta>& in, std::string_view what) const override {
    CCGRAPH_CHECK(in.size() == in_types.size(), what, ": expects ", in_types.size(), " input(s), got ", in.size());
    for (std::size_t k = 0; k < in.size(); ++k)
      CCGRAPH_CHECK(in[k].dtype == in_types[k], what, ": input ", k, " is ", in[k].str(), " but the expression reads ",
                    in_types[k]);
  }
  bool draws_random() const override { return program.draws_random(); }

 private:
  void run_device(const std::vector<any_tensor>& ins, const tensor<T>& out,
                  [[maybe_unused]] const std::vector<philox_stream>& draws) const {
    CCGRAPH_CHECK(ins.size() <= M, "pointwise: ", ins.size(), " inputs for an expression of ", M, " operands");
    traced_kernel<T, Tree, M> k{{}, tree};
    if constexpr (NR > 0) {
      std::vector<philox_stream> by_leaf(NR);
      for (std::size_t r = 0; r < NR; ++r)
        if (random_site[r] >= 0) by_leaf[r] = draws.at(static_cast<std::size_t>(random_site[r]));
      bind_draws(k.t, by_leaf);
    }
    std::array<strides_t, M + 1 + NR> strides;
    strides[0] = out.strides();
    // A slot no input fills (M counts the expression's leaves; an input read twice fills one)
    // and a single element read everywhere (k.p.one) take the output's contiguous strides:
    // neither is read through them, and any other would send the node to the strided kernel.
    const strides_t dense = contiguous_strides(out.shape());
    for (std::size_t j = 0; j < M; ++j) {
      if (j < ins.size()) {
        ::ccgraph::detail::visit([&](const auto& t) {
          CCGRAPH_CHECK(t.device() == out.device(), "pointwise: input ", j, " on ", t.device(),
                        " but the result is on ", out.device());
          k.p.p[j] = t.data();  // orders this stream after a collective still writing it
          if (j < 64 && t.numel() == 1) {
            k.p.one |= std::uint64_t{1} << j;
            strides[j + 1] = dense;
          } else {
            strides[j + 1] = std::decay_t<decltype(t)>::detail_broadcast_strides(t, out.shape());
          }
        }, ins[j]);
      } else {
        strides[j + 1] = dense;
        k.p.p[j] = nullptr;
      }
    }
    if constexpr (NR > 0) {
      for (std::size_t r = 0; r < NR; ++r)
        strides[M + 1 + r] = random_site[r] >= 0 ? broadcast_contiguous_strides(random_shape[r], out.shape())
                                                 : strides_t(out.shape().size(), 0);
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
  constexpr std::size_t max_inputs = structure<E>::tensor_leaves;
  constexpr std::size_t n_random = structure<E>::random_leaves;
  recorded_expr rec;
  auto part = record_expr<max_inputs, 0>(e, rec, *state, true);
  const std::string& text = part.text;
  const std::string& key = part.key;
  if (auto it = state->pointwise_memo.find(key); it != state->pointwise_memo.end())
    return symbolic<T>(state, it->second);
  if (rec.op_names.empty()) return symbolic<T>(state, rec.inputs.at(0));  // the whole expression was a node
  std::string fused = "fused";
  for (auto& n : rec.op_names) fused += "_" + n;
  const std::vector<value_ref> inputs = rec.inputs;
  ops::pointwise op{fused, text,
                    std::make_shared<traced_pointwise_kernel<T, traced_tree_t<E, max_inputs>, max_inputs, n_random>>(
                        std::move(rec), part.tree)};
  node* n = state->g.add(std::move(op), inputs, {}, E::op_type::name);
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

/// Records collective `op` on `args` and one wait_tensor per output; returns the waits' values.
CCGRAPH_DECL std::vector<value_ref> record_collective(trace_state& st, const ops::collective_op& op,
                                                      std::vector<value_ref> args, const group_info& gi);

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
    std::vector<symbolic<T>> outs;
    for (const value_ref& w : record_collective(st, op, std::move(args), gi)) outs.emplace_back(&st, w);
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

template <class T>
template <class U>
symbolic<U> symbolic<T>::to() const {
  static_assert(is_element_v<U>, "symbolic<T>::to<U>: U must be a tensor element type");
  return symbolic<U>(cast<U>(*this));
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

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/trace/impl/ops.ipp>
#endif
