// ccgraph/runtime/cpu_collectives.hpp: how a CPU backend computes one member's outputs of a
// collective once every member's request is in hand. The threads backend calls this on each
// rank's communication worker; all members reduce in group order, so every rank's result is
// bitwise identical.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/comm/communicator.hpp>
#include <ccgraph/tensor/strided.hpp>

namespace ccgraph::detail {

/// Applies reduce op `Op` to two values in accumulation type A. bool follows c10d's NCCL
/// mapping (sum and max are "or", product and min are "and"). Integer sums and products wrap
/// modulo 2^bits, as NCCL's do: computed in the unsigned type, whose arithmetic is modular, and
/// converted back (defined since C++20), so an overflowing int32/int64 sum is not undefined.
/// premul_sum adds here: its factor is applied to each input before (reduce_buffers).
template <reduce_kind Op, class A>
inline A reduce_pair(A a, A b) {
  using K = reduce_kind;
  if constexpr (std::is_same_v<A, bool>) {
    if constexpr (Op == K::sum || Op == K::max || Op == K::bor) return a || b;
    else if constexpr (Op == K::bxor) return a != b;
    else return a && b;  // product, min, band
  } else if constexpr (std::is_integral_v<A> && (Op == K::sum || Op == K::avg || Op == K::product)) {
    // At least unsigned int: a narrower unsigned type would promote to (signed) int, whose
    // product can overflow (uint16 x uint16).
    using U = std::common_type_t<std::make_unsigned_t<A>, unsigned>;
    if constexpr (Op == K::product) return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
    else return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else if constexpr (Op == K::sum || Op == K::avg || Op == K::premul_sum) {
    return static_cast<A>(a + b);
  } else if constexpr (Op == K::product) {
    return static_cast<A>(a * b);
  } else if constexpr (Op == K::min) {
    return b < a ? b : a;
  } else if constexpr (Op == K::max) {
    return a < b ? b : a;
  } else if constexpr (std::is_integral_v<A>) {
    if constexpr (Op == K::band) return static_cast<A>(a & b);
    else if constexpr (Op == K::bor) return static_cast<A>(a | b);
    else return static_cast<A>(a ^ b);
  } else {
    return a;  // bitwise ops on floats are rejected by ops::infer before we get here
  }
}

/// Calls `f(std::integral_constant<reduce_kind, op.kind()>{})`: the switch that keeps the op
/// out of the element loop.
template <class F>
void visit_reduce_op(reduce_op op, F&& f) {
  using K = reduce_kind;
  switch (op.kind()) {
    case K::sum: return f(std::integral_constant<K, K::sum>{});
    case K::avg: return f(std::integral_constant<K, K::avg>{});
    case K::product: return f(std::integral_constant<K, K::product>{});
    case K::min: return f(std::integral_constant<K, K::min>{});
    case K::max: return f(std::integral_constant<K, K::max>{});
    case K::band: return f(std::integral_constant<K, K::band>{});
    case K::bor: return f(std::integral_constant<K, K::bor>{});
    case K::bxor: return f(std::integral_constant<K, K::bxor>{});
    case K::premul_sum: return f(std::integral_constant<K, K::premul_sum>{});
  }
}

/// out[i] = reduce over k of ins[k][i], in the order of `ins`, accumulating in compute_t<T>;
/// avg divides the (wrapped) sum by the number of inputs (integer division for integer types,
/// as NCCL); premul_sum multiplies each input by its factor, cast to T (as NCCL's
/// ncclRedOpCreatePreMulSum takes it) and computed in compute_t<T>, then sums.
template <class T>
void reduce_buffers(T* out, const std::vector<const T*>& ins, std::int64_t count, reduce_op op) {
  using A = std::conditional_t<std::is_same_v<T, bool>, bool, compute_t<T>>;
  constexpr std::int64_t block = 1024;  // accumulate a block across all inputs, then store
  A acc[block];
  visit_reduce_op(op, [&](auto opc) {
    constexpr reduce_kind Op = decltype(opc)::value;
    if constexpr (Op == reduce_kind::premul_sum && (std::is_integral_v<A> || std::is_same_v<A, bool>)) {
      CCGRAPH_THROW(error, "premul_sum: needs a floating or complex tensor, got ", dtype_v<T>);  // ops::infer refuses first
    } else {
      [[maybe_unused]] A factor{};
      if constexpr (Op == reduce_kind::premul_sum) factor = static_cast<A>(cast<T>(op.factor()));
      auto load = [&](const T& v) {
        if constexpr (Op == reduce_kind::premul_sum) return static_cast<A>(static_cast<A>(v) * factor);
        else return static_cast<A>(v);
      };
      for (std::int64_t base = 0; base < count; base += block) {
        const std::int64_t len = std::min(block, count - base);
        const T* first = ins[0] + base;
        for (std::int64_t i = 0; i < len; ++i) acc[i] = load(first[i]);
        for (std::size_t k = 1; k < ins.size(); ++k) {
          const T* in = ins[k] + base;
          for (std::int64_t i = 0; i < len; ++i) acc[i] = reduce_pair<Op, A>(acc[i], load(in[i]));
        }
        if constexpr (Op == reduce_kind::avg && std::is_integral_v<A> && !std::is_same_v<A, bool>) {
          // In int64: the count need not fit A (256 ranks averaging u8 would divide by zero).
          const auto n = static_cast<std::int64_t>(ins.size());
          for (std::int64_t i = 0; i < len; ++i) acc[i] = static_cast<A>(static_cast<std::int64_t>(acc[i]) / n);
        } else if constexpr (Op == reduce_kind::avg && !std::is_same_v<A, bool>) {
          const A n = static_cast<A>(ins.size());
          for (std::int64_t i = 0; i < len; ++i) acc[i] = static_cast<A>(acc[i] / n);
        }
        T* o = out + base;
        for (std::int64_t i = 0; i < len; ++i) o[i] = cast<T>(acc[i]);
      }
    }
  });
}

/// Makes an in-place collective safe on a CPU backend, where peers read a member's inputs
/// while it writes its outputs: every input of `req` that shares a byte with one of its outputs
/// is replaced by a private copy. Call it on the member's own worker, before the request is
/// visible to peers (and after earlier collectives of the rank, which may still write the
/// input). Peers then read the copy while this member writes its output in place; the copy is
/// released with the request. A no-op when no output aliases an input (every eager call).
CCGRAPH_DECL void snapshot_aliased_inputs(collective_request& req);

/// One member's view of a collective on a CPU backend, once every member's request is in hand:
/// the moves a collective's op_traits<O>::run_cpu is written in (ops/op_traits.hpp's
/// cpu_member_archetype), on element type T.
template <class T>
struct cpu_member {
  const collective_request& mine;
  const std::vector<const collective_request*>& all;
  int me_;

  int size() const { return static_cast<int>(all.size()); }
  int me() const { return me_; }
  int rank_of(int member) const { return all[static_cast<std::size_t>(member)]->rank; }
  int index_of(int rank) const { return mine.group.index_of(rank); }
  std::size_t tensors() const { return mine.inputs.size(); }
  template <class O>
  const O& op_of(int member) const { return std::get<O>(all[static_cast<std::size_t>(member)]->op); }

  static std::int64_t bytes_of(const buffer& b) { return numel_of(b.meta.shape) * static_cast<std::int64_t>(sizeof(T)); }
  /// Output k = the reduction (in group order) of chunk `chunk` (output-sized) of every member's input k.
  /// Complex elements are reduced as pairs of reals (c10d's view_as_real; ops::infer allows
  /// only the reductions for which that is right: sum, avg, premul_sum).
  void reduce(std::size_t k, reduce_op op, std::int64_t chunk) const {
    const std::int64_t count = numel_of(mine.outputs[k].meta.shape);
    std::vector<const T*> ins;
    for (auto* r : all) ins.push_back(r->inputs[k].template data<T>() + chunk * count);
    if constexpr (is_complex_v<T>) {
      using R = typename T::value_type;
      std::vector<const R*> parts;
      for (const T* p : ins) parts.push_back(reinterpret_cast<const R*>(p));
      reduce_buffers<R>(reinterpret_cast<R*>(mine.outputs[k].template data<T>()), parts, 2 * count, op);
    } else {
      reduce_buffers<T>(mine.outputs[k].template data<T>(), ins, count, op);
    }
  }
  /// Output k = every member's input k, concatenated in group order.
  void gather(std::size_t k) const {
    auto* out = reinterpret_cast<std::byte*>(mine.outputs[k].template data<T>());
    for (auto* r : all) {
      const auto b = bytes_of(r->inputs[k]);
      if (b) std::memcpy(out, r->inputs[k].template data<T>(), static_cast<std::size_t>(b));
      out += b;
    }
  }
  /// Output k = member `member`'s input k (which may be this member's own, in place).
  void copy(int member, std::size_t k) const {
    const auto& src = all[static_cast<std::size_t>(member)]->inputs[k];
    const auto b = bytes_of(src);
    if (b) std::memmove(mine.outputs[k].template data<T>(), src.template data<T>(), static_cast<std::size_t>(b));
  }
  /// Rows [src_row, src_row + rows) of dim 0 of member `member`'s input k into rows
  /// [dst_row, dst_row + rows) of output k.
  void copy_rows(int member, std::size_t k, std::int64_t src_row, std::int64_t dst_row, std::int64_t rows) const {
    const auto& in = all[static_cast<std::size_t>(member)]->inputs[k];
    std::int64_t row = 1;
    for (std::size_t d = 1; d < in.meta.shape.size(); ++d) row *= in.meta.shape[d];
    if (rows * row == 0) return;
    std::memcpy(mine.outputs[k].template data<T>() + dst_row * row, in.template data<T>() + src_row * row,
                static_cast<std::size_t>(rows * row) * sizeof(T));
  }
};

/// Computes member `me`'s outputs of one collective from all members' requests (`all`, in group
/// order): op_traits<O>::run_cpu over a cpu_member. Throws for disagreements only visible with
/// every request in hand (all_to_all split sizes that do not pair up).
CCGRAPH_DECL void run_cpu_collective(const collective_request& mine,
                               const std::vector<const collective_request*>& all, int me);

}  // namespace ccgraph::detail

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/runtime/impl/cpu_collectives.ipp>
#endif
