// ccgraph/ops/compute_ops.hpp: the one definition of each non-collective graph op: attributes (a
// Boost.Hana struct), and shape/dtype inference with the same messages as the eager calls,
// because it runs the eager code's own shape functions (matmul_shape, cat_shape, the tensor
// view methods on storage-less tensors).
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/core/visit.hpp>
#include <ccgraph/expr/fwd.hpp>
#include <ccgraph/ops/matmul.hpp>
#include <ccgraph/ops/op_traits.hpp>
#include <ccgraph/ops/shape_ops.hpp>
#include <ccgraph/tensor/any_tensor.hpp>

namespace ccgraph {
namespace detail {

/// Runs a recorded pointwise expression on new inputs (one per distinct graph input of the
/// node): what the executors call for a `pointwise` node. Made by the tracer from the
/// expression's type, so it is the same one-loop code eager evaluation runs.
struct pointwise_kernel {
  virtual ~pointwise_kernel() = default;
  /// The element type of the result, given the first input's (a comparison's is bool).
  virtual dtype result_dtype(dtype first_input) const { return first_input; }
  /// Checks the inputs' element types for node `what` (an expression may mix them: where reads
  /// a bool condition); by default they must all be one.
  virtual void check_inputs(const std::vector<tensor_meta>& in, std::string_view what) const {
    for (auto& m : in)
      CCGRAPH_CHECK(m.dtype == in.front().dtype, what, ": mixing dtypes: ", in.front().str(), " and ", m.str());
  }
  /// True when each run draws new random numbers (dropout): results differ from run to run, so
  /// a run cannot be recorded once and replayed (CUDA Graphs) or split into pieces that draw
  /// apart (decompose).
  virtual bool draws_random() const { return false; }
  /// Evaluates into a new tensor.
  virtual any_tensor run(const std::vector<any_tensor>& inputs) const = 0;
  /// Evaluates into `out` (the node's dtype and shape; an executor's planned buffer, which
  /// shares no byte with the inputs). By default evaluates into a new tensor and copies.
  virtual void run_into(const std::vector<any_tensor>& inputs, const any_tensor& out) const {
    const any_tensor r = run(inputs);
    ::ccgraph::detail::visit(
        [&](const auto& o) {
          using X = std::decay_t<decltype(o)>;
          auto dst = o;
          dst.copy_(std::get<X>(r));
        },
        out);
  }
};

/// Number of op applications in a pointwise node's expression text ("mul(relu(%0), 2.)" has
/// 2): every name directly followed by '('.
CCGRAPH_DECL std::size_t expr_op_count(std::string_view expr);

/// A storage-less tensor with `m`'s shape: lets inference reuse the tensor view methods.
template <class T>
tensor<T> meta_tensor(const tensor_meta& m) {
  return tensor<T>(nullptr, m.shape, contiguous_strides(m.shape), 0);
}

}  // namespace detail

namespace ops {

/// A graph input.
struct placeholder {
  BOOST_HANA_DEFINE_STRUCT(placeholder, (int, index), (bool, pending));
  static constexpr std::string_view name = "placeholder";
};
/// The graph's results.
struct output {
  BOOST_HANA_DEFINE_STRUCT(output);
  static constexpr std::string_view name = "output";
};
/// Waits for a collective's output (or a pending graph input).
struct wait_tensor {
  BOOST_HANA_DEFINE_STRUCT(wait_tensor);
  static constexpr std::string_view name = "wait_tensor";
};
/// torch.matmul.
struct matmul {
  BOOST_HANA_DEFINE_STRUCT(matmul);
  static constexpr std::string_view name = "matmul";
};
/// A fused chain of pointwise ops, evaluated in one loop. `fused` is its op_sequence name
/// ("fused_relu_mul"), `expr` the expression over the node's inputs ("mul(relu(%0), 2)").
struct pointwise {
  BOOST_HANA_DEFINE_STRUCT(pointwise, (std::string, fused), (std::string, expr));
  static constexpr std::string_view name = "pointwise";
  std::shared_ptr<const ::ccgraph::detail::pointwise_kernel> kernel;  // not an attribute: code, not data
};
/// torch.cat.
struct cat {
  BOOST_HANA_DEFINE_STRUCT(cat, (std::int64_t, dim));
  static constexpr std::string_view name = "cat";
};
/// torch.stack: equal-shaped inputs along a new dim `dim`.
struct stack {
  BOOST_HANA_DEFINE_STRUCT(stack, (std::int64_t, dim));
  static constexpr std::string_view name = "stack";
};
/// Tensor.repeat.
struct repeat {
  BOOST_HANA_DEFINE_STRUCT(repeat, (std::vector<std::int64_t>, repeats));
  static constexpr std::string_view name = "repeat";
};
/// copy_(dst, src) made functional: a new value with dst's meta holding src (broadcast).
struct copy {
  BOOST_HANA_DEFINE_STRUCT(copy);
  static constexpr std::string_view name = "copy";
};
/// Tensor.reshape (a view when the layout allows).
struct reshape {
  BOOST_HANA_DEFINE_STRUCT(reshape, (std::vector<std::int64_t>, shape));
  static constexpr std::string_view name = "reshape";
};
/// Tensor.narrow (a view).
struct narrow {
  BOOST_HANA_DEFINE_STRUCT(narrow, (std::int64_t, dim), (std::int64_t, start), (std::int64_t, length));
  static constexpr std::string_view name = "narrow";
};
/// Tensor.transpose (a view).
struct transpose {
  BOOST_HANA_DEFINE_STRUCT(transpose, (std::int64_t, dim0), (std::int64_t, dim1));
  static constexpr std::string_view name = "transpose";
};
/// Tensor.permute (a view).
struct permute {
  BOOST_HANA_DEFINE_STRUCT(permute, (std::vector<std::int64_t>, dims));
  static constexpr std::string_view name = "permute";
};
/// Tensor.select (a view).
struct select {
  BOOST_HANA_DEFINE_STRUCT(select, (std::int64_t, dim), (std::int64_t, index));
  static constexpr std::string_view name = "select";
};
/// Tensor.unsqueeze (a view).
struct unsqueeze {
  BOOST_HANA_DEFINE_STRUCT(unsqueeze, (std::int64_t, dim));
  static constexpr std::string_view name = "unsqueeze";
};
/// Tensor.contiguous (a copy only when needed).
struct contiguous {
  BOOST_HANA_DEFINE_STRUCT(contiguous);
  static constexpr std::string_view name = "contiguous";
};

namespace detail {
CCGRAPH_DECL void expect_inputs(std::string_view what, const std::vector<tensor_meta>& in, std::size_t n);
CCGRAPH_DECL void expect_same_dtype(std::string_view what, const std::vector<tensor_meta>& in);

/// Applies a tensor view method to a storage-less tensor of meta `m`: its shape, and its errors.
template <class F>
tensor_meta view_meta(const tensor_meta& m, F&& f) {
  return visit_any_dtype(m.dtype, [&](auto tag) {
    auto t = f(ccgraph::detail::meta_tensor<decltype(tag)>(m));
    return tensor_meta{m.dtype, t.shape()};
  });
}

inline double meta_bytes(const tensor_meta& m) { return double(numel_of(m.shape)) * double(element_size(m.dtype)); }
CCGRAPH_DECL double meta_bytes(const std::vector<tensor_meta>& ms);

/// The planned buffer for output k, or a new tensor of its meta.
template <class T>
tensor<T> out_or_new(std::string_view what, const run_args& a, std::size_t k = 0) {
  return a.outs.empty() ? tensor<T>::empty(a.metas.at(k).shape, a.dev) : get_tensor<T>(a.outs.at(k), what.data());
}

/// Inference of a view op: its apply_view on a storage-less tensor (the shape and the errors
/// of the tensor's own view method).
template <class O>
std::vector<tensor_meta> infer_view(const O& o, const std::vector<tensor_meta>& in) {
  expect_inputs(O::name, in, 1);
  return {view_meta(in[0], [&](const auto& t) { return op_traits<O>::apply_view(o, t); })};
}

/// How every view op runs: its apply_view on the input, or, when the planner gave it a buffer
/// (a view_or_copy op whose input layout forces a copy), a copy into that buffer.
template <class O>
std::vector<any_tensor> run_view(const O& o, const run_args& a) {
  return {visit_any_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
    using T = decltype(tag);
    const tensor<T>& x = get_tensor<T>(a.in.at(0), O::name.data());
    if (a.outs.empty()) return op_traits<O>::apply_view(o, x);
    auto r = get_tensor<T>(a.outs[0], O::name.data());
    r.reshape(x.shape()).copy_(x);
    return r;
  })};
}

}  // namespace detail
}  // namespace ops

namespace detail {
/// The gradient of a fused pointwise node (defined in autograd/pointwise_grad.hpp).
template <class C>
void pointwise_backward(const ops::pointwise& o, C& c);
}  // namespace detail

namespace detail {
/// The general form of apply_op on tensors, for ops with several outputs, inputs of mixed
/// element types, or a list of inputs: infer (the errors), then run_op; the outputs, erased.
template <class O>
std::vector<any_tensor> apply_op_erased(const O& o, const std::vector<any_tensor>& ins) {
  using traits = op_traits<O>;
  require_infer<O>();
  static_assert(traits::aliasing == alias_kind::fresh,
                "apply_op_erased: views go through apply_op (their output aliases input 0)");
  std::vector<tensor_meta> in;
  in.reserve(ins.size());
  for (const auto& t : ins) in.push_back(meta_of(t));
  check_complex_inputs<O>(in);
  const std::vector<tensor_meta> metas = traits::infer(o, in, infer_ctx{});
  const device dev = ins.empty() ? default_device() : ::ccgraph::detail::visit([](const auto& t) { return t.device(); }, ins[0]);
  const std::vector<any_tensor> none;
  return run_op(o, run_args{ins, none, metas, dev});
}

/// An op on tensors, now: its inference (the errors users see), then its apply_view or run.
template <element T>
struct op_apply<tensor<T>> {
  template <class O, class... Ts>
  static tensor<T> apply(const O& o, const tensor<T>& x, const Ts&... xs) {
    using traits = op_traits<O>;
    require_infer<O>();
    static_assert(!is_complex_v<T> || op_takes_complex<O>(),
                  "ccgraph: this op does not take complex tensors (collectives, copies and views do; compute ops "
                  "take real dtypes): the op is named in the instantiation backtrace");
    const std::vector<tensor_meta> in{tensor_meta{dtype_v<T>, x.shape()}, tensor_meta{dtype_v<T>, xs.shape()}...};
    const std::vector<tensor_meta> metas = traits::infer(o, in, infer_ctx{});
    if constexpr (traits::aliasing == alias_kind::view || traits::aliasing == alias_kind::view_or_copy) {
      require_apply_view<O>();
      return traits::apply_view(o, x);
    } else {
      const std::vector<any_tensor> ins{any_tensor(x), any_tensor(xs)...};
      const std::vector<any_tensor> none;
      auto out = run_op(o, run_args{ins, none, metas, x.device()});
      return get_tensor<T>(out.at(0), O::name.data());
    }
  }
  /// apply_op_n (ops/op_traits.hpp) on tensors: inputs of any element types, outputs Rs....
  template <class... Rs, class O, class... Ts>
  static std::tuple<tensor<Rs>...> apply_n(const O& o, const tensor<Ts>&... xs) {
    static_assert((!is_complex_v<Ts> && ...) || op_takes_complex<O>(),
                  "ccgraph: this op does not take complex tensors (collectives, copies and views do; compute ops "
                  "take real dtypes): the op is named in the instantiation backtrace");
    const std::vector<any_tensor> outs = apply_op_erased(o, {any_tensor(xs)...});
    CCGRAPH_CHECK(outs.size() == sizeof...(Rs), O::name, ": expected ", sizeof...(Rs), " outputs, the op gave ",
                  outs.size());
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<tensor<Rs>...>{get_tensor<Rs>(outs[I], O::name.data())...};
    }(std::index_sequence_for<Rs...>{});
  }
  /// apply_op_list on tensors.
  template <class R, class O>
  static std::vector<tensor<R>> apply_list(const O& o, const std::vector<tensor<T>>& xs) {
    static_assert(!is_complex_v<T> || op_takes_complex<O>(),
                  "ccgraph: this op does not take complex tensors (collectives, copies and views do; compute ops "
                  "take real dtypes): the op is named in the instantiation backtrace");
    const std::vector<any_tensor> outs = apply_op_erased(o, std::vector<any_tensor>(xs.begin(), xs.end()));
    std::vector<tensor<R>> r;
    r.reserve(outs.size());
    for (const auto& t : outs) r.push_back(get_tensor<R>(t, O::name.data()));
    return r;
  }
};

/// What a public op function takes: a tensor, or a traced value (symbolic<T>).
template <class X>
concept op_value = tensor_type<X> || is_symbolic_v<std::remove_cvref_t<X>>;
}  // namespace detail

// ---- the traits of each non-collective op ----
// `run` is a member template (Args is always run_args) so that its kernels are compiled only in
// the translation units whose executors or eager calls use the op, not in every one that
// includes the umbrella header.

template <>
struct op_traits<ops::placeholder> {
  using O = ops::placeholder;
  static constexpr op_category category = op_category::input;
  static constexpr alias_kind aliasing = alias_kind::external;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>&, const infer_ctx&) { return {}; }
  static op_cost cost(const O&, const cost_args&) { return op_cost::none(); }
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

template <>
struct op_traits<ops::output> {
  using O = ops::output;
  static constexpr op_category category = op_category::output;
  static constexpr alias_kind aliasing = alias_kind::fresh;  // it has no outputs
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>&, const infer_ctx&) { return {}; }
  static op_cost cost(const O&, const cost_args&) { return op_cost::none(); }
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

template <>
struct op_traits<ops::wait_tensor> {
  using O = ops::wait_tensor;
  static constexpr op_category category = op_category::wait;
  static constexpr alias_kind aliasing = alias_kind::identity;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {in[0]};
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O&, const Args& a) {
    ::ccgraph::detail::visit([](const auto& t) { t.wait(); }, a.in.at(0));
    return {a.in[0]};
  }
  static op_cost cost(const O&, const cost_args&) { return op_cost::none(); }
  /// The wait passes its gradient through.
  struct gradient {
    template <class C>
    static void backward(const O&, C& c) { c.add_grad(0, c.grad()); }
  };
  using sharding = sharding_todo;
};

template <>
struct op_traits<ops::matmul> {
  using O = ops::matmul;
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::in_run;  // device_runtime / generated kernels
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 2);
    ops::detail::expect_same_dtype(O::name, in);
    CCGRAPH_CHECK(in[0].dtype != dtype::boolean, "matmul: bool tensors are not supported");
    return {{in[0].dtype, detail::matmul_shape(in[0].shape, in[1].shape)}};
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O&, const Args& a) {
    return {visit_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        CCGRAPH_THROW(error, "matmul: bool tensors are not supported");
      } else {
        const auto& x = get_tensor<T>(a.in.at(0), "matmul");
        const auto& y = get_tensor<T>(a.in.at(1), "matmul");
        if (a.outs.empty()) return ccgraph::matmul(x, y);
        auto r = ops::detail::out_or_new<T>(O::name, a);
        detail::matmul_into(r, x, y);
        return r;
      }
    })};
  }
  /// 2MNK FLOPs at the dtype's matmul peak; operands and result as bytes.
  static op_cost cost(const O&, const cost_args& a) {
    const double flops = double(detail::matmul_flops(a.in.at(0).shape, a.in.at(1).shape));
    return op_cost::compute(flops, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out),
                            peak_class::matmul, a.in[0].dtype);
  }
  /// dA = dC Bᵀ, dB = Aᵀ dC, with 1-d operands as a row / column and broadcast batch dims summed.
  struct gradient {
    template <class C>
    static void backward(const O&, C& c) {
      auto a = c.input(0), b = c.input(1), g = c.grad();
      const bool a1 = a.dim() == 1, b1 = b.dim() == 1;
      if (a1) a = a.reshape({1, a.size(0)});
      if (b1) b = b.reshape({b.size(0), 1});
      shape_t gs = g.shape();  // the product's shape with the dims of 1-d operands kept
      if (a1) gs.insert(gs.end() - (b1 ? 0 : 1), 1);
      if (b1) gs.push_back(1);
      if (gs != g.shape()) g = g.reshape(gs);
      auto back = [&](auto v, std::size_t i) { return v.shape() == c.input(i).shape() ? v : v.reshape(c.input(i).shape()); };
      // An operand transposed from a tensor (x @ w.T) gets its gradient as the transpose of the
      // product in that tensor's layout, (dCᵀ A)ᵀ or (B dCᵀ)ᵀ: the same sums, and w's gradient
      // is contiguous (grad_ctx::input_is_transposed). Only where no batch dim is broadcast.
      const bool same_batch = !a1 && !b1 && a.dim() == b.dim() &&
                              std::equal(a.shape().begin(), a.shape().end() - 2, b.shape().begin());
      if (c.needs_grad(0)) {
        if (same_batch && c.input_is_transposed(0))
          c.add_grad(0, matmul(b, g.transpose(-2, -1)).transpose(-2, -1));
        else
          c.add_grad(0, back(c.sum_to(matmul(g, b.transpose(-2, -1)), a.shape()), 0));
      }
      if (c.needs_grad(1)) {
        if (same_batch && c.input_is_transposed(1))
          c.add_grad(1, matmul(g.transpose(-2, -1), a).transpose(-2, -1));
        else
          c.add_grad(1, back(c.sum_to(matmul(a.transpose(-2, -1), g), b.shape()), 1));
      }
    }
  };
  using sharding = sharding_rules::matmul;
};

template <>
struct op_traits<ops::pointwise> {
  using O = ops::pointwise;
  static constexpr op_category category = op_category::pointwise;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::in_run;  // device_runtime / generated kernels
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    CCGRAPH_CHECK(!in.empty(), "pointwise: needs at least one tensor input");
    // The recorded expression knows its element types (it may mix them: comparisons, where);
    // without one, every input and the result share one.
    if (o.kernel)
      o.kernel->check_inputs(in, o.fused);
    else
      ops::detail::expect_same_dtype("pointwise", in);
    shape_t s = in[0].shape;
    for (auto& m : in) s = broadcast_shapes(s, m.shape, o.fused.c_str());
    return {{o.kernel ? o.kernel->result_dtype(in[0].dtype) : in[0].dtype, s}};
  }
  /// The recorded expression (the same one-loop code eager evaluation runs).
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    CCGRAPH_CHECK(o.kernel != nullptr, "pointwise: node ", o.fused, " has no kernel");
    if (a.outs.empty()) return {o.kernel->run(a.in)};
    o.kernel->run_into(a.in, a.outs[0]);
    return {a.outs[0]};
  }
  /// A recorded dropout draws new numbers on every run.
  static bool draws_random(const O& o) { return o.kernel && o.kernel->draws_random(); }
  /// (output elements x ops in the fused expression) FLOPs at the f32 vector rate, inputs and
  /// output as bytes.
  static op_cost cost(const O& o, const cost_args& a) {
    const double flops = double(numel_of(a.out.at(0).shape)) * double(std::max<std::size_t>(1, detail::expr_op_count(o.expr)));
    return op_cost::compute(flops, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::vector);
  }
  /// Each op of the fused expression differentiated by its pointwise_gradient (expr/functors.hpp),
  /// intermediates recomputed from the node's inputs (autograd/pointwise_grad.hpp).
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) { detail::pointwise_backward(o, c); }
  };
  using sharding = sharding_rules::pointwise;
};

template <>
struct op_traits<ops::cat> {
  using O = ops::cat;
  static constexpr op_category category = op_category::compute;
  static constexpr bool takes_complex = true;  // moves elements only
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::in_run;  // device_runtime / generated kernels
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_same_dtype(O::name, in);
    std::vector<shape_t> shapes;
    for (auto& m : in) shapes.push_back(m.shape);
    shape_t out = detail::cat_shape(shapes, o.dim);  // first: it rejects an empty list
    return {{in.front().dtype, std::move(out)}};
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return {visit_any_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
      using T = decltype(tag);
      std::vector<tensor<T>> xs;
      for (const auto& t : a.in) xs.push_back(get_tensor<T>(t, "cat"));
      if (a.outs.empty()) return ccgraph::cat(xs, o.dim);
      auto r = ops::detail::out_or_new<T>(O::name, a);
      detail::cat_kernel(xs, o.dim, r);
      return r;
    })};
  }
  /// Bytes only: reads its inputs, writes its result.
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::compute(0, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::none);
  }
  /// Each input gets its slice of the gradient.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      const auto g = c.grad();
      const int d = normalize_dim(o.dim, g.shape().size(), "cat");
      std::int64_t off = 0;
      for (std::size_t i = 0; i < c.num_inputs(); ++i) {
        const auto x = c.input(i);
        const std::int64_t len = x.dim() > d ? x.size(d) : 0;
        if (c.needs_grad(i)) c.add_grad(i, g.narrow(d, off, len));
        off += len;
      }
    }
  };
  using sharding = sharding_rules::cat;
};

template <>
struct op_traits<ops::stack> {
  using O = ops::stack;
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::in_run;  // stack_kernel's copies run on any device
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    std::vector<shape_t> shapes;
    for (auto& m : in) shapes.push_back(m.shape);
    shape_t out = detail::stack_shape(shapes, o.dim);  // first: it rejects an empty list
    ops::detail::expect_same_dtype(O::name, in);
    return {{in.front().dtype, std::move(out)}};
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return {visit_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
      using T = decltype(tag);
      std::vector<tensor<T>> xs;
      for (const auto& t : a.in) xs.push_back(get_tensor<T>(t, "stack"));
      auto r = ops::detail::out_or_new<T>(O::name, a);
      detail::stack_kernel(xs, o.dim, r);
      return r;
    })};
  }
  /// Bytes only: reads its inputs, writes its result.
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::compute(0, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::none);
  }
  /// Each input gets its slice of the gradient along the new dim.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      const auto g = c.grad();
      const int d = normalize_dim(o.dim, g.shape().size(), "stack");
      for (std::size_t i = 0; i < c.num_inputs(); ++i)
        if (c.needs_grad(i)) c.add_grad(i, g.select(d, static_cast<std::int64_t>(i)));
    }
  };
  using sharding = sharding_rules::stack;
};

template <>
struct op_traits<ops::repeat> {
  using O = ops::repeat;
  static constexpr op_category category = op_category::compute;
  static constexpr bool takes_complex = true;  // moves elements only
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::in_run;  // device_runtime / generated kernels
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 1);
    return {{in[0].dtype, tensor<float>::repeat_shape(in[0].shape, o.repeats)}};
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O& o, const Args& a) {
    return {visit_any_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
      using T = decltype(tag);
      const auto& x = get_tensor<T>(a.in.at(0), "repeat");
      if (a.outs.empty()) return x.repeat(o.repeats);
      auto r = ops::detail::out_or_new<T>(O::name, a);
      detail::repeat_into(r, x, o.repeats);
      return r;
    })};
  }
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::compute(0, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::none);
  }
  /// The gradient summed over the repeats: viewed as [r0, s0, r1, s1, ...], summed over the r dims.
  struct gradient {
    template <class C>
    static void backward(const O& o, C& c) {
      const auto x = c.input(0);
      const std::size_t extra = o.repeats.size() - x.shape().size();
      shape_t split;
      std::vector<std::int64_t> dims;
      for (std::size_t d = 0; d < o.repeats.size(); ++d) {
        dims.push_back(static_cast<std::int64_t>(split.size()));
        split.push_back(o.repeats[d]);
        split.push_back(d < extra ? 1 : x.shape()[d - extra]);
      }
      c.add_grad(0, sum(c.grad().reshape(split), dims).reshape(x.shape()));
    }
  };
  using sharding = sharding_rules::repeat;
};

template <>
struct op_traits<ops::copy> {
  using O = ops::copy;
  static constexpr op_category category = op_category::compute;
  static constexpr bool takes_complex = true;  // moves elements only
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::in_run;  // device_runtime / generated kernels
  static std::vector<tensor_meta> infer(const O&, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(O::name, in, 2);
    CCGRAPH_CHECK(broadcast_shapes(in[0].shape, in[1].shape, "copy_") == in[0].shape, "copy_: source of shape ",
                  shape_str(in[1].shape), " cannot be broadcast to destination shape ", shape_str(in[0].shape));
    return {in[0]};
  }
  template <class Args = run_args>
  static std::vector<any_tensor> run(const O&, const Args& a) {
    return {visit_any_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
      using T = decltype(tag);
      auto r = ops::detail::out_or_new<T>(O::name, a);
      r.copy_(get_tensor<T>(a.in.at(1), "copy"));
      return r;
    })};
  }
  /// Reads the source, writes the result; the destination is only overwritten.
  static op_cost cost(const O&, const cost_args& a) {
    return op_cost::compute(0, ops::detail::meta_bytes(a.in.at(1)) + ops::detail::meta_bytes(a.out), peak_class::none);
  }
  /// The source, broadcast to the destination's shape, gets the gradient summed back to its
  /// shape; the destination only gives the shape (its values are overwritten): zeros.
  struct gradient {
    template <class C>
    static void backward(const O&, C& c) {
      if (c.needs_grad(0)) c.add_grad(0, c.zeros_like(c.input(0)));
      if (c.needs_grad(1)) c.add_grad(1, c.sum_to(c.grad(), c.input(1).shape()));
    }
  };
  using sharding = sharding_rules::copy;
};

/// The traits every view op shares but `apply_view`: a view of input 0, inferred by applying
/// the view to a storage-less tensor, launching nothing.
template <class O, alias_kind A = alias_kind::view>
struct view_traits_common {
  static constexpr op_category category = op_category::view;
  static constexpr alias_kind aliasing = A;
  static constexpr bool in_place_input = false;
  static std::vector<tensor_meta> infer(const O& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    return ops::detail::infer_view(o, in);
  }
  static op_cost cost(const O&, const cost_args&) { return op_cost::none(); }
};

template <>
struct op_traits<ops::reshape> : view_traits_common<ops::reshape, alias_kind::view_or_copy> {
  template <class T>
  static tensor<T> apply_view(const ops::reshape& o, const tensor<T>& t) { return t.reshape(o.shape); }
  /// The gradient reshaped back.
  struct gradient {
    template <class C>
    static void backward(const ops::reshape&, C& c) { c.add_grad(0, c.grad().reshape(c.input(0).shape())); }
  };
  using sharding = sharding_rules::reshape;
};
template <>
struct op_traits<ops::narrow> : view_traits_common<ops::narrow> {
  template <class T>
  static tensor<T> apply_view(const ops::narrow& o, const tensor<T>& t) { return t.narrow(o.dim, o.start, o.length); }
  /// The gradient in place of the slice, zeros elsewhere.
  struct gradient {
    template <class C>
    static void backward(const ops::narrow& o, C& c) { c.add_grad(0, c.pad_into(c.grad(), c.input(0), o.dim, o.start)); }
  };
  using sharding = sharding_rules::narrow;
};
template <>
struct op_traits<ops::transpose> : view_traits_common<ops::transpose> {
  template <class T>
  static tensor<T> apply_view(const ops::transpose& o, const tensor<T>& t) { return t.transpose(o.dim0, o.dim1); }
  /// The gradient transposed back.
  struct gradient {
    template <class C>
    static void backward(const ops::transpose& o, C& c) { c.add_grad(0, c.grad().transpose(o.dim0, o.dim1)); }
  };
  using sharding = sharding_rules::transpose;
};
template <>
struct op_traits<ops::permute> : view_traits_common<ops::permute> {
  template <class T>
  static tensor<T> apply_view(const ops::permute& o, const tensor<T>& t) { return t.permute(o.dims); }
  /// The gradient permuted by the inverse permutation.
  struct gradient {
    template <class C>
    static void backward(const ops::permute& o, C& c) {
      const auto g = c.grad();
      std::vector<std::int64_t> inv(o.dims.size());
      for (std::size_t i = 0; i < o.dims.size(); ++i)
        inv[static_cast<std::size_t>(normalize_dim(o.dims[i], o.dims.size(), "permute"))] = static_cast<std::int64_t>(i);
      c.add_grad(0, g.permute(inv));
    }
  };
  using sharding = sharding_rules::permute;
};
template <>
struct op_traits<ops::select> : view_traits_common<ops::select> {
  template <class T>
  static tensor<T> apply_view(const ops::select& o, const tensor<T>& t) { return t.select(o.dim, o.index); }
  /// The gradient in place of the selected slice, zeros elsewhere.
  struct gradient {
    template <class C>
    static void backward(const ops::select& o, C& c) {
      const auto x = c.input(0);
      const int d = normalize_dim(o.dim, x.shape().size(), "select");
      const std::int64_t index = o.index < 0 ? o.index + x.size(d) : o.index;
      c.add_grad(0, c.pad_into(c.grad().unsqueeze(d), x, d, index));
    }
  };
  using sharding = sharding_rules::select;
};
template <>
struct op_traits<ops::unsqueeze> : view_traits_common<ops::unsqueeze> {
  template <class T>
  static tensor<T> apply_view(const ops::unsqueeze& o, const tensor<T>& t) { return t.unsqueeze(o.dim); }
  /// The gradient reshaped back.
  struct gradient {
    template <class C>
    static void backward(const ops::unsqueeze&, C& c) { c.add_grad(0, c.grad().reshape(c.input(0).shape())); }
  };
  using sharding = sharding_rules::unsqueeze;
};
/// contiguous: the input itself when contiguous, else a copy. Costed as the copy it is after a
/// transpose (metas carry no strides to tell).
template <>
struct op_traits<ops::contiguous> : view_traits_common<ops::contiguous, alias_kind::view_or_copy> {
  template <class T>
  static tensor<T> apply_view(const ops::contiguous&, const tensor<T>& t) { return t.contiguous(); }
  static op_cost cost(const ops::contiguous&, const cost_args& a) {
    return op_cost::compute(0, ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::none);
  }
  /// The gradient itself.
  struct gradient {
    template <class C>
    static void backward(const ops::contiguous&, C& c) { c.add_grad(0, c.grad()); }
  };
  using sharding = sharding_rules::same_as_input;
};

/// Stacks equal-shaped values along a new dim `dim` (in [-(rank+1), rank]) into a new
/// contiguous tensor, like torch.stack; any strides. On tensors it runs now (waiting on pending
/// inputs), on traced values it records a `stack` node.
template <detail::op_value V>
V stack(const std::vector<V>& xs, std::int64_t dim = 0) {
  return detail::apply_op_list<typename V::value_type>(ops::stack{dim}, xs).at(0);
}

/// stack for a braced list: `cg::stack({a, b}, 1)`.
template <detail::op_value V>
V stack(std::initializer_list<V> xs, std::int64_t dim = 0) {
  return stack(std::vector<V>(xs), dim);
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/compute_ops.ipp>
#endif
