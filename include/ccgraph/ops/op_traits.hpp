// ccgraph/ops/op_traits.hpp: what a graph op must say about itself. Each op is one type (its
// attributes, a Boost.Hana struct) paired with one `op_traits<O>` specialisation carrying all it
// means, the way CuTe pairs an MMA atom with its MMA_Traits: inference with the user-facing
// errors, aliasing for the memory planner, how it runs, its cost, its collective family, and the
// gradient and sharding slots. Every dispatcher (inference, planner, executors, CPU and NCCL
// collectives, cost model, bucketing) is one visit over the closed op set (ir/node_op.hpp) that
// reads these; an op missing a behaviour fails to compile with a static_assert naming the
// behaviour (the instantiation backtrace names the op). No primary definition: an op without
// traits is an error too. docs/concepts.md "Adding an op" shows a worked example.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/tensor/any_tensor.hpp>

namespace ccgraph {

struct group_info;

/// Everything op `O` means; specialised once per op, next to the op's definition.
template <class O>
struct op_traits;

/// What kind of node an op makes; dispatchers branch on it, never on op types.
enum class op_category : std::uint8_t {
  input,       // a graph input (placeholder)
  output,      // the graph's results
  wait,        // waits for a pending value (wait_tensor)
  pointwise,   // a fused pointwise expression
  compute,     // any other computation (matmul, cat, ...)
  view,        // a view of its input, or a copy when the layout forces one
  collective,  // a collective over a group
};

/// Where an op's outputs live, for the memory planner and the executors.
enum class alias_kind : std::uint8_t {
  fresh,         // written into new (planned) buffers
  view,          // output 0 is a view of input 0 (op_traits<O>::apply_view gives it)
  view_or_copy,  // a view when input 0 is contiguous, else a copy into a new buffer
  identity,      // output 0 is input 0 (wait_tensor)
  external,      // the caller's memory (graph inputs): never planned, never written
};

/// The collectives the cost model prices (NCCL's ncclFunc* that funcol and c10d use, plus
/// all-to-all, which NCCL runs as grouped send/recv, and send_recv: a batch of point-to-point
/// transfers, priced as a two-rank exchange of its bytes).
enum class nccl_coll : std::uint8_t { all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, reduce, send_recv };

/// Which peak rate prices an op's FLOPs.
enum class peak_class : std::uint8_t {
  none,    // bytes only (copies, cat)
  matmul,  // the dtype's matmul (tensor core) peak
  vector,  // the f32 vector rate (pointwise)
};

/// The coalesced family a collective merges into when bucketed (schedule/bucketing.hpp).
enum class bucket_family : std::uint8_t { none, all_reduce, all_gather, reduce_scatter };

/// What the cost model prices: an op's work, described by the op, priced by the model.
struct op_cost {
  /// free: launches nothing (views, waits, graph inputs and outputs); compute: a roofline of
  /// `flops` at `peak` for `dt` and `bytes` of memory traffic; collective: NCCL's `coll` moving
  /// `bytes` (as nccl_collective counts them).
  enum class kind : std::uint8_t { free, compute, collective };
  kind k = kind::free;
  double flops = 0;
  double bytes = 0;
  peak_class peak = peak_class::none;
  ccgraph::dtype dt = ccgraph::dtype::f32;
  nccl_coll coll = nccl_coll::all_reduce;

  /// Launches nothing.
  static op_cost none() { return {}; }
  /// A kernel: max(flops / peak, bytes / bandwidth) plus a launch.
  static op_cost compute(double flops, double bytes, peak_class peak, ccgraph::dtype dt = ccgraph::dtype::f32) {
    return {kind::compute, flops, bytes, peak, dt, nccl_coll::all_reduce};
  }
  /// A collective: `coll` moving `bytes`.
  static op_cost collective(nccl_coll c, double bytes) {
    return {kind::collective, 0, bytes, peak_class::none, ccgraph::dtype::f32, c};
  }
};

/// What an op's inference sees besides its inputs: the group for collectives.
struct infer_ctx {
  const group_info* group = nullptr;
};

/// What an op's cost sees: its input and output metas and, for collectives, the group size.
struct cost_args {
  const std::vector<tensor_meta>& in;
  const std::vector<tensor_meta>& out;
  int group_size = 1;
};

/// What an op's run sees: its inputs, its planned output buffers (one per output, or empty: then
/// it allocates), and its output metas and device.
struct run_args {
  const std::vector<any_tensor>& in;
  const std::vector<any_tensor>& outs;
  const std::vector<tensor_meta>& metas;
  ccgraph::device dev;
};

/// How a compute or pointwise op runs on a device tensor.
enum class device_path : std::uint8_t {
  in_run,     // run() handles device tensors itself, through the device runtime (GEMM, copies) or
              // the generated pointwise kernels
  cuda_impl,  // a `cuda_impl<O>` in the op's .cuh, reached only through <ccgraph/cuda.hpp>, which
              // installs it; host code calls it through detail::run_op
};

/// An op's CUDA run (device_path::cuda_impl): `static std::vector<any_tensor> run(const O&, const
/// run_args&)`, same contract as op_traits<O>::run on device tensors. Specialised in the op's
/// .cuh; <ccgraph/cuda.hpp> static_asserts that every such op of the closed set has one.
template <class O>
struct cuda_impl;

/// The value of a gradient or sharding slot that a later issue fills: `reason` says which.
struct gradient_todo {
  static constexpr std::string_view reason = "issue 15 (autograd) gives each op its gradient rule";
};
/// The gradient slot of an op that passes no gradient to its inputs (argmax, comparisons,
/// integer ops, a max or min all_reduce): cg::grad through it, from an input that is
/// differentiated, is an error naming it. Otherwise `gradient` is a rule type with
/// `template <class C> static void backward(const O&, C& c)` (autograd/grad.hpp's grad_ctx:
/// c.input<U>(i), c.output<U>(k), c.grad<U>(k), c.needs_grad(i), c.add_grad(i, g)) that records
/// the gradients of the inputs with the public ops on traced values: one definition serves the
/// traced and the eager (trace, then run) gradient.
struct not_differentiable {};
/// See gradient_todo.
struct sharding_todo {
  static constexpr std::string_view reason = "issue 16 (DTensor) gives each op its sharding rule";
};
/// The sharding rules ops name in their `sharding` slot: declared here so that op headers stay
/// light, defined in dist/sharding.hpp (each `static std::vector<sharding_strategy>
/// strategies(const O&, const sharding_args&)`), read only by dtensor's op dispatch (dist/ops.hpp).
namespace sharding_rules {
struct pointwise;
struct matmul;
struct bmm;
struct linear;
struct reduction;
struct softmax;
struct softmax_backward;
struct layer_norm;
struct embedding;
struct transpose;
struct permute;
struct reshape;
struct cat;
struct var;
struct extreme;
struct select_reduction;
struct narrow;
struct select;
struct unsqueeze;
struct squeeze;
struct same_as_input;
struct repeat;
struct stack;
struct copy;
struct index_select;
struct gather;
struct scatter_add;
struct cross_entropy;
struct sdpa;
struct elementwise;
}  // namespace sharding_rules

namespace detail {

/// The interface a CPU backend hands a collective's run_cpu: one member's view of a collective
/// once every member's request is in hand (runtime/cpu_collectives.hpp's cpu_member). Declared
/// only: the behaviour check below runs run_cpu's declaration against it.
struct cpu_member_archetype {
  int size() const;                  // members in the group
  int me() const;                    // this member's index
  int rank_of(int member) const;     // a member's global rank (for messages)
  int index_of(int rank) const;      // a global rank's member index, or -1
  std::size_t tensors() const;       // tensors per member (coalesced forms have several)
  template <class O>
  const O& op_of(int member) const;  // a member's op, with its attributes
  void reduce(std::size_t k, reduce_op op, std::int64_t chunk) const;  // output k = reduction of chunk of inputs k
  void gather(std::size_t k) const;  // output k = every member's input k, in group order
  void copy(int member, std::size_t k) const;  // output k = a member's input k
  void copy_rows(int member, std::size_t k, std::int64_t src_row, std::int64_t dst_row,
                 std::int64_t rows) const;                      // rows of a member's input k into output k
};

template <class O>
concept op_has_traits = requires { sizeof(op_traits<O>); };
template <class O>
concept op_has_category = requires {
  { op_traits<O>::category } -> std::convertible_to<op_category>;
};
template <class O>
concept op_has_infer = requires(const O& o, const std::vector<tensor_meta>& in, const infer_ctx& c) {
  { op_traits<O>::infer(o, in, c) } -> std::same_as<std::vector<tensor_meta>>;
};
template <class O>
concept op_has_aliasing = requires {
  { op_traits<O>::aliasing } -> std::convertible_to<alias_kind>;
  { op_traits<O>::in_place_input } -> std::convertible_to<bool>;
};
template <class O>
concept op_has_apply_view = requires(const O& o, const tensor<float>& t) {
  { op_traits<O>::apply_view(o, t) } -> std::same_as<tensor<float>>;
};
template <class O>
concept op_has_run = requires(const O& o, const run_args& a) {
  { op_traits<O>::run(o, a) } -> std::same_as<std::vector<any_tensor>>;
};
template <class O>
concept op_has_run_cpu_collective = requires(const O& o, const cpu_member_archetype& m) {
  { op_traits<O>::run_cpu(o, m) } -> std::same_as<void>;
};
template <class O>
concept op_has_device_path = requires {
  { op_traits<O>::device } -> std::convertible_to<device_path>;
};
template <class O>
concept op_has_cuda_impl = requires(const O& o, const run_args& a) {
  { cuda_impl<O>::run(o, a) } -> std::same_as<std::vector<any_tensor>>;
};
template <class O>
concept op_has_cost = requires(const O& o, const cost_args& a) {
  { op_traits<O>::cost(o, a) } -> std::same_as<op_cost>;
};
template <class O>
concept op_has_bucketing = requires(const O& o) {
  { op_traits<O>::family } -> std::convertible_to<bucket_family>;
  typename op_traits<O>::single_op;
  { op_traits<O>::reduce(o) } -> std::same_as<std::optional<reduce_op>>;
};
template <class O>
concept op_has_coalesce = requires(const O& o) {
  typename op_traits<O>::coalesced_op;
  { op_traits<O>::coalesce(o, 2) } -> std::same_as<typename op_traits<O>::coalesced_op>;
};
/// Optional: `draws_random(o)`, true when each run of the op draws new random numbers (a
/// dropout's pointwise node): a CUDA Graph replay would repeat them, and pieces of it would draw
/// apart. An op without it draws none.
template <class O>
concept op_has_draws_random = requires(const O& o) {
  { op_traits<O>::draws_random(o) } -> std::convertible_to<bool>;
};
template <class O>
concept op_has_gradient = requires { typename op_traits<O>::gradient; };
template <class O>
concept op_has_sharding = requires { typename op_traits<O>::sharding; };

// One requirement per behaviour, each a static_assert whose text names the behaviour; the
// compiler's "required from" backtrace names the op. Dispatchers call the one they use.
#define CCGRAPH_OP_REQUIRE(behaviour, cond)                                                   \
  static_assert(cond, "op_traits: an op lacks `" behaviour "`; see docs/concepts.md \"Adding " \
                      "an op\" (the op is named in the instantiation backtrace)")

template <class O>
constexpr void require_traits() {
  CCGRAPH_OP_REQUIRE("op_traits<O> (no specialisation)", op_has_traits<O>);
}
template <class O>
constexpr void require_category() {
  CCGRAPH_OP_REQUIRE("category", op_has_category<O>);
}
template <class O>
constexpr void require_infer() {
  CCGRAPH_OP_REQUIRE("infer", op_has_infer<O>);
}
template <class O>
constexpr void require_aliasing() {
  CCGRAPH_OP_REQUIRE("aliasing / in_place_input", op_has_aliasing<O>);
}
template <class O>
constexpr void require_apply_view() {
  CCGRAPH_OP_REQUIRE("apply_view (its aliasing is a view)", op_has_apply_view<O>);
}
template <class O>
constexpr void require_run() {
  CCGRAPH_OP_REQUIRE("run", op_has_run<O>);
}
template <class O>
constexpr void require_device_path() {
  CCGRAPH_OP_REQUIRE("device (its device_path: in_run or cuda_impl)", op_has_device_path<O>);
}
template <class O>
constexpr void require_cuda_impl() {
  CCGRAPH_OP_REQUIRE("cuda_impl<O>::run (its device path is cuda_impl; define it in the op's .cuh)",
                     op_has_cuda_impl<O>);
}
template <class O>
constexpr void require_run_cpu_collective() {
  CCGRAPH_OP_REQUIRE("run_cpu (a collective's CPU backend)", op_has_run_cpu_collective<O>);
}
template <class O>
constexpr void require_cost() {
  CCGRAPH_OP_REQUIRE("cost", op_has_cost<O>);
}
template <class O>
constexpr void require_bucketing() {
  CCGRAPH_OP_REQUIRE("family / single_op / reduce (a collective's bucketing)", op_has_bucketing<O>);
}
template <class O>
constexpr void require_coalesce() {
  CCGRAPH_OP_REQUIRE("coalesced_op / coalesce (a collective with a bucket family)", op_has_coalesce<O>);
}
template <class O>
constexpr void require_gradient() {
  CCGRAPH_OP_REQUIRE("gradient (a rule, `using gradient = not_differentiable;`, or `using gradient = gradient_todo;` "
                     "until it has one)",
                     op_has_gradient<O>);
}
template <class O>
constexpr void require_sharding() {
  CCGRAPH_OP_REQUIRE("sharding (declare `using sharding = sharding_todo;` until it has one)",
                     op_has_sharding<O>);
}

/// Every behaviour op `O` must have, given its category and aliasing. Run at the definition
/// of the closed op set, so a forgotten behaviour fails there, not only in some dispatcher.
template <class O>
constexpr bool check_op() {
  require_traits<O>();
  if constexpr (op_has_traits<O>) {
    require_category<O>();
    require_infer<O>();
    require_aliasing<O>();
    require_cost<O>();
    require_gradient<O>();
    require_sharding<O>();
    if constexpr (op_has_category<O> && op_has_aliasing<O>) {
      constexpr op_category c = op_traits<O>::category;
      constexpr alias_kind a = op_traits<O>::aliasing;
      if constexpr (c == op_category::collective) {
        require_run_cpu_collective<O>();
        require_bucketing<O>();
        if constexpr (op_has_bucketing<O>)
          if constexpr (op_traits<O>::family != bucket_family::none) require_coalesce<O>();
      } else if constexpr (a == alias_kind::view || a == alias_kind::view_or_copy) {
        require_apply_view<O>();
      } else if constexpr (c != op_category::input && c != op_category::output) {
        require_run<O>();
        if constexpr (c == op_category::compute || c == op_category::pointwise) require_device_path<O>();
      }
    }
  }
  return true;
}

#undef CCGRAPH_OP_REQUIRE

/// True when op O takes complex (c64/c128) tensors: collectives (they move them, and reduce
/// them as pairs of reals), views, waits, graph inputs and outputs, pointwise expressions (typed
/// code that compiled for the element type), and a compute op whose traits say
/// `static constexpr bool takes_complex = true` (the copies: copy, cat, repeat). Other compute
/// ops' kernels are instantiated for the real dtypes only (visit_dtype).
template <class O>
consteval bool op_takes_complex() {
  using tr = op_traits<O>;
  if constexpr (requires { tr::takes_complex; }) {
    return tr::takes_complex;
  } else {
    return tr::category != op_category::compute;
  }
}

/// True when op O is elementwise: output k's element i reads only element i of each input (a
/// 0-d input broadcast) and a run reads all of element i before writing any of it, so an output
/// may be computed straight into an input of its meta (the memory planner's in-place updates,
/// compile_options::update_inputs). Pointwise expressions are; a compute op says so with
/// `static constexpr bool elementwise = true` (fused_adamw). Without it an op is not: that
/// only costs a copy, never a wrong result.
template <class O>
consteval bool op_elementwise() {
  using tr = op_traits<O>;
  if constexpr (requires { tr::elementwise; }) {
    return tr::elementwise;
  } else {
    return tr::category == op_category::pointwise;
  }
}

/// The error of a complex input to an op that does not take complex tensors, naming the op and
/// the input: "matmul: input 0 is c64[2, 2]; complex tensors are not supported by matmul (...)".
template <class O>
void check_complex_inputs(const std::vector<tensor_meta>& in) {
  if constexpr (!op_takes_complex<O>()) {
    for (std::size_t i = 0; i < in.size(); ++i)
      CCGRAPH_CHECK(!is_complex(in[i].dtype), O::name, ": input ", i, " is ", in[i].str(),
                    "; complex tensors are not supported by ", O::name,
                    " (collectives, copies and views take them; compute ops take real dtypes)");
  }
}

/// Where a cuda_impl op's CUDA run is installed (by <ccgraph/cuda.hpp>, at static
/// initialisation of any nvcc translation unit that includes it without
/// CCGRAPH_CUDA_NO_OP_KERNELS); null in a host-only program.
template <class O>
inline std::vector<any_tensor> (*device_run_slot)(const O&, const run_args&) = nullptr;

/// Runs a compute op: its CUDA run for device tensors when its device path is cuda_impl, else
/// op_traits<O>::run. Eager calls and both executors call this, never traits::run directly.
template <class O>
std::vector<any_tensor> run_op(const O& o, const run_args& a) {
  require_run<O>();
  if constexpr (op_has_device_path<O>) {
    if constexpr (op_traits<O>::device == device_path::cuda_impl) {
      if (!a.dev.is_cpu()) {
        const auto f = device_run_slot<O>;
        CCGRAPH_CHECK(f != nullptr, O::name, ": tensor on ", a.dev,
                      " but no CUDA kernel is installed for it; include <ccgraph/cuda.hpp> in a "
                      "translation unit compiled by nvcc without CCGRAPH_CUDA_NO_OP_KERNELS, and link "
                      "ccgraph::cuda");
        return f(o, a);
      }
    }
  }
  return op_traits<O>::run(o, a);
}

/// How an op applies to values of type V: specialised for tensors (ops/compute_ops.hpp: infer,
/// then apply_view or run) and for traced values (trace/symbolic.hpp: records the node).
template <class V>
struct op_apply;

/// Where eager and traced calls of an op meet: a public op function is
/// `return detail::apply_op(ops::my_op{attrs}, x, ...)`, generic over tensors and traced values.
template <class O, class V, class... Vs>
V apply_op(const O& o, const V& x, const Vs&... xs) {
  require_traits<O>();
  return op_apply<V>::apply(o, x, xs...);
}

/// apply_op for ops with several outputs (of element types Rs...), inputs of mixed element
/// types, or optional inputs: a std::tuple of the outputs. `auto [values, indices] =
/// detail::apply_op_n<T, std::int64_t>(ops::max_dim{..}, x);`. Dispatches on the first input
/// through op_apply<V>, a class template: found where the call is instantiated, so a public op
/// function defined before trace/symbolic.hpp (ops headers come first) still records nodes on
/// traced values (a qualified call to an overload declared later would not find it).
template <class... Rs, class O, class V, class... Vs>
auto apply_op_n(const O& o, const V& x, const Vs&... xs) {
  require_traits<O>();
  return op_apply<V>::template apply_n<Rs...>(o, x, xs...);
}

/// apply_op for ops over a list of inputs of one kind giving a list of outputs of element type R
/// (cat, stack, split); dispatches as apply_op_n.
template <class R, class O, class V>
auto apply_op_list(const O& o, const std::vector<V>& xs) {
  require_traits<O>();
  return op_apply<V>::template apply_list<R>(o, xs);
}

}  // namespace detail

/// The op's name: "all_reduce", "matmul", ...
template <class O>
inline constexpr std::string_view op_name_v = O::name;

}  // namespace ccgraph
