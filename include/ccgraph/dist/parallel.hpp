// ccgraph/dist/parallel.hpp: tensor-parallel styles (PyTorch's torch.distributed.tensor.parallel):
// colwise_parallel, rowwise_parallel, sequence_parallel, prepare_module_input and
// prepare_module_output, applied by a plan keyed by parameter names to a struct of named
// parameters (a Boost.Hana struct, or a name -> tensor map) by cg::parallelize_module.
//
//   template <class V> struct mlp { BOOST_HANA_DEFINE_STRUCT(mlp, (V, w1), (V, w2)); };
//   const cg::parallelize_plan plan{{"w1", cg::colwise_parallel{}}, {"w2", cg::rowwise_parallel{}}};
//   auto m = cg::parallelize_module(mlp<cg::tensor<float>>{w1, w2}, mesh, plan);  // shards w1, w2
//   auto h = cg::relu(m.linear("w1", x).to_local());  // x Replicate in, Shard(-1) out
//   auto y = m.linear("w2", h);                       // Shard(-1) in, Partial -> Replicate: one all_reduce
//
// Each call returns a dtensor; `.to_local()` gives what PyTorch's use_local_output=True hands
// on (C++ types are static, so the styles have no use_local_output flag). Inside a
// differentiated function the module is rebuilt from its local shards with
// `{.local_shards = true}`, and cg::value_and_grad gives the shards' gradients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/members.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>
#include <boost/hana/tuple.hpp>

#include <ccgraph/core/error.hpp>
#include <ccgraph/dist/dtensor.hpp>
#include <ccgraph/dist/ops.hpp>
#include <ccgraph/dist/placement.hpp>
#include <ccgraph/group/device_mesh.hpp>

namespace ccgraph {

/// PyTorch's ColwiseParallel: a linear's weight (out, in) sharded on dim 0 (its bias, 1-d, on
/// dim 0); the input, laid out as `input_layouts` when local, redistributed to Replicate; the
/// output (Shard(-1)) redistributed to `output_layouts`.
struct colwise_parallel {
  /// How a local input is laid out (Replicate; Shard(seq) after a sequence-parallel block).
  placement input_layouts = replicate();
  /// What the output is redistributed to (Shard(-1): no communication).
  placement output_layouts = shard(-1);
};

/// PyTorch's RowwiseParallel: a linear's weight (out, in) sharded on dim 1 (its bias, 1-d,
/// Replicate); the input, laid out as `input_layouts` when local, redistributed to Shard(-1);
/// the output (Partial(sum)) redistributed to `output_layouts`: Replicate is an all_reduce,
/// Shard(seq) a reduce_scatter (sequence parallel).
struct rowwise_parallel {
  /// How a local input is laid out.
  placement input_layouts = shard(-1);
  /// What the Partial(sum) output is redistributed to.
  placement output_layouts = replicate();
};

/// PyTorch's SequenceParallel: parameters (layer_norm's weight and bias) replicated; a local
/// input is this rank's shard of `sequence_dim`; the output stays sharded there. A replicated
/// parameter's gradient is summed over the ranks (from_local's gradient boundary), or left as
/// each rank's term with parallelize_options::partial_grads.
struct sequence_parallel {
  /// The sequence dim of the activations (1 for (batch, seq, hidden); 0 for (tokens, hidden)).
  std::int64_t sequence_dim = 1;
};

/// PyTorch's PrepareModuleInput: input i, laid out as `input_layouts[i]` when local, is
/// redistributed to `desired_input_layouts[i]` (e.g. Shard(seq) -> Replicate: one all_gather
/// that every linear of an attention block then shares).
struct prepare_module_input {
  /// How each local input is laid out.
  std::vector<placement> input_layouts;
  /// What each input is redistributed to.
  std::vector<placement> desired_input_layouts;
};

/// PyTorch's PrepareModuleOutput: output i, laid out as `output_layouts[i]` when local, is
/// redistributed to `desired_output_layouts[i]`.
struct prepare_module_output {
  /// How each local output is laid out.
  std::vector<placement> output_layouts;
  /// What each output is redistributed to.
  std::vector<placement> desired_output_layouts;
};

/// One of the styles.
using parallel_style =
    std::variant<colwise_parallel, rowwise_parallel, sequence_parallel, prepare_module_input, prepare_module_output>;

/// PyTorch's parallelize_plan: (name, style) pairs. A colwise, rowwise or sequence-parallel
/// entry names a parameter of the module; a prepare_module_input / _output entry names a point
/// of the user's forward (any label) where prepare_input / prepare_output is called.
using parallelize_plan = std::vector<std::pair<std::string, parallel_style>>;

/// Options of parallelize_module.
struct parallelize_options {
  /// The module's tensors are this rank's shards already (as a parallelize_module of the whole
  /// parameters laid them out: its local_params()); they are wrapped by from_local. Inside a
  /// differentiated function, this is how the shards become the function's inputs.
  bool local_shards = false;
  /// Traced: the gradients of the Replicate parameters (sequence_parallel's norms, an unnamed
  /// parameter) stay each rank's Partial(sum) term, as PyTorch's parallelize_module leaves them
  /// (from_local_options::partial_grads); the caller sums them over the mesh where it needs the
  /// whole gradient. By default each is summed in the backward (one all_reduce per parameter).
  bool partial_grads = false;
};

/// "colwise_parallel", "rowwise_parallel", ...
inline const char* style_name(const parallel_style& s) {
  constexpr const char* names[] = {"colwise_parallel", "rowwise_parallel", "sequence_parallel", "prepare_module_input",
                                   "prepare_module_output"};
  return names[s.index()];
}

namespace detail {

/// A module's named dtensor parameters, in the module's order (the part parallel_module and
/// fsdp_module share): lookup by name and the local values. `what` names the owner in errors.
template <class T, class L>
class named_dtensors {
 public:
  /// The parameters' type.
  using dtensor_type = dtensor<T, L>;

  /// The parameters of a module made by `what` ("parallel_module", "fsdp_module").
  named_dtensors(const char* what, std::vector<std::pair<std::string, dtensor_type>> params)
      : what_(what), params_(std::move(params)) {}

  /// The parameter `name` as a dtensor.
  const dtensor_type& param(std::string_view name) const {
    for (const auto& [k, v] : params_)
      if (k == name) return v;
    CCGRAPH_THROW(error, what_, "::param: no parameter '", name, "'; the module has ", names_str());
  }
  /// param(name).
  const dtensor_type& operator[](std::string_view name) const { return param(name); }
  /// The parameters' names, in the module's order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : params_) out.push_back(k);
    return out;
  }
  /// Each parameter's local value (its shard): what a differentiated step takes as inputs, and
  /// what parallelize_module / fully_shard take back with `{.local_shards = true}`.
  std::map<std::string, L> local_params() const {
    std::map<std::string, L> out;
    for (const auto& [k, v] : params_) out.emplace(k, v.local_value());
    return out;
  }

 protected:
  /// "['w1', 'w2']", for errors.
  std::string names_str() const {
    std::string s = "[";
    for (std::size_t i = 0; i < params_.size(); ++i) s += (i ? ", '" : "'") + params_[i].first + "'";
    return s + "]";
  }

  const char* what_;
  std::vector<std::pair<std::string, dtensor_type>> params_;
};

}  // namespace detail

/// A module's parameters laid out by a plan on a 1-d (tensor-parallel) mesh, and the styles'
/// input and output preparation around the calls that use them. L is tensor<T> (eager) or
/// symbolic<T> (traced). Made by cg::parallelize_module.
template <class T, class L = tensor<T>>
class parallel_module : public detail::named_dtensors<T, L> {
 public:
  /// The local value type.
  using local_type = L;
  /// The parameters' type.
  using dtensor_type = dtensor<T, L>;

  /// The parts, as parallelize_module checked them.
  parallel_module(ccgraph::device_mesh mesh, parallelize_plan plan, std::vector<std::pair<std::string, dtensor_type>> params)
      : detail::named_dtensors<T, L>("parallel_module", std::move(params)), mesh_(std::move(mesh)), plan_(std::move(plan)) {}

  /// The mesh.
  const ccgraph::device_mesh& mesh() const { return mesh_; }
  /// The plan.
  const parallelize_plan& plan() const { return plan_; }
  // param(name) (laid out by its style; Replicate without one), operator[], names() and
  // local_params(): detail::named_dtensors.
  /// The style the plan gives `name` (an error naming the plan's entries when none).
  const parallel_style& style(std::string_view name) const {
    for (const auto& [k, s] : plan_)
      if (k == name) return s;
    CCGRAPH_THROW(error, "parallel_module::style: the plan has no entry '", name, "'; it has ", plan_str());
  }

  /// Input `index` of the call the plan names `name`, prepared by its style: a local value is
  /// wrapped by from_local with the style's input layout, then redistributed to the layout the
  /// style wants (colwise: Replicate; rowwise: Shard(-1); prepare_module_input: its desired
  /// layout; sequence_parallel: as it is). A dtensor is taken as it is laid out.
  template <class X>
  dtensor_type prepare_input(std::string_view name, const X& x, std::size_t index = 0) const {
    const parallel_style& s = style(name);
    auto wrap = [&](const placement& p) {
      if constexpr (std::is_same_v<X, dtensor_type>) {
        (void)p;
        return x;
      } else {
        static_assert(std::is_same_v<X, L>, "parallel_module::prepare_input: the input must be the module's local "
                                            "type or a dtensor of it");
        return dtensor_type::from_local(x, mesh_, {p});
      }
    };
    if (const auto* c = std::get_if<colwise_parallel>(&s)) return to(wrap(c->input_layouts), replicate());
    if (const auto* r = std::get_if<rowwise_parallel>(&s)) return to(wrap(r->input_layouts), shard(-1));
    if (const auto* q = std::get_if<sequence_parallel>(&s)) return wrap(shard(q->sequence_dim));
    if (const auto* p = std::get_if<prepare_module_input>(&s)) {
      CCGRAPH_CHECK(index < p->input_layouts.size() && index < p->desired_input_layouts.size(),
                    "parallel_module::prepare_input: '", name, "' (prepare_module_input) has ", p->input_layouts.size(),
                    " input layout(s) and ", p->desired_input_layouts.size(), " desired one(s); input ", index,
                    " has none");
      return to(wrap(p->input_layouts[index]), p->desired_input_layouts[index]);
    }
    CCGRAPH_THROW(error, "parallel_module::prepare_input: '", name, "' is ", style_name(s),
                  ", which prepares outputs, not inputs");
  }

  /// Output `index` of the call the plan names `name`, prepared by its style: redistributed to
  /// the style's output layout (colwise, rowwise, prepare_module_output: a local value is
  /// wrapped with its output_layouts first); sequence_parallel and prepare_module_input leave it.
  template <class X>
  dtensor_type prepare_output(std::string_view name, const X& y, std::size_t index = 0) const {
    const parallel_style& s = style(name);
    const auto* p = std::get_if<prepare_module_output>(&s);
    if (p)
      CCGRAPH_CHECK(index < p->output_layouts.size() && index < p->desired_output_layouts.size(),
                    "parallel_module::prepare_output: '", name, "' (prepare_module_output) has ",
                    p->output_layouts.size(), " output layout(s) and ", p->desired_output_layouts.size(),
                    " desired one(s); output ", index, " has none");
    if constexpr (std::is_same_v<X, dtensor_type>) {
      if (p) return to(y, p->desired_output_layouts[index]);
      if (const auto* c = std::get_if<colwise_parallel>(&s)) return to(y, c->output_layouts);
      if (const auto* r = std::get_if<rowwise_parallel>(&s)) return to(y, r->output_layouts);
      return y;
    } else {
      static_assert(std::is_same_v<X, L>, "parallel_module::prepare_output: the output must be the module's local "
                                          "type or a dtensor of it");
      CCGRAPH_CHECK(p != nullptr, "parallel_module::prepare_output: '", name, "' is ", style_name(s),
                    ", which takes a dtensor output; a local output is only taken by prepare_module_output (it says "
                    "the output's layout)");
      return to(dtensor_type::from_local(y, mesh_, {p->output_layouts[index]}), p->desired_output_layouts[index]);
    }
  }

  /// The linear layer of weight `weight` (and bias `bias`) under the weight's style (colwise
  /// or rowwise): the input prepared, cg::linear on the dtensors, the output prepared.
  template <class X>
  dtensor_type linear(std::string_view weight, const X& x, std::optional<std::string_view> bias = std::nullopt,
                      linear_activation activation = linear_activation::none) const {
    const parallel_style& s = style(weight);
    CCGRAPH_CHECK(std::holds_alternative<colwise_parallel>(s) || std::holds_alternative<rowwise_parallel>(s),
                  "parallel_module::linear: '", weight, "' is ", style_name(s),
                  "; a linear's weight is colwise_parallel or rowwise_parallel");
    const dtensor_type in = prepare_input(weight, x);
    std::optional<dtensor_type> b;
    if (bias) b = this->param(*bias);
    return prepare_output(weight, ccgraph::linear(in, this->param(weight), b, activation));
  }

  /// layer_norm over the last dim with weight `weight` (and bias `bias`), under the weight's
  /// style (sequence_parallel: the input a shard of the sequence dim, the output too).
  template <class X>
  dtensor_type layer_norm(std::string_view weight, const X& x, std::optional<std::string_view> bias = std::nullopt,
                          double eps = 1e-5) const {
    const dtensor_type in = prepare_input(weight, x);
    std::optional<dtensor_type> b;
    if (bias) b = this->param(*bias);
    return prepare_output(weight, ccgraph::layer_norm(in, this->param(weight), b, eps));
  }

 private:
  static dtensor_type to(const dtensor_type& d, const placement& p) {
    const placement want = p.normalized(d.shape().size(), "parallel_module");
    if (d.placements().at(0) == want) return d;
    return d.redistribute(d.mesh(), {want});
  }
  std::string plan_str() const {
    std::string s = "{";
    for (std::size_t i = 0; i < plan_.size(); ++i)
      s += (i ? ", '" : "'") + plan_[i].first + "': " + style_name(plan_[i].second);
    return s + "}";
  }

  ccgraph::device_mesh mesh_;
  parallelize_plan plan_;
};

namespace detail {

/// A parameter value: a tensor or a traced value.
template <class V>
inline constexpr bool is_param_value_v = is_tensor_v<V> || is_symbolic_v<V>;

/// The first parameter-valued type of Vs (void when none).
template <class... Vs>
struct first_param {
  using type = void;
};
template <class V, class... Vs>
struct first_param<V, Vs...> {
  using type = std::conditional_t<is_param_value_v<V>, V, typename first_param<Vs...>::type>;
};
template <class Tuple>
struct first_param_of;
template <class... Vs>
struct first_param_of<boost::hana::tuple<Vs...>> : first_param<std::remove_cvref_t<Vs>...> {};

/// The parameters' local type of a module: a Boost.Hana struct's first tensor member's type, or
/// a map's mapped type.
template <class M, bool = boost::hana::Struct<M>::value>
struct module_local {
  using type = typename first_param_of<std::remove_cvref_t<decltype(boost::hana::members(std::declval<const M&>()))>>::type;
  static_assert(!std::is_void_v<type>, "parallelize_module / fully_shard: the struct has no tensor member");
};
template <class M>
struct module_local<M, false> {
  using type = typename M::mapped_type;
  static_assert(is_param_value_v<type>, "parallelize_module / fully_shard: the module must be a Boost.Hana struct "
                                        "(BOOST_HANA_DEFINE_STRUCT) or a map from names to tensors");
};

/// The named tensors of `module`, in its order (a struct's members whose type is L; a map's
/// entries).
template <class L, class M>
std::vector<std::pair<std::string, L>> named_params(const M& module) {
  std::vector<std::pair<std::string, L>> out;
  if constexpr (boost::hana::Struct<M>::value) {
    boost::hana::for_each(boost::hana::accessors<M>(), [&](auto acc) {
      using V = std::remove_cvref_t<decltype(boost::hana::second(acc)(module))>;
      if constexpr (is_param_value_v<V>) {
        static_assert(std::is_same_v<V, L>,
                      "parallelize_module / fully_shard: every tensor member of the struct must have one type");
        out.emplace_back(boost::hana::to<char const*>(boost::hana::first(acc)), boost::hana::second(acc)(module));
      }
    });
  } else {
    for (const auto& [k, v] : module) out.emplace_back(std::string(k), v);
  }
  return out;
}

}  // namespace detail

/// PyTorch's parallelize_module: lays `module`'s parameters out on the 1-d mesh `mesh` by
/// `plan` (keyed by parameter name): colwise_parallel shards a 2-d weight on dim 0 (a 1-d bias
/// on dim 0), rowwise_parallel a 2-d weight on dim 1 (a 1-d bias stays Replicate),
/// sequence_parallel replicates; a parameter the plan does not name is Replicate. By default
/// each rank holds the whole parameters and keeps its piece (no communication, as PyTorch's
/// distribute_tensor with the same values everywhere); with `{.local_shards = true}` they are
/// this rank's pieces already. `module`: a Boost.Hana struct (its tensor members, by name) or
/// a map from names to tensors. Errors name the call and the values: a plan entry naming no
/// parameter, a style on a tensor of the wrong rank, a dim the mesh does not divide.
template <class M>
auto parallelize_module(const M& module, const device_mesh& mesh, parallelize_plan plan, parallelize_options opts = {}) {
  using L = typename detail::module_local<M>::type;
  using T = typename L::value_type;
  constexpr const char* what = "parallelize_module";
  CCGRAPH_CHECK(mesh.ndim() == 1, what, ": the mesh ", mesh.str(), " has ", mesh.ndim(),
                " dims; tensor parallelism takes a 1-d mesh (pass its tensor-parallel dim: mesh[\"tp\"])");
  const auto params = detail::named_params<L>(module);
  const int n = mesh.size(0);
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const auto& [name, s] = plan[i];
    for (std::size_t j = 0; j < i; ++j)
      CCGRAPH_CHECK(plan[j].first != name, what, ": the plan names '", name, "' twice");
    if (std::holds_alternative<prepare_module_input>(s) || std::holds_alternative<prepare_module_output>(s)) continue;
    bool found = false;
    for (const auto& [k, v] : params) found = found || k == name;
    if (!found) {
      std::string have;
      for (const auto& [k, v] : params) have += (have.empty() ? "'" : ", '") + k + "'";
      CCGRAPH_THROW(error, what, ": the plan names '", name, "' (", style_name(s),
                    "), which is not a parameter of the module; its parameters are [", have, "]");
    }
  }
  std::vector<std::pair<std::string, dtensor<T, L>>> out;
  for (const auto& [name, value] : params) {
    const parallel_style* s = nullptr;
    for (const auto& [k, st] : plan)
      if (k == name) s = &st;
    placement p = replicate();
    if (s && (std::holds_alternative<colwise_parallel>(*s) || std::holds_alternative<rowwise_parallel>(*s))) {
      const bool col = std::holds_alternative<colwise_parallel>(*s);
      const std::size_t rank = value.shape().size();
      CCGRAPH_CHECK(rank == 1 || rank == 2, what, ": '", name, "' (", style_name(*s), ") has shape ",
                    shape_str(value.shape()), "; a linear's weight is 2-d (out, in) and its bias 1-d");
      if (rank == 2) p = shard(col ? 0 : 1);
      else if (col) p = shard(0);
      if (p.is_shard()) {
        const auto d = static_cast<std::size_t>(p.dim());
        const std::int64_t size = opts.local_shards ? value.shape()[d] * n : value.shape()[d];
        CCGRAPH_CHECK(size % n == 0, what, ": '", name, "' (", style_name(*s), ") has shape ",
                      shape_str(value.shape()), ": dim ", d, " (size ", size, ") must be a multiple of the mesh size ",
                      n);
      }
    }
    const from_local_options fl{.partial_grads = opts.partial_grads && p.is_replicate()};
    if (opts.local_shards) {
      out.emplace_back(name, dtensor<T, L>::from_local(value, mesh, {p}, fl));
    } else {
      // Every rank holds the whole parameter: its piece is a local chunk (no communication).
      const auto whole = dtensor<T, L>::from_local(value, mesh, {replicate()}, fl);
      out.emplace_back(name, p.is_replicate() ? whole : whole.redistribute(mesh, {p}));
    }
  }
  return parallel_module<T, L>(mesh, std::move(plan), std::move(out));
}

}  // namespace ccgraph
