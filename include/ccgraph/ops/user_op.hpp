// ccgraph/ops/user_op.hpp: ops the library does not have (a user's FlashAttention kernel, a fused
// MoE kernel), registered at run time with what a built-in op says through its op_traits: a shape
// function, CPU and CUDA callables and a cost. A registered op is called like a built-in one: on
// tensors it runs, on traced values it records a node that the scheduler reorders, the memory
// planner gives buffers and a CUDA Graph captures. docs/concepts.md "User ops" shows the whole path.
#pragma once

#include <ccgraph/core/config.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/core/visit.hpp>
#include <ccgraph/ops/op_traits.hpp>
#include <ccgraph/tensor/any_tensor.hpp>
#include <ccgraph/tensor/device_runtime.hpp>

namespace ccgraph {

/// What a user op's callables see: its inputs (complete: a pending collective result has been
/// waited for), its outputs (new tensors or the memory plan's buffers, contiguous, of the metas
/// `infer` gave: write every element) and the call's attributes.
struct user_op_call {
  const std::vector<any_tensor>& inputs;   ///< the op's inputs, in call order
  const std::vector<any_tensor>& outputs;  ///< the buffers to write, one per inferred meta
  const std::vector<double>& attrs;        ///< the scalars given at the call (user_op::with)
};

/// A user op's definition: everything ccgraph needs to run, trace, schedule and capture it.
/// `cg::register_op` checks it and returns the op to call.
struct user_op_def {
  /// Unique in the process, "namespace::op" like torch.library's ("mylib::swiglu"); printed in
  /// graphs and named in every error about the op.
  std::string name;
  /// The outputs' metas from the inputs' metas and the attributes; bad input throws (e.g. with
  /// CCGRAPH_CHECK) and the message reaches the caller eager and traced alike. Required.
  std::function<std::vector<tensor_meta>(const std::vector<tensor_meta>& inputs, const std::vector<double>& attrs)>
      infer;
  /// Computes the outputs of host tensors. Required.
  std::function<void(const user_op_call& call)> cpu;
  /// Launches the op on device tensors on `stream` (a cudaStream_t, the calling thread's current
  /// stream) without synchronising, so that it is ordered with ccgraph's own work and recorded by
  /// CUDA Graph capture. Optional: without it, a device tensor is an error naming the op.
  std::function<void(const user_op_call& call, void* stream)> cuda;
  /// What the cost model prices for one call (`op_cost::compute(flops, bytes, peak, dtype)`):
  /// the scheduler decides what overlaps a collective by it, so it is required.
  std::function<op_cost(const cost_args& metas, const std::vector<double>& attrs)> cost;
  /// True when each call draws new random numbers: a CUDA Graph would replay the same ones, so
  /// compiling a graph holding it with cuda_graph = true is refused.
  bool draws_random = false;
};

namespace ops {
/// A call of a registered user op: its name and attributes (printed, hashed and compared, so a
/// cached graph is reused only for the same op with the same attributes) and its definition.
struct user {
  BOOST_HANA_DEFINE_STRUCT(user, (std::string, op), (std::vector<double>, attrs));
  static constexpr std::string_view name = "user_op";
  std::shared_ptr<const user_op_def> def;  // not an attribute: code, identified by `op`
};
}  // namespace ops

namespace detail {

/// Registered user ops by name: a name stands for one definition in the process, which is what
/// makes the name a sound cache key.
struct user_op_registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const user_op_def>, std::less<>> ops;
};
CCGRAPH_DECL user_op_registry& user_ops();

}  // namespace detail

template <>
struct op_traits<ops::user> {
  using O = ops::user;
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::in_run;  // calls the def's cuda callable
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    std::vector<tensor_meta> out = o.def->infer(in, o.attrs);
    CCGRAPH_CHECK(!out.empty(), o.op, ": its infer returned no outputs");
    return out;
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    for (const auto& t : a.in) ::ccgraph::detail::visit([](const auto& x) { x.wait(); }, t);
    std::vector<any_tensor> outs = a.outs;
    if (outs.empty()) {
      outs.reserve(a.metas.size());
      for (const auto& m : a.metas)
        outs.push_back(visit_dtype(m.dtype, [&](auto tag) -> any_tensor {
          return tensor<decltype(tag)>::empty(m.shape, a.dev);
        }));
    }
    const user_op_call call{a.in, outs, o.attrs};
    if (a.dev.is_cpu()) {
      o.def->cpu(call);
    } else {
      CCGRAPH_CHECK(static_cast<bool>(o.def->cuda), o.op, ": tensor on ", a.dev,
                    " but the op was registered without a cuda callable");
      const auto& rt = ::ccgraph::detail::require_device_runtime(o.op.c_str(), a.dev);
      o.def->cuda(call, rt.stream(a.dev));
    }
    return outs;
  }
  static op_cost cost(const O& o, const cost_args& a) { return o.def->cost(a, o.attrs); }
  static bool draws_random(const O& o) { return o.def->draws_random; }
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

/// A registered user op (cg::register_op): call it like a built-in op, on tensors (it runs) or
/// on traced values (it records a node). Cheap to copy.
class user_op {
 public:
  /// The op with these attributes (user_op_call::attrs) for the calls made through the result.
  user_op with(std::vector<double> attrs) const {
    user_op r = *this;
    r.attrs_ = std::move(attrs);
    return r;
  }
  /// Calls the op on one or more tensors (or traced values) of any element types; returns its
  /// only output, which must have the first input's element type. Use `call<R0, R1, ...>` for
  /// several outputs or another element type.
  template <class V, class... Vs>
  V operator()(const V& x, const Vs&... xs) const {
    return std::get<0>(call<typename V::value_type>(x, xs...));
  }
  /// Calls the op; returns its outputs, of element types Rs..., as a tuple.
  template <class... Rs, class V, class... Vs>
  auto call(const V& x, const Vs&... xs) const {
    return detail::apply_op_n<Rs...>(ops::user{def_->name, attrs_, def_}, x, xs...);
  }
  /// The definition it was registered with.
  const user_op_def& def() const { return *def_; }
  /// Its name.
  const std::string& name() const { return def_->name; }

 private:
  friend user_op register_op(user_op_def def);
  explicit user_op(std::shared_ptr<const user_op_def> d) : def_(std::move(d)) {}
  std::shared_ptr<const user_op_def> def_;
  std::vector<double> attrs_;
};

/// Registers a user op: `name` unique in the process (a second definition under a registered name
/// is an error, as in torch.library), `infer`, `cpu` and `cost` required. Returns the op to call.
CCGRAPH_DECL user_op register_op(user_op_def def);

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/user_op.ipp>
#endif
