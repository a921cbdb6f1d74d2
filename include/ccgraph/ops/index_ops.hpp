// ccgraph/ops/index_ops.hpp: ops that move rows and elements by an index tensor: embedding (and
// its backward), index_select, gather and scatter_add, with PyTorch's semantics and errors.
//
// Host code: each op's shape function (`detail::<op>_shape`, the errors a user sees) and its CPU
// kernel (`detail::<op>_cpu`, any input strides, a pre-allocated contiguous output of the
// inferred shape). The CUDA kernels, same signatures with `_cuda`, are in
// <ccgraph/cuda/index.cuh>.
//
// Accumulation (scatter_add, embedding_backward): in float for bf16/f16, rounded once at the
// end; in T otherwise. The CPU kernels add in a fixed order (the index tensor's row-major
// order), so they are deterministic; embedding_backward's CUDA kernel adds in the same order and
// gives the same bits (see cuda/index.cuh).
//
// Graph ops (the end of this file): each op's struct and op_traits (inference by the shape
// functions above, so eager and traced calls fail alike; run by the CPU kernels, and by the CUDA
// ones through cuda_impl in cuda/index.cuh) and its public function, generic over tensors and
// traced values: cg::embedding, cg::index_select, cg::gather, cg::scatter_add, and
// cg::embedding_backward for autograd.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include <boost/hana/define_struct.hpp>

#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/ops/compute_ops.hpp>
#include <ccgraph/ops/kernel_checks.hpp>
#include <ccgraph/ops/op_traits.hpp>
#include <ccgraph/tensor/strided.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph::detail {

/// The element types of index tensors: int64 (PyTorch's Long) and int32 (Int).
template <class I>
concept index_element = std::same_as<I, std::int64_t> || std::same_as<I, std::int32_t>;

/// Checks an index tensor's dtype: int64, or also int32 where `int32_ok` (embedding,
/// index_select); gather and scatter_add take int64 only, as in PyTorch.
CCGRAPH_DECL void check_index_dtype(dtype dt, const char* what, bool int32_ok);

// ---- embedding -------------------------------------------------------------------------------

/// padding_idx normalised against a table of `num_embeddings` rows (negative counts from the
/// end, as in torch.nn.functional.embedding), or -1 for none. Throws when it is out of range.
CCGRAPH_DECL std::int64_t embedding_padding_idx(std::optional<std::int64_t> padding_idx,
                                          std::int64_t num_embeddings);

/// The shape of embedding(indices, weight): indices' shape + [D] for a weight of [V, D]. The
/// indices are i64 or i32; `padding_idx` (only validated here) must lie within V.
CCGRAPH_DECL shape_t embedding_shape(const shape_t& indices, dtype index_dtype, const shape_t& weight,
                               std::optional<std::int64_t> padding_idx = std::nullopt);

/// The shape of embedding's backward (the weight's gradient): [num_weights, D], for `grad` of
/// shape indices' shape + [D].
CCGRAPH_DECL shape_t embedding_backward_shape(const shape_t& grad, const shape_t& indices, dtype index_dtype,
                                        std::int64_t num_weights,
                                        std::optional<std::int64_t> padding_idx = std::nullopt);

// ---- index_select ------------------------------------------------------------------------------

/// The shape of index_select(input, dim, index): input's shape with dim's size replaced by the
/// number of indices. `index` is 1-d or 0-d, i64 or i32.
CCGRAPH_DECL shape_t index_select_shape(const shape_t& input, std::int64_t dim, const shape_t& index,
                                  dtype index_dtype);

// ---- gather / scatter_add -----------------------------------------------------------------------

/// The shape of gather(input, dim, index): index's shape. index (i64) has input's number of
/// dims and, in every dim but `dim`, at most input's size (torch.gather's rules).
CCGRAPH_DECL shape_t gather_shape(const shape_t& input, std::int64_t dim, const shape_t& index,
                            dtype index_dtype);

/// The shape of scatter_add(self, dim, index, src): self's shape. index (i64) has self's number
/// of dims, at most self's size in every dim but `dim` and at most src's size in every dim;
/// src has self's dtype and number of dims (torch.scatter_add's rules).
CCGRAPH_DECL shape_t scatter_add_shape(const shape_t& self, std::int64_t dim, const shape_t& index,
                                 dtype index_dtype, const shape_t& src, dtype self_dtype,
                                 dtype src_dtype);

// ---- CPU kernels -------------------------------------------------------------------------------

/// Throws for an index outside [0, size): `what: index 7 is out of bounds for dimension 0 with
/// size 5`.
CCGRAPH_DECL void check_index_bounds(std::int64_t i, std::int64_t size, int dim, const char* what);

/// The one implementation of index_select and embedding's forward: out (contiguous, shape
/// index_select_shape) = input's slices at `index` along `d`. `what` names the caller.
template <element T, index_element I>
void index_select_rows_cpu(const tensor<T>& input, int d, const tensor<I>& index, const tensor<T>& out,
                           const char* what) {
  const tensor<T> in = nonempty_view(input);
  tensor<T> o = nonempty_view(out);
  const std::vector<I> idx = index.to_vector();
  const std::int64_t size = in.shape()[static_cast<std::size_t>(d)];
  for (const I i : idx) check_index_bounds(static_cast<std::int64_t>(i), size, d, what);
  for (std::size_t j = 0; j < idx.size(); ++j) {
    const tensor<T> src = in.select(d, static_cast<std::int64_t>(idx[j]));
    const tensor<T> dst = o.select(d, static_cast<std::int64_t>(j));
    const T* s = src.data();
    T* p = dst.data();
    for_each_offset<2>(dst.shape(), {&dst.strides(), &src.strides()}, [&](const auto& off) { p[off[0]] = s[off[1]]; });
  }
}

/// index_select(input, dim, index) into `out` (contiguous, of index_select_shape).
template <element T, index_element I>
void index_select_cpu(const tensor<T>& input, std::int64_t dim, const tensor<I>& index, const tensor<T>& out) {
  const shape_t shape = index_select_shape(input.shape(), dim, index.shape(), dtype_v<I>);
  check_kernel_output(out, shape, "index_select");
  check_same_device("index_select", device::cpu(), {input.device(), index.device(), out.device()});
  index_select_rows_cpu(input, index_op_dim(dim, input.dim(), "index_select"), index.flatten(), out,
                        "index_select");
}

/// embedding(indices, weight) into `out` (contiguous, indices' shape + [D]): row indices[...]
/// of the [V, D] table. An index outside [0, V) throws (PyTorch: "index out of range in self").
template <element T, index_element I>
void embedding_cpu(const tensor<I>& indices, const tensor<T>& weight, const tensor<T>& out) {
  const shape_t shape = embedding_shape(indices.shape(), dtype_v<I>, weight.shape());
  check_kernel_output(out, shape, "embedding");
  check_same_device("embedding", device::cpu(), {indices.device(), weight.device(), out.device()});
  index_select_rows_cpu(weight, 0, indices.flatten(), out.reshape({indices.numel(), weight.shape()[1]}),
                        "embedding");
}

/// embedding's backward into `grad_weight` ([num_weights, D], contiguous): the sum of the rows
/// of `grad` (indices' shape + [D]) that looked up each table row, in the indices' row-major
/// order; rows looked up by `padding_idx` get no gradient (stay 0), as in PyTorch.
template <element T, index_element I>
void embedding_backward_cpu(const tensor<T>& grad, const tensor<I>& indices,
                            std::optional<std::int64_t> padding_idx, const tensor<T>& grad_weight) {
  static_assert(std::is_floating_point_v<compute_t<T>>,
                "embedding_backward: gradients are floating point (f32, f64, bf16, f16)");
  CCGRAPH_CHECK(grad_weight.dim() == 2, "embedding_backward: grad_weight must be 2-D, got shape ",
                shape_str(grad_weight.shape()));
  const std::int64_t num_weights = grad_weight.shape()[0];
  const shape_t shape = embedding_backward_shape(grad.shape(), indices.shape(), dtype_v<I>, num_weights, padding_idx);
  check_kernel_output(grad_weight, shape, "embedding_backward", "grad_weight");
  check_same_device("embedding_backward", device::cpu(), {grad.device(), indices.device(), grad_weight.device()});
  const std::int64_t pad = embedding_padding_idx(padding_idx, num_weights);
  const std::int64_t n = indices.numel(), dim = shape[1];
  const std::vector<I> idx = indices.to_vector();
  for (const I i : idx) check_index_bounds(static_cast<std::int64_t>(i), num_weights, 0, "embedding_backward");
  using A = compute_t<T>;
  std::vector<A> acc(static_cast<std::size_t>(num_weights * dim), A(0));
  const tensor<T> g = grad.reshape({n, dim});
  const T* gp = g.data();
  const std::int64_t rs = g.strides()[0], cs = g.strides()[1];
  for (std::int64_t r = 0; r < n; ++r) {
    const auto row = static_cast<std::int64_t>(idx[static_cast<std::size_t>(r)]);
    if (row == pad) continue;
    A* a = acc.data() + row * dim;
    for (std::int64_t c = 0; c < dim; ++c) a[c] += static_cast<A>(gp[r * rs + c * cs]);
  }
  T* out = grad_weight.data();
  for (std::size_t i = 0; i < acc.size(); ++i) out[i] = cast<T>(acc[i]);
}

/// gather(input, dim, index) into `out` (contiguous, index's shape):
/// out[i][j][k] = input[index[i][j][k]][j][k] for dim 0, and so on.
template <element T>
void gather_cpu(const tensor<T>& input, std::int64_t dim, const tensor<std::int64_t>& index, const tensor<T>& out) {
  const shape_t shape = gather_shape(input.shape(), dim, index.shape(), dtype::i64);
  check_kernel_output(out, shape, "gather");
  check_same_device("gather", device::cpu(), {input.device(), index.device(), out.device()});
  const int d = index_op_dim(dim, input.dim(), "gather");
  const tensor<T> in = nonempty_view(input);
  const tensor<std::int64_t> ix = nonempty_view(index);
  const tensor<T> o = nonempty_view(out);
  strides_t in_strides = in.strides();
  const std::int64_t step = in_strides[static_cast<std::size_t>(d)];
  const std::int64_t size = in.shape()[static_cast<std::size_t>(d)];
  in_strides[static_cast<std::size_t>(d)] = 0;  // index picks the position along dim
  const std::int64_t* ip = ix.data();
  const T* src = in.data();
  T* dst = o.data();
  for_each_offset<3>(ix.shape(), {&ix.strides(), &o.strides(), &in_strides}, [&](const auto& off) {
    const std::int64_t i = ip[off[0]];
    check_index_bounds(i, size, d, "gather");
    dst[off[1]] = src[off[2] + i * step];
  });
}

/// scatter_add(self, dim, index, src) into `out` (contiguous, self's shape): out = self, then
/// out[index[i][j][k]][j][k] += src[i][j][k] for dim 0 (and so on), in index's row-major order.
/// bf16/f16 accumulate in float and round once.
template <element T>
void scatter_add_cpu(const tensor<T>& self, std::int64_t dim, const tensor<std::int64_t>& index,
                     const tensor<T>& src, const tensor<T>& out) {
  static_assert(!std::is_same_v<T, bool>, "scatter_add: bool tensors are not supported; convert with .to<U>()");
  const shape_t shape = scatter_add_shape(self.shape(), dim, index.shape(), dtype::i64, src.shape(),
                                          dtype_v<T>, dtype_v<T>);
  check_kernel_output(out, shape, "scatter_add");
  check_same_device("scatter_add", device::cpu(), {self.device(), index.device(), src.device(), out.device()});
  const int d = index_op_dim(dim, self.dim(), "scatter_add");
  const tensor<std::int64_t> ix = nonempty_view(index);
  const tensor<T> sr = nonempty_view(src);
  tensor<T> o = nonempty_view(out);
  using A = compute_t<T>;
  std::vector<A> acc(static_cast<std::size_t>(o.numel()));
  {
    const std::vector<T> init = self.to_vector();  // before writing out: out may be self's memory
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<A>(init[i]);
  }
  strides_t o_strides = o.strides();  // contiguous
  const std::int64_t step = o_strides[static_cast<std::size_t>(d)];
  const std::int64_t size = o.shape()[static_cast<std::size_t>(d)];
  o_strides[static_cast<std::size_t>(d)] = 0;
  const std::int64_t* ip = ix.data();
  const T* sp = sr.data();
  for_each_offset<3>(ix.shape(), {&ix.strides(), &sr.strides(), &o_strides}, [&](const auto& off) {
    const std::int64_t i = ip[off[0]];
    check_index_bounds(i, size, d, "scatter_add");
    acc[static_cast<std::size_t>(off[2] + i * step)] += static_cast<A>(sp[off[1]]);
  });
  T* op = o.data();
  for (std::size_t i = 0; i < acc.size(); ++i) op[i] = cast<T>(acc[i]);
}

}  // namespace ccgraph::detail

// ---- graph ops ---------------------------------------------------------------------------------

namespace ccgraph {
namespace ops {
/// torch.nn.functional.embedding(indices, weight, padding_idx): rows of the [V, D] table.
/// `padding_idx` only shapes the backward (its row gets no gradient); validated here.
struct embedding {
  BOOST_HANA_DEFINE_STRUCT(embedding, (std::optional<std::int64_t>, padding_idx));
  static constexpr std::string_view name = "embedding";
};
/// embedding's backward (aten::embedding_backward): grad [..., D] and the indices give the
/// table's gradient [num_weights, D]; the padding_idx row stays 0.
struct embedding_backward {
  BOOST_HANA_DEFINE_STRUCT(embedding_backward, (std::int64_t, num_weights), (std::optional<std::int64_t>, padding_idx));
  static constexpr std::string_view name = "embedding_backward";
};
/// torch.index_select(input, dim, index).
struct index_select {
  BOOST_HANA_DEFINE_STRUCT(index_select, (std::int64_t, dim));
  static constexpr std::string_view name = "index_select";
};
/// torch.gather(input, dim, index).
struct gather {
  BOOST_HANA_DEFINE_STRUCT(gather, (std::int64_t, dim));
  static constexpr std::string_view name = "gather";
};
/// torch.scatter_add(self, dim, index, src), out of place.
struct scatter_add {
  BOOST_HANA_DEFINE_STRUCT(scatter_add, (std::int64_t, dim));
  static constexpr std::string_view name = "scatter_add";
};
}  // namespace ops

namespace detail {

/// Calls `f(I{})` for the index element type of dtype `dt` (i64 or i32; inference rejected the
/// rest, so anything else is a node built by hand, refused naming `what`).
template <class F>
decltype(auto) visit_index_dtype(dtype dt, const char* what, F&& f) {
  if (dt == dtype::i32) return f(std::int32_t{});
  CCGRAPH_CHECK(dt == dtype::i64, what, ": expected an index tensor of dtype i64 or i32, got ", dt);
  return f(std::int64_t{});
}

/// The dispatch the CPU and CUDA runs of the index ops share: visits the output's element type
/// T and the index's I (input `index_at`), takes the planned output (or a new one), and calls
/// `kernel(T{}, I{}, out)`; `floating_only` ops refuse other types (their inference did first).
template <class O, bool FloatingOnly = false, class K>
std::vector<any_tensor> run_index_op(const run_args& a, std::size_t index_at, const K& kernel) {
  return {visit_dtype(a.metas.at(0).dtype, [&](auto tag) -> any_tensor {
    using T = decltype(tag);
    if constexpr (FloatingOnly && !std::is_floating_point_v<compute_t<T>>) {
      CCGRAPH_THROW(error, O::name, ": floating-point tensors only (f32, f64, bf16, f16), got ", dtype_v<T>);
    } else {
      auto out = ops::detail::out_or_new<T>(O::name, a);
      visit_index_dtype(::ccgraph::meta_of(a.in.at(index_at)).dtype, O::name.data(), [&](auto itag) {
        kernel(tag, itag, out);
      });
      return out;
    }
  })};
}

/// The bytes an op moving rows reads and writes: its output twice (read from the source,
/// written) and its index.
CCGRAPH_DECL double index_op_bytes(const cost_args& a, std::size_t index_at);

/// The run of each index op given its kernels (`Kernels::embedding(...)`, ...): the CPU ones
/// below, the CUDA ones in cuda/index.cuh. One definition of how each op reads its inputs.
template <class Kernels>
struct index_op_runs {
  static std::vector<any_tensor> run(const ops::embedding&, const run_args& a) {
    return run_index_op<ops::embedding>(a, 0, [&](auto tag, auto itag, const auto& out) {
      using T = decltype(tag);
      using I = decltype(itag);
      Kernels::embedding(get_tensor<I>(a.in[0], "embedding"), get_tensor<T>(a.in.at(1), "embedding"), out);
    });
  }
  static std::vector<any_tensor> run(const ops::embedding_backward& o, const run_args& a) {
    return run_index_op<ops::embedding_backward, true>(a, 1, [&](auto tag, auto itag, const auto& out) {
      using T = decltype(tag);
      using I = decltype(itag);
      Kernels::embedding_backward(get_tensor<T>(a.in.at(0), "embedding_backward"),
                                  get_tensor<I>(a.in[1], "embedding_backward"), o.padding_idx, out);
    });
  }
  static std::vector<any_tensor> run(const ops::index_select& o, const run_args& a) {
    return run_index_op<ops::index_select>(a, 1, [&](auto tag, auto itag, const auto& out) {
      using T = decltype(tag);
      using I = decltype(itag);
      Kernels::index_select(get_tensor<T>(a.in.at(0), "index_select"), o.dim, get_tensor<I>(a.in[1], "index_select"),
                            out);
    });
  }
  static std::vector<any_tensor> run(const ops::gather& o, const run_args& a) {
    return run_index_op<ops::gather>(a, 1, [&](auto tag, auto, const auto& out) {
      using T = decltype(tag);
      Kernels::gather(get_tensor<T>(a.in.at(0), "gather"), o.dim, get_tensor<std::int64_t>(a.in[1], "gather"), out);
    });
  }
  static std::vector<any_tensor> run(const ops::scatter_add& o, const run_args& a) {
    return run_index_op<ops::scatter_add>(a, 1, [&](auto tag, auto, const auto& out) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        CCGRAPH_THROW(error, "scatter_add: bool tensors are not supported; convert with .to<U>()");
      } else {
        Kernels::scatter_add(get_tensor<T>(a.in.at(0), "scatter_add"), o.dim,
                             get_tensor<std::int64_t>(a.in[1], "scatter_add"), get_tensor<T>(a.in.at(2), "scatter_add"),
                             out);
      }
    });
  }
};

/// The CPU kernels, for index_op_runs.
struct index_cpu_kernels {
  template <class... A>
  static void embedding(const A&... a) { embedding_cpu(a...); }
  template <class... A>
  static void embedding_backward(const A&... a) { embedding_backward_cpu(a...); }
  template <class... A>
  static void index_select(const A&... a) { index_select_cpu(a...); }
  template <class... A>
  static void gather(const A&... a) { gather_cpu(a...); }
  template <class... A>
  static void scatter_add(const A&... a) { scatter_add_cpu(a...); }
};

/// What every index op's traits share: a compute op writing a new tensor, run by the CPU
/// kernels here and by cuda_impl on devices.
struct index_traits_common {
  static constexpr op_category category = op_category::compute;
  static constexpr alias_kind aliasing = alias_kind::fresh;
  static constexpr bool in_place_input = false;
  static constexpr device_path device = device_path::cuda_impl;  // cuda/index.cuh
  template <class O>
  static std::vector<any_tensor> run(const O& o, const run_args& a) {
    return index_op_runs<index_cpu_kernels>::run(o, a);
  }
  using gradient = gradient_todo;
  using sharding = sharding_todo;
};

}  // namespace detail

template <>
struct op_traits<ops::embedding> : detail::index_traits_common {
  using sharding = sharding_rules::embedding;
  /// embedding_backward: the rows of the gradient summed per looked-up row (the indices carry none).
  struct gradient {
    template <class C>
    static void backward(const ops::embedding& o, C& c) {
      const std::int64_t rows = c.input(1).size(0);
      if (c.current().args()[0].src->dtype(c.current().args()[0].index) == dtype::i32)
        c.add_grad(1, embedding_backward(c.grad(), c.template input<std::int32_t>(0), rows, o.padding_idx));
      else
        c.add_grad(1, embedding_backward(c.grad(), c.template input<std::int64_t>(0), rows, o.padding_idx));
    }
  };
  /// Inputs: indices (i64/i32), weight [V, D].
  static std::vector<tensor_meta> infer(const ops::embedding& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(ops::embedding::name, in, 2);
    return {{in[1].dtype, detail::embedding_shape(in[0].shape, in[0].dtype, in[1].shape, o.padding_idx)}};
  }
  /// Bytes only: reads the looked-up rows and the indices, writes the rows.
  static op_cost cost(const ops::embedding&, const cost_args& a) {
    return op_cost::compute(0, detail::index_op_bytes(a, 0), peak_class::none);
  }
};

template <>
struct op_traits<ops::embedding_backward> : detail::index_traits_common {
  /// Inputs: grad (indices' shape + [D], floating point), indices (i64/i32).
  static std::vector<tensor_meta> infer(const ops::embedding_backward& o, const std::vector<tensor_meta>& in,
                                        const infer_ctx&) {
    ops::detail::expect_inputs(ops::embedding_backward::name, in, 2);
    shape_t out = detail::embedding_backward_shape(in[0].shape, in[1].shape, in[1].dtype, o.num_weights, o.padding_idx);
    CCGRAPH_CHECK(is_floating(in[0].dtype), "embedding_backward: grad of dtype ", in[0].dtype,
                  "; gradients are floating point (f32, f64, bf16, f16)");
    return {{in[0].dtype, std::move(out)}};
  }
  /// One add per element of grad at the vector rate; reads grad and the indices, writes the table.
  static op_cost cost(const ops::embedding_backward&, const cost_args& a) {
    return op_cost::compute(double(numel_of(a.in.at(0).shape)),
                            ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::vector);
  }
};

template <>
struct op_traits<ops::index_select> : detail::index_traits_common {
  using sharding = sharding_rules::index_select;
  /// The gradient's slices added into zeros at the rows the index picked (torch's index_add;
  /// a row picked twice gets both): embedding_backward with `dim` moved to the front.
  struct gradient {
    template <class C>
    static void backward(const ops::index_select& o, C& c) {
      const shape_t xs = c.input(0).shape();
      CCGRAPH_CHECK(!xs.empty(), "grad: index_select (node %", c.current().name(), "): no gradient rule for a 0-d input");
      const int d = normalize_dim(o.dim, xs.size(), "grad: index_select");
      const auto front = [d](const auto& v) { return d == 0 ? v : v.transpose(0, d); };
      const auto g = front(c.grad()).contiguous();  // [n, the other dims]
      shape_t rest(g.shape().begin() + 1, g.shape().end()), rows_shape = rest;
      const std::int64_t n = g.shape()[0], size = xs[static_cast<std::size_t>(d)];
      rows_shape.insert(rows_shape.begin(), size);
      auto rows = [&](const auto& index) {
        return embedding_backward(g.reshape({n, numel_of(rest)}), index.reshape({n}), size).reshape(rows_shape);
      };
      const auto& i = c.current().args()[1];
      const auto summed = i.src->dtype(i.index) == dtype::i32 ? rows(c.template input<std::int32_t>(1))
                                                               : rows(c.template input<std::int64_t>(1));
      c.add_grad(0, d == 0 ? summed : front(summed).contiguous());
    }
  };
  /// Inputs: input, index (1-d or 0-d, i64/i32).
  static std::vector<tensor_meta> infer(const ops::index_select& o, const std::vector<tensor_meta>& in,
                                        const infer_ctx&) {
    ops::detail::expect_inputs(ops::index_select::name, in, 2);
    return {{in[0].dtype, detail::index_select_shape(in[0].shape, o.dim, in[1].shape, in[1].dtype)}};
  }
  static op_cost cost(const ops::index_select&, const cost_args& a) {
    return op_cost::compute(0, detail::index_op_bytes(a, 1), peak_class::none);
  }
};

template <>
struct op_traits<ops::gather> : detail::index_traits_common {
  using sharding = sharding_rules::gather;
  /// scatter_add of the gradient into zeros of the input's shape.
  struct gradient {
    template <class C>
    static void backward(const ops::gather& o, C& c) {
      const auto x = c.input(0);
      c.add_grad(0, scatter_add(c.zeros_like(x), o.dim, c.template input<std::int64_t>(1), c.grad()));
    }
  };
  /// Inputs: input, index (i64, input's rank).
  static std::vector<tensor_meta> infer(const ops::gather& o, const std::vector<tensor_meta>& in, const infer_ctx&) {
    ops::detail::expect_inputs(ops::gather::name, in, 2);
    return {{in[0].dtype, detail::gather_shape(in[0].shape, o.dim, in[1].shape, in[1].dtype)}};
  }
  static op_cost cost(const ops::gather&, const cost_args& a) {
    return op_cost::compute(0, detail::index_op_bytes(a, 1), peak_class::none);
  }
};

template <>
struct op_traits<ops::scatter_add> : detail::index_traits_common {
  using sharding = sharding_rules::scatter_add;
  /// self gets the gradient; src the gradient gathered at the index.
  struct gradient {
    template <class C>
    static void backward(const ops::scatter_add& o, C& c) {
      if (c.needs_grad(0)) c.add_grad(0, c.grad());
      if (c.needs_grad(2)) c.add_grad(2, gather(c.grad(), o.dim, c.template input<std::int64_t>(1)));
    }
  };
  /// Inputs: self, index (i64), src (self's dtype).
  static std::vector<tensor_meta> infer(const ops::scatter_add& o, const std::vector<tensor_meta>& in,
                                        const infer_ctx&) {
    ops::detail::expect_inputs(ops::scatter_add::name, in, 3);
    shape_t out = detail::scatter_add_shape(in[0].shape, o.dim, in[1].shape, in[1].dtype, in[2].shape, in[0].dtype,
                                            in[2].dtype);
    CCGRAPH_CHECK(in[0].dtype != dtype::boolean, "scatter_add: bool tensors are not supported; convert with .to<U>()");
    return {{in[0].dtype, std::move(out)}};
  }
  /// One add per index element at the vector rate; reads self, index and src, writes the result.
  static op_cost cost(const ops::scatter_add&, const cost_args& a) {
    return op_cost::compute(double(numel_of(a.in.at(1).shape)),
                            ops::detail::meta_bytes(a.in) + ops::detail::meta_bytes(a.out), peak_class::vector);
  }
};

/// Rows `indices` of the [V, D] table `weight`: indices' shape + [D] (torch.nn.functional.
/// embedding). Indices are i64 or i32, each in [0, V) (else an error); `padding_idx` (negative
/// counts from V) marks the row that gets no gradient. On tensors it runs now, on traced values
/// it records an `embedding` node.
template <detail::op_value I, detail::op_value W>
W embedding(const I& indices, const W& weight, std::optional<std::int64_t> padding_idx = std::nullopt) {
  return std::get<0>(detail::apply_op_n<typename W::value_type>(ops::embedding{padding_idx}, indices, weight));
}

/// embedding's backward: the gradient of the [num_weights, D] table, the rows of `grad`
/// (indices' shape + [D]) summed per looked-up row in the indices' order; `padding_idx`'s row
/// stays 0 (aten::embedding_backward without scale_grad_by_freq and sparse).
template <detail::op_value G, detail::op_value I>
G embedding_backward(const G& grad, const I& indices, std::int64_t num_weights,
                     std::optional<std::int64_t> padding_idx = std::nullopt) {
  return std::get<0>(
      detail::apply_op_n<typename G::value_type>(ops::embedding_backward{num_weights, padding_idx}, grad, indices));
}

/// The slices of `input` at `index` (1-d or 0-d, i64 or i32) along `dim` (torch.index_select).
template <detail::op_value V, detail::op_value I>
V index_select(const V& input, std::int64_t dim, const I& index) {
  return std::get<0>(detail::apply_op_n<typename V::value_type>(ops::index_select{dim}, input, index));
}

/// out[i][j][k] = input[index[i][j][k]][j][k] for dim 0, and so on: index's shape (torch.gather;
/// index i64, of input's rank).
template <detail::op_value V, detail::op_value I>
V gather(const V& input, std::int64_t dim, const I& index) {
  return std::get<0>(detail::apply_op_n<typename V::value_type>(ops::gather{dim}, input, index));
}

/// self with src added at index along dim: out[index[i][j][k]][j][k] += src[i][j][k] for dim 0
/// (torch.scatter_add, out of place; index i64). On the CPU the adds run in index order; on a
/// GPU through atomics (floating-point sums may differ in their last bits run to run).
template <detail::op_value V, detail::op_value I>
V scatter_add(const V& self, std::int64_t dim, const I& index, const V& src) {
  return std::get<0>(detail::apply_op_n<typename V::value_type>(ops::scatter_add{dim}, self, index, src));
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ops/impl/index_ops.ipp>
#endif
