// ccgraph/ops/compute_ops.hpp: the one definition of each non-collective graph op: attributes (a
// Boost.Hana struct), and shape/dtype inference with the same messages as the eager calls,
// because it runs the eager code's own shape functions (matmul_shape, cat_shape, the tensor
// view methods on storage-less tensors).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/ops/matmul.hpp>
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
    std::visit(
        [&](const auto& o) {
          using X = std::decay_t<decltype(o)>;
          auto dst = o;
          dst.copy_(std::get<X>(r));
        },
        out);
  }
};

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
inline void expect_inputs(std::string_view what, const std::vector<tensor_meta>& in, std::size_t n) {
  CCGRAPH_CHECK(in.size() == n, what, ": expects ", n, " input(s), got ", in.size());
}
inline void expect_same_dtype(std::string_view what, const std::vector<tensor_meta>& in) {
  for (auto& m : in)
    CCGRAPH_CHECK(m.dtype == in.front().dtype, what, ": mixing dtypes: ", in.front().str(),
                  " and ", m.str());
}

/// Applies a tensor view method to a storage-less tensor of meta `m`: its shape, and its errors.
template <class F>
tensor_meta view_meta(const tensor_meta& m, F&& f) {
  return visit_dtype(m.dtype, [&](auto tag) {
    auto t = f(ccgraph::detail::meta_tensor<decltype(tag)>(m));
    return tensor_meta{m.dtype, t.shape()};
  });
}
}  // namespace detail

/// Output meta of a compute op on inputs `in`, validating them with the eager messages.
template <class O>
std::vector<tensor_meta> infer_compute(const O& o, const std::vector<tensor_meta>& in) {
  constexpr std::string_view what = O::name;
  if constexpr (std::is_same_v<O, matmul>) {
    detail::expect_inputs(what, in, 2);
    detail::expect_same_dtype(what, in);
    CCGRAPH_CHECK(in[0].dtype != dtype::boolean, "matmul: bool tensors are not supported");
    return {{in[0].dtype, ccgraph::detail::matmul_shape(in[0].shape, in[1].shape)}};
  } else if constexpr (std::is_same_v<O, cat>) {
    detail::expect_same_dtype(what, in);
    std::vector<shape_t> shapes;
    for (auto& m : in) shapes.push_back(m.shape);
    shape_t out = ccgraph::detail::cat_shape(shapes, o.dim);  // first: it rejects an empty list
    return {{in.front().dtype, std::move(out)}};
  } else if constexpr (std::is_same_v<O, repeat>) {
    detail::expect_inputs(what, in, 1);
    return {{in[0].dtype, tensor<float>::repeat_shape(in[0].shape, o.repeats)}};
  } else if constexpr (std::is_same_v<O, copy>) {
    detail::expect_inputs(what, in, 2);
    CCGRAPH_CHECK(broadcast_shapes(in[0].shape, in[1].shape, "copy_") == in[0].shape,
                  "copy_: source of shape ", shape_str(in[1].shape),
                  " cannot be broadcast to destination shape ", shape_str(in[0].shape));
    return {in[0]};
  } else if constexpr (std::is_same_v<O, reshape>) {
    detail::expect_inputs(what, in, 1);
    return {detail::view_meta(in[0], [&](const auto& t) { return t.reshape(o.shape); })};
  } else if constexpr (std::is_same_v<O, narrow>) {
    detail::expect_inputs(what, in, 1);
    return {detail::view_meta(in[0], [&](const auto& t) { return t.narrow(o.dim, o.start, o.length); })};
  } else if constexpr (std::is_same_v<O, transpose>) {
    detail::expect_inputs(what, in, 1);
    return {detail::view_meta(in[0], [&](const auto& t) { return t.transpose(o.dim0, o.dim1); })};
  } else if constexpr (std::is_same_v<O, permute>) {
    detail::expect_inputs(what, in, 1);
    return {detail::view_meta(in[0], [&](const auto& t) { return t.permute(o.dims); })};
  } else if constexpr (std::is_same_v<O, select>) {
    detail::expect_inputs(what, in, 1);
    return {detail::view_meta(in[0], [&](const auto& t) { return t.select(o.dim, o.index); })};
  } else if constexpr (std::is_same_v<O, unsqueeze>) {
    detail::expect_inputs(what, in, 1);
    return {detail::view_meta(in[0], [&](const auto& t) { return t.unsqueeze(o.dim); })};
  } else if constexpr (std::is_same_v<O, contiguous> || std::is_same_v<O, wait_tensor>) {
    detail::expect_inputs(what, in, 1);
    return {in[0]};
  } else {
    static_assert(sizeof(O) == 0, "infer_compute: not a compute op");
  }
}

}  // namespace ops
}  // namespace ccgraph
