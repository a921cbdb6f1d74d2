// ccgraph/ops/reduction.hpp: reductions along dims with PyTorch's semantics (sum, mean, var, max /
// min with and without dim, amax / amin, argmax / argmin) and the backward kernels of those whose
// gradient is not a plain broadcast (amax / amin, max / min, var).
//
// Three layers, each usable on its own:
//   - shape and dtype inference (`reduce_shape`, `<op>_meta`): the user-facing errors, no data;
//   - the reducers (`sum_reducer`, `arg_reducer`, ...): the arithmetic of each reduction, written
//     once and run both by the CPU loop here and by the CUDA kernels of <ccgraph/cuda/reduction.cuh>;
//   - the CPU kernels (`<op>_cpu`): read inputs of any strides, write pre-allocated contiguous
//     outputs of the inferred shape.
//
// Dtype rules (PyTorch's): sum of an integer or bool tensor is i64 (bool sums count), floating
// types keep theirs; mean and var need a floating type (an integer input is an error, as in
// PyTorch); max / min / amax / amin keep the input's dtype; indices are i64. The 16-bit floats
// accumulate in float. On the CPU, f32 sums, means and variances accumulate in double (PyTorch's
// CPU uses a cascade sum in float: at least as accurate); on the GPU in float.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/tensor/strided.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph::detail {

// =============================================================================================
// Dims, shapes, dtypes
// =============================================================================================

/// The dims a reduction over `dims` reduces, as a mask over the dims of `shape`. An empty `dims`
/// reduces every dim (PyTorch's dim=None and dim=[]); negative dims count from the end; a dim
/// given twice is an error. A 0-d tensor accepts dim 0 and -1 and has no dim to mark.
inline std::vector<bool> reduce_mask(const shape_t& shape, const std::vector<std::int64_t>& dims,
                                     const char* what) {
  std::vector<bool> mask(shape.size(), dims.empty());
  if (dims.empty()) return mask;
  std::vector<bool> seen(std::max<std::size_t>(shape.size(), 1), false);
  for (const std::int64_t d : dims) {
    const int n = normalize_dim(d, shape.size(), what);
    CCGRAPH_CHECK(!seen[static_cast<std::size_t>(n)], what, ": dim ", n,
                  " appears multiple times in the list of dims ", list_str(dims));
    seen[static_cast<std::size_t>(n)] = true;
    if (!shape.empty()) mask[static_cast<std::size_t>(n)] = true;
  }
  return mask;
}

/// The shape of a reduction's result: the reduced dims dropped, or kept with size 1 (keepdim).
inline shape_t reduce_shape(const shape_t& shape, const std::vector<bool>& mask, bool keepdim) {
  shape_t out;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (!mask[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

/// The shape of reducing `shape` over `dims` (see reduce_mask); `what` names the call in errors.
inline shape_t reduce_shape(const shape_t& shape, const std::vector<std::int64_t>& dims, bool keepdim,
                            const char* what) {
  return reduce_shape(shape, reduce_mask(shape, dims, what), keepdim);
}

/// Number of input elements each output of the reduction combines.
inline std::int64_t reduce_count(const shape_t& shape, const std::vector<bool>& mask) {
  std::int64_t n = 1;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (mask[d]) n *= shape[d];
  return n;
}

/// Reductions without an identity (max, min, argmax, ...) refuse a reduced dim of size 0, as
/// PyTorch does ("Expected reduction dim 0 to have non-zero size").
inline void check_reduced_nonempty(const shape_t& shape, const std::vector<bool>& mask, const char* what) {
  for (std::size_t d = 0; d < shape.size(); ++d)
    CCGRAPH_CHECK(!mask[d] || shape[d] != 0, what, ": cannot reduce dim ", d, " of size 0 (input shape ",
                  shape_str(shape), "): the reduction has no identity");
}

/// sum's result type: i64 for integer and bool inputs (PyTorch promotes them; bool sums count),
/// the input's own type for floating types.
template <class T>
using sum_t = std::conditional_t<is_integral_element_v<T>, std::int64_t, T>;

/// sum's result dtype (the runtime form of sum_t).
constexpr dtype sum_dtype(dtype d) { return is_floating(d) ? d : dtype::i64; }

/// Throws unless `d` is a floating type: what mean, var, softmax and the norms need.
inline void require_floating(dtype d, const char* what) {
  CCGRAPH_CHECK(is_floating(d), what, ": input dtype ", d,
                " is not a floating point type (f32, f64, bf16 or f16); convert it first, e.g. "
                "with .to<float>()");
}

/// Type-level form of require_floating: true for f32, f64, bf16, f16.
template <class T>
inline constexpr bool is_floating_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

// ---- inference: what each op's `infer` returns ----

/// sum(input, dims, keepdim): dtype per sum_dtype.
inline tensor_meta sum_meta(const tensor_meta& in, const std::vector<std::int64_t>& dims, bool keepdim) {
  return {sum_dtype(in.dtype), reduce_shape(in.shape, dims, keepdim, "sum")};
}

/// mean(input, dims, keepdim): floating inputs only (PyTorch: "mean(): could not infer output
/// dtype"); the mean over an empty dim is NaN.
inline tensor_meta mean_meta(const tensor_meta& in, const std::vector<std::int64_t>& dims, bool keepdim) {
  require_floating(in.dtype, "mean");
  return {in.dtype, reduce_shape(in.shape, dims, keepdim, "mean")};
}

/// var(input, dims, correction, keepdim): floating inputs only; divides by max(0, N - correction).
inline tensor_meta var_meta(const tensor_meta& in, const std::vector<std::int64_t>& dims, double correction,
                            bool keepdim) {
  require_floating(in.dtype, "var");
  CCGRAPH_CHECK(std::isfinite(correction), "var: correction must be finite, got ", correction);
  return {in.dtype, reduce_shape(in.shape, dims, keepdim, "var")};
}

/// amax / amin(input, dims, keepdim) (`what` names which): the input's dtype; an empty reduced
/// dim is an error.
inline tensor_meta amax_meta(const tensor_meta& in, const std::vector<std::int64_t>& dims, bool keepdim,
                             const char* what = "amax") {
  const std::vector<bool> mask = reduce_mask(in.shape, dims, what);
  check_reduced_nonempty(in.shape, mask, what);
  return {in.dtype, reduce_shape(in.shape, mask, keepdim)};
}

/// max / min(input, dim, keepdim) (`what` names which): values (the input's dtype) and i64
/// indices, of the same shape.
inline std::vector<tensor_meta> max_dim_meta(const tensor_meta& in, std::int64_t dim, bool keepdim,
                                             const char* what = "max") {
  const std::vector<bool> mask = reduce_mask(in.shape, {dim}, what);
  check_reduced_nonempty(in.shape, mask, what);
  const shape_t s = reduce_shape(in.shape, mask, keepdim);
  return {{in.dtype, s}, {dtype::i64, s}};
}

/// max / min(input) over every element (`what` names which): a 0-d tensor of the input's dtype;
/// an input without elements is an error, as in PyTorch.
inline tensor_meta max_all_meta(const tensor_meta& in, const char* what = "max") {
  CCGRAPH_CHECK(numel_of(in.shape) != 0, what, ": input of shape ", shape_str(in.shape),
                " has no elements; give a dim to reduce over");
  return {in.dtype, {}};
}

/// argmax / argmin(input, dim, keepdim) (`what` names which): i64. Without a dim the index is
/// into the flattened input, and keepdim keeps every dim with size 1 (PyTorch 2.x).
inline tensor_meta argmax_meta(const tensor_meta& in, std::optional<std::int64_t> dim, bool keepdim,
                               const char* what = "argmax") {
  if (!dim) {
    CCGRAPH_CHECK(numel_of(in.shape) != 0, what, ": input of shape ", shape_str(in.shape),
                  " has no elements; give a dim to reduce over");
    return {dtype::i64, reduce_shape(in.shape, std::vector<bool>(in.shape.size(), true), keepdim)};
  }
  const std::vector<bool> mask = reduce_mask(in.shape, {*dim}, what);
  check_reduced_nonempty(in.shape, mask, what);
  return {dtype::i64, reduce_shape(in.shape, mask, keepdim)};
}

// =============================================================================================
// Reducers: the arithmetic of each reduction, shared by the CPU loop and the CUDA kernels
// =============================================================================================
//
// A reducer R has
//   acc_type                          the running state of one output
//   init()                            the state before any element
//   combine(acc&, V v, int64 r)       adds element v, at index r of the reduced index space
//                                     (row-major over the reduced dims)
//   merge(acc, acc)                   joins two states over disjoint parts (any order: ties in
//                                     the arg reducers break towards the lower index)
//   store(int64 q, acc, int64 n)      writes output q (row-major over the kept dims) from the
//                                     state of its n elements
// and holds the raw pointers of its outputs (trivially copyable: passed to CUDA kernels by value).
// V is the input's compute type (float for bf16 / f16, T otherwise).

/// True when `v` is a NaN (never for integer types).
template <class V>
CCGRAPH_HOST_DEVICE inline bool is_nan_value(V v) {
  if constexpr (std::is_floating_point_v<V>)
    return v != v;
  else
    return false;
}

/// The accumulation type of sums and means of T on the CPU: i64 for integers, double for f32 and
/// f64, float for bf16 / f16 (as PyTorch).
template <class T>
using cpu_acc_t = std::conditional_t<
    is_integral_element_v<T>, std::int64_t,
    std::conditional_t<std::is_same_v<T, float> || std::is_same_v<T, double>, double, float>>;

/// The accumulation type on the GPU: i64 for integers, double for f64, float otherwise.
template <class T>
using gpu_acc_t = std::conditional_t<is_integral_element_v<T>, std::int64_t,
                                     std::conditional_t<std::is_same_v<T, double>, double, float>>;

/// sum: out[q] = the sum in Acc, converted to U.
template <class Acc, class U>
struct sum_reducer {
  using acc_type = Acc;
  U* out;
  CCGRAPH_HOST_DEVICE Acc init() const { return Acc(0); }
  template <class V>
  CCGRAPH_HOST_DEVICE void combine(Acc& a, V v, std::int64_t) const {
    a += static_cast<Acc>(v);
  }
  CCGRAPH_HOST_DEVICE Acc merge(Acc a, Acc b) const { return a + b; }
  CCGRAPH_HOST_DEVICE void store(std::int64_t q, Acc a, std::int64_t) const { out[q] = cast<U>(a); }
};

/// mean: the sum divided by the count (0 / 0 = NaN for an empty reduction, as PyTorch).
template <class Acc, class U>
struct mean_reducer {
  using acc_type = Acc;
  U* out;
  CCGRAPH_HOST_DEVICE Acc init() const { return Acc(0); }
  template <class V>
  CCGRAPH_HOST_DEVICE void combine(Acc& a, V v, std::int64_t) const {
    a += static_cast<Acc>(v);
  }
  CCGRAPH_HOST_DEVICE Acc merge(Acc a, Acc b) const { return a + b; }
  CCGRAPH_HOST_DEVICE void store(std::int64_t q, Acc a, std::int64_t n) const {
    out[q] = cast<U>(a / static_cast<Acc>(n));
  }
};

/// Welford's running count, mean and sum of squared deviations.
template <class Acc>
struct welford_state {
  Acc n, mean, m2;
};

/// var: Welford's update per element, Chan's formula to merge; divides the sum of squared
/// deviations by max(0, n - correction), as PyTorch (0 / 0 = NaN, x / 0 = inf).
template <class Acc, class U>
struct var_reducer {
  using acc_type = welford_state<Acc>;
  U* out;
  Acc correction;
  CCGRAPH_HOST_DEVICE acc_type init() const { return {Acc(0), Acc(0), Acc(0)}; }
  template <class V>
  CCGRAPH_HOST_DEVICE void combine(acc_type& a, V v, std::int64_t) const {
    const Acc x = static_cast<Acc>(v);
    a.n += Acc(1);
    const Acc d = x - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (x - a.mean);
  }
  CCGRAPH_HOST_DEVICE acc_type merge(acc_type a, acc_type b) const {
    if (a.n == Acc(0)) return b;
    if (b.n == Acc(0)) return a;
    const Acc n = a.n + b.n;
    const Acc d = b.mean - a.mean;
    const Acc wb = b.n / n;
    return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
  }
  CCGRAPH_HOST_DEVICE void store(std::int64_t q, acc_type a, std::int64_t) const {
    const Acc divisor = a.n > correction ? a.n - correction : Acc(0);
    out[q] = cast<U>(a.m2 / divisor);
  }
};

/// The extreme start value: -inf / lowest (Max), +inf / max (min).
template <class V, bool Max>
CCGRAPH_HOST_DEVICE constexpr V extreme_init() {
  if constexpr (std::is_floating_point_v<V>)
    return Max ? -std::numeric_limits<V>::infinity() : std::numeric_limits<V>::infinity();
  else
    return Max ? std::numeric_limits<V>::lowest() : std::numeric_limits<V>::max();
}

/// True when `b` beats `a` for max (Max) or min: NaN beats every number (it propagates, as in
/// PyTorch), and nothing beats a NaN.
template <bool Max, class V>
CCGRAPH_HOST_DEVICE inline bool beats(V b, V a) {
  if (is_nan_value(a)) return false;
  if (is_nan_value(b)) return true;
  return Max ? b > a : b < a;
}

/// amax / amin / max() / min(): the extreme value, NaN if any element is NaN.
template <class V, class U, bool Max>
struct extreme_reducer {
  using acc_type = V;
  U* out;
  CCGRAPH_HOST_DEVICE V init() const { return extreme_init<V, Max>(); }
  CCGRAPH_HOST_DEVICE void combine(V& a, V v, std::int64_t) const {
    if (beats<Max>(v, a)) a = v;
  }
  CCGRAPH_HOST_DEVICE V merge(V a, V b) const { return beats<Max>(b, a) ? b : a; }
  CCGRAPH_HOST_DEVICE void store(std::int64_t q, V a, std::int64_t) const { out[q] = cast<U>(a); }
};

/// A value and its index in the reduced index space (-1: no element yet).
template <class V>
struct arg_state {
  V v;
  std::int64_t i;
};

/// argmax / argmin / max(dim) / min(dim): the extreme value and the index of its first
/// occurrence (PyTorch: "the indices of the first maximal value"); a NaN wins, and the first NaN.
/// `values` may be null (argmax writes indices only).
template <class V, class U, bool Max>
struct arg_reducer {
  using acc_type = arg_state<V>;
  U* values;
  std::int64_t* indices;
  CCGRAPH_HOST_DEVICE acc_type init() const { return {extreme_init<V, Max>(), -1}; }
  CCGRAPH_HOST_DEVICE void combine(acc_type& a, V v, std::int64_t r) const {
    // Elements come in increasing r within one state: a tie keeps the earlier one.
    if (a.i < 0 || beats<Max>(v, a.v)) a = {v, r};
  }
  CCGRAPH_HOST_DEVICE acc_type merge(acc_type a, acc_type b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    if (beats<Max>(b.v, a.v)) return b;
    if (beats<Max>(a.v, b.v)) return a;
    return b.i < a.i ? b : a;  // equal values (or both NaN): the first index
  }
  CCGRAPH_HOST_DEVICE void store(std::int64_t q, acc_type a, std::int64_t) const {
    if (values) values[q] = cast<U>(a.v);
    indices[q] = a.i;
  }
};

// =============================================================================================
// CPU kernels
// =============================================================================================

/// Strides over the dims of `shape` that step through the row-major index space of the dims
/// where mask[d] == select (0 on the others): the kept dims' (output) or the reduced dims' index.
inline strides_t subspace_strides(const shape_t& shape, const std::vector<bool>& mask, bool select) {
  strides_t st(shape.size(), 0);
  std::int64_t acc = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    if (mask[d] != select) continue;
    st[d] = acc;
    acc *= shape[d];
  }
  return st;
}

/// The strides that read a reduction's result (`out_strides`, of a result with or without the
/// reduced dims) at the input's dims: 0 along the reduced dims.
inline strides_t restore_reduced_strides(const strides_t& out_strides, const std::vector<bool>& mask,
                                         bool keepdim) {
  strides_t st(mask.size(), 0);
  std::size_t j = 0;
  for (std::size_t d = 0; d < mask.size(); ++d) {
    if (mask[d]) {
      if (keepdim) ++j;
      continue;
    }
    st[d] = out_strides[j++];
  }
  return st;
}

/// Checks a kernel's pre-allocated output: on `where` (cpu or a device), contiguous, and of the
/// inferred shape. A mismatch is the caller's bug, named with both shapes.
template <class U>
void check_output(const char* what, const char* name, const tensor<U>& out, const shape_t& expect,
                  bool on_cpu) {
  CCGRAPH_CHECK(out.shape() == expect, what, ": ", name, " has shape ", shape_str(out.shape()),
                ", expected ", shape_str(expect));
  CCGRAPH_CHECK(out.is_contiguous(), what, ": ", name, " of shape ", shape_str(out.shape()),
                " must be contiguous");
  CCGRAPH_CHECK(out.device().is_cpu() == on_cpu, what, ": ", name, " is on ", out.device(),
                on_cpu ? ", expected the host" : ", expected a CUDA device");
}

/// Checks that an input lives where the kernel runs.
template <class T>
void check_input(const char* what, const char* name, const tensor<T>& in, bool on_cpu) {
  CCGRAPH_CHECK(in.device().is_cpu() == on_cpu, what, ": ", name, " is on ", in.device(),
                on_cpu ? ", expected the host" : ", expected a CUDA device");
}

/// Runs reducer `r` over `in` on the CPU: every element combined, in row-major order, into the
/// state of its output, then every output stored.
template <class T, class R>
void reduce_cpu_run(const tensor<T>& in, const std::vector<bool>& mask, const R& r) {
  using V = compute_t<T>;
  const shape_t& shape = in.shape();
  const strides_t out_st = subspace_strides(shape, mask, false);
  const strides_t red_st = subspace_strides(shape, mask, true);
  const std::int64_t n = reduce_count(shape, mask);
  std::int64_t outputs = 1;
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (!mask[d]) outputs *= shape[d];
  // Not a std::vector: the state of a bool max is a bool, and vector<bool> has no bool&.
  const std::unique_ptr<typename R::acc_type[]> acc(new typename R::acc_type[static_cast<std::size_t>(outputs)]);
  std::fill(acc.get(), acc.get() + outputs, r.init());
  const T* p = in.data();
  for_each_offset<3>(shape, {&in.strides(), &out_st, &red_st}, [&](auto o) {
    r.combine(acc[static_cast<std::size_t>(o[1])], static_cast<V>(p[o[0]]), o[2]);
  });
  for (std::int64_t q = 0; q < outputs; ++q) r.store(q, acc[static_cast<std::size_t>(q)], n);
}

/// sum(in, dims, keepdim) into `out` (shape reduce_shape(...), dtype sum_t<T>).
template <class T>
void sum_cpu(const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim,
             const tensor<sum_t<T>>& out) {
  const std::vector<bool> mask = reduce_mask(in.shape(), dims, "sum");
  check_input("sum", "input", in, true);
  check_output("sum", "output", out, reduce_shape(in.shape(), mask, keepdim), true);
  reduce_cpu_run(in, mask, sum_reducer<cpu_acc_t<T>, sum_t<T>>{out.data()});
}

/// mean(in, dims, keepdim) into `out`; floating types only.
template <class T>
void mean_cpu(const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& out) {
  (void)mean_meta({dtype_v<T>, in.shape()}, dims, keepdim);
  if constexpr (is_floating_element_v<T>) {
    const std::vector<bool> mask = reduce_mask(in.shape(), dims, "mean");
    check_input("mean", "input", in, true);
    check_output("mean", "output", out, reduce_shape(in.shape(), mask, keepdim), true);
    reduce_cpu_run(in, mask, mean_reducer<cpu_acc_t<T>, T>{out.data()});
  }
}

/// var(in, dims, correction, keepdim) into `out`; floating types only.
template <class T>
void var_cpu(const tensor<T>& in, const std::vector<std::int64_t>& dims, double correction, bool keepdim,
             const tensor<T>& out) {
  (void)var_meta({dtype_v<T>, in.shape()}, dims, correction, keepdim);
  if constexpr (is_floating_element_v<T>) {
    using A = cpu_acc_t<T>;
    const std::vector<bool> mask = reduce_mask(in.shape(), dims, "var");
    check_input("var", "input", in, true);
    check_output("var", "output", out, reduce_shape(in.shape(), mask, keepdim), true);
    reduce_cpu_run(in, mask, var_reducer<A, T>{out.data(), static_cast<A>(correction)});
  }
}

/// amax (Max) or amin over `dims` into `out`.
template <bool Max, class T>
void extreme_cpu(const char* what, const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim,
                 const tensor<T>& out) {
  const tensor_meta m = amax_meta({dtype_v<T>, in.shape()}, dims, keepdim, what);
  check_input(what, "input", in, true);
  check_output(what, "output", out, m.shape, true);
  reduce_cpu_run(in, reduce_mask(in.shape(), dims, what), extreme_reducer<compute_t<T>, T, Max>{out.data()});
}

/// amax(in, dims, keepdim) into `out` (NaN propagates).
template <class T>
void amax_cpu(const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& out) {
  extreme_cpu<true>("amax", in, dims, keepdim, out);
}
/// amin(in, dims, keepdim) into `out` (NaN propagates).
template <class T>
void amin_cpu(const tensor<T>& in, const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& out) {
  extreme_cpu<false>("amin", in, dims, keepdim, out);
}

/// max(in) / min(in) over every element into the 0-d `out`.
template <bool Max, class T>
void extreme_all_cpu(const tensor<T>& in, const tensor<T>& out) {
  const char* what = Max ? "max" : "min";
  (void)max_all_meta({dtype_v<T>, in.shape()}, what);
  check_input(what, "input", in, true);
  check_output(what, "output", out, {}, true);
  reduce_cpu_run(in, std::vector<bool>(in.shape().size(), true), extreme_reducer<compute_t<T>, T, Max>{out.data()});
}
/// max(in): the largest element (NaN if any is NaN), 0-d.
template <class T>
void max_cpu(const tensor<T>& in, const tensor<T>& out) {
  extreme_all_cpu<true>(in, out);
}
/// min(in): the smallest element (NaN if any is NaN), 0-d.
template <class T>
void min_cpu(const tensor<T>& in, const tensor<T>& out) {
  extreme_all_cpu<false>(in, out);
}

/// max(in, dim) / min(in, dim) into `values` and i64 `indices`.
template <bool Max, class T>
void extreme_dim_cpu(const tensor<T>& in, std::int64_t dim, bool keepdim, const tensor<T>& values,
                     const tensor<std::int64_t>& indices) {
  const char* what = Max ? "max" : "min";
  const auto m = max_dim_meta({dtype_v<T>, in.shape()}, dim, keepdim, what);
  check_input(what, "input", in, true);
  check_output(what, "values", values, m[0].shape, true);
  check_output(what, "indices", indices, m[1].shape, true);
  reduce_cpu_run(in, reduce_mask(in.shape(), {dim}, what),
                 arg_reducer<compute_t<T>, T, Max>{values.data(), indices.data()});
}
/// max(in, dim, keepdim): values and the index of the first maximal value along `dim`.
template <class T>
void max_dim_cpu(const tensor<T>& in, std::int64_t dim, bool keepdim, const tensor<T>& values,
                 const tensor<std::int64_t>& indices) {
  extreme_dim_cpu<true>(in, dim, keepdim, values, indices);
}
/// min(in, dim, keepdim): values and the index of the first minimal value along `dim`.
template <class T>
void min_dim_cpu(const tensor<T>& in, std::int64_t dim, bool keepdim, const tensor<T>& values,
                 const tensor<std::int64_t>& indices) {
  extreme_dim_cpu<false>(in, dim, keepdim, values, indices);
}

/// The reduction mask of argmax / argmin: one dim, or (no dim) all of them.
inline std::vector<bool> arg_mask(const shape_t& shape, std::optional<std::int64_t> dim, const char* what) {
  return dim ? reduce_mask(shape, {*dim}, what) : std::vector<bool>(shape.size(), true);
}

/// argmax (Max) / argmin into i64 `out`.
template <bool Max, class T>
void arg_cpu(const tensor<T>& in, std::optional<std::int64_t> dim, bool keepdim, const tensor<std::int64_t>& out) {
  const char* what = Max ? "argmax" : "argmin";
  const tensor_meta m = argmax_meta({dtype_v<T>, in.shape()}, dim, keepdim, what);
  check_input(what, "input", in, true);
  check_output(what, "output", out, m.shape, true);
  reduce_cpu_run(in, arg_mask(in.shape(), dim, what), arg_reducer<compute_t<T>, T, Max>{nullptr, out.data()});
}
/// argmax(in, dim, keepdim): index of the first maximal value (into the flattened input without
/// a dim).
template <class T>
void argmax_cpu(const tensor<T>& in, std::optional<std::int64_t> dim, bool keepdim,
                const tensor<std::int64_t>& out) {
  arg_cpu<true>(in, dim, keepdim, out);
}
/// argmin(in, dim, keepdim): index of the first minimal value.
template <class T>
void argmin_cpu(const tensor<T>& in, std::optional<std::int64_t> dim, bool keepdim,
                const tensor<std::int64_t>& out) {
  arg_cpu<false>(in, dim, keepdim, out);
}

// =============================================================================================
// Backward kernels (the reductions whose gradient is not a plain broadcast)
// =============================================================================================

/// How the gradient of an extreme reaches tied elements:
///   by_count      amax / amin: (grad / count) * (in == result), PyTorch's scale_grad_by_count;
///                 a slice whose result is NaN matches nothing, so it gets NaN everywhere.
///   nan_matches   max() / min() without dim: PyTorch's evenly_distribute_backward; NaN
///                 elements match a NaN result, the others get exactly 0.
enum class extreme_grad { by_count, nan_matches };

/// One element's gradient of an extreme: `g` spread over `count` matching elements.
template <class A>
CCGRAPH_HOST_DEVICE inline A extreme_grad_value(extreme_grad mode, A g, std::int64_t count, bool match) {
  if (mode == extreme_grad::nan_matches) return match ? g / static_cast<A>(count) : A(0);
  return (g / static_cast<A>(count)) * (match ? A(1) : A(0));
}

/// Whether element `x` matches the result `r` of its slice under `mode`.
template <class V>
CCGRAPH_HOST_DEVICE inline bool extreme_grad_match(extreme_grad mode, V x, V r) {
  return x == r || (mode == extreme_grad::nan_matches && is_nan_value(x) && is_nan_value(r));
}

/// The validated arguments of an extreme's backward.
inline std::vector<bool> extreme_backward_mask(const char* what, const shape_t& in, const shape_t& grad,
                                               const shape_t& result, const std::vector<std::int64_t>& dims,
                                               bool keepdim) {
  const std::vector<bool> mask = reduce_mask(in, dims, what);
  const shape_t s = reduce_shape(in, mask, keepdim);
  CCGRAPH_CHECK(grad == s && result == s, what, ": grad of shape ", shape_str(grad), " and result of shape ",
                shape_str(result), " must have the reduced shape ", shape_str(s), " of input ", shape_str(in));
  return mask;
}

/// The gradient of amax / amin (extreme_grad::by_count) or of max() / min() without dim
/// (extreme_grad::nan_matches, dims empty, keepdim false) with respect to `in`, given the
/// forward's `result` and the incoming `grad` (both of the reduced shape, any strides).
template <class T>
void extreme_backward_cpu(extreme_grad mode, const tensor<T>& grad, const tensor<T>& in, const tensor<T>& result,
                          const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& grad_in) {
  using V = compute_t<T>;
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const char* what = mode == extreme_grad::by_count ? "amax_backward" : "max_backward";
  static_assert(is_floating_element_v<T>, "extreme_backward_cpu: gradients need a floating type");
  const std::vector<bool> mask = extreme_backward_mask(what, in.shape(), grad.shape(), result.shape(), dims, keepdim);
  check_input(what, "grad", grad, true);
  check_input(what, "input", in, true);
  check_input(what, "result", result, true);
  check_output(what, "grad_input", grad_in, in.shape(), true);
  const strides_t gs = restore_reduced_strides(grad.strides(), mask, keepdim);
  const strides_t rs = restore_reduced_strides(result.strides(), mask, keepdim);
  const strides_t qs = subspace_strides(in.shape(), mask, false);
  const strides_t os = contiguous_strides(in.shape());
  std::vector<std::int64_t> count(static_cast<std::size_t>(numel_of(reduce_shape(in.shape(), mask, false))), 0);
  const T* x = in.data();
  const T* r = result.data();
  const T* g = grad.data();
  T* dx = grad_in.data();
  for_each_offset<3>(in.shape(), {&in.strides(), &rs, &qs}, [&](auto o) {
    count[static_cast<std::size_t>(o[2])] += extreme_grad_match(mode, static_cast<V>(x[o[0]]), static_cast<V>(r[o[1]]));
  });
  for_each_offset<5>(in.shape(), {&in.strides(), &rs, &qs, &gs, &os}, [&](auto o) {
    const bool m = extreme_grad_match(mode, static_cast<V>(x[o[0]]), static_cast<V>(r[o[1]]));
    dx[o[4]] = cast<T>(extreme_grad_value(mode, static_cast<A>(static_cast<V>(g[o[3]])),
                                          count[static_cast<std::size_t>(o[2])], m));
  });
}

/// amax's and amin's backward: the gradient split evenly over the tied extremes.
template <class T>
void amax_backward_cpu(const tensor<T>& grad, const tensor<T>& in, const tensor<T>& result,
                       const std::vector<std::int64_t>& dims, bool keepdim, const tensor<T>& grad_in) {
  extreme_backward_cpu(extreme_grad::by_count, grad, in, result, dims, keepdim, grad_in);
}

/// max()'s and min()'s backward (no dim): the gradient split evenly over the tied extremes.
template <class T>
void max_backward_cpu(const tensor<T>& grad, const tensor<T>& in, const tensor<T>& result, const tensor<T>& grad_in) {
  extreme_backward_cpu(extreme_grad::nan_matches, grad, in, result, {}, false, grad_in);
}

/// Validates max(dim)'s backward arguments; returns the normalised dim.
inline int max_dim_backward_check(const shape_t& in, const shape_t& grad, const shape_t& indices, std::int64_t dim,
                                  bool keepdim) {
  const std::vector<bool> mask = reduce_mask(in, {dim}, "max_backward");
  const shape_t s = reduce_shape(in, mask, keepdim);
  CCGRAPH_CHECK(grad == s && indices == s, "max_backward: grad of shape ", shape_str(grad),
                " and indices of shape ", shape_str(indices), " must have the reduced shape ", shape_str(s),
                " of input ", shape_str(in));
  return in.empty() ? 0 : normalize_dim(dim, in.size(), "max_backward");
}

/// max(dim)'s and min(dim)'s backward: `grad` goes to the element each index names, 0 elsewhere
/// (PyTorch's value_selecting_reduction_backward). `in_shape` is the forward input's shape.
template <class T>
void max_dim_backward_cpu(const tensor<T>& grad, const tensor<std::int64_t>& indices, std::int64_t dim, bool keepdim,
                          const tensor<T>& grad_in) {
  const shape_t& in_shape = grad_in.shape();
  const int d = max_dim_backward_check(in_shape, grad.shape(), indices.shape(), dim, keepdim);
  check_input("max_backward", "grad", grad, true);
  check_input("max_backward", "indices", indices, true);
  check_output("max_backward", "grad_input", grad_in, in_shape, true);
  std::vector<bool> mask(in_shape.size(), false);
  if (!in_shape.empty()) mask[static_cast<std::size_t>(d)] = true;
  const strides_t gs = restore_reduced_strides(grad.strides(), mask, keepdim);
  const strides_t is = restore_reduced_strides(indices.strides(), mask, keepdim);
  const strides_t red = subspace_strides(in_shape, mask, true);  // the coordinate along dim
  const strides_t os = contiguous_strides(in_shape);
  const std::int64_t size = in_shape.empty() ? 1 : in_shape[static_cast<std::size_t>(d)];
  const T* g = grad.data();
  const std::int64_t* ix = indices.data();
  T* dx = grad_in.data();
  for_each_offset<4>(in_shape, {&gs, &is, &red, &os}, [&](auto o) {
    const std::int64_t k = ix[o[1]];
    CCGRAPH_CHECK(k >= 0 && k < size, "max_backward: index ", k, " out of range for dim ", d, " of size ", size);
    dx[o[3]] = k == o[2] ? g[o[0]] : T(0);
  });
}

/// var's gradient scale 2 / (N - correction) and whether PyTorch's dim=None rule applies: there
/// (no dims, or a 0-d input) a non-positive N - correction gives grad * (x == mean ? NaN : inf).
struct var_grad_scale {
  double scale;
  bool degenerate;  // the dim=None rule with N - correction <= 0
};
inline var_grad_scale var_backward_scale(const shape_t& in, const std::vector<bool>& mask, bool all_dims,
                                         double correction) {
  const double dof = static_cast<double>(reduce_count(in, mask)) - correction;
  if (all_dims && dof <= 0) return {0.0, true};
  return {2.0 / dof, false};
}

/// One element's var gradient from its slice's mean.
template <class A>
CCGRAPH_HOST_DEVICE inline A var_grad_value(A g, A x, A mean, A scale, bool degenerate) {
  if (degenerate)
    return g * (x == mean ? std::numeric_limits<A>::quiet_NaN() : std::numeric_limits<A>::infinity());
  return scale * g * (x - mean);
}

/// var's backward: grad_in = 2 / (N - correction) * grad * (in - mean(in, dims)); empty `dims`
/// means dim=None (PyTorch's special case for N - correction <= 0 applies).
template <class T>
void var_backward_cpu(const tensor<T>& grad, const tensor<T>& in, const std::vector<std::int64_t>& dims,
                      double correction, bool keepdim, const tensor<T>& grad_in) {
  static_assert(is_floating_element_v<T>, "var_backward_cpu: gradients need a floating type");
  using A = cpu_acc_t<T>;
  const std::vector<bool> mask = reduce_mask(in.shape(), dims, "var_backward");
  const shape_t s = reduce_shape(in.shape(), mask, keepdim);
  CCGRAPH_CHECK(grad.shape() == s, "var_backward: grad of shape ", shape_str(grad.shape()),
                " must have the reduced shape ", shape_str(s), " of input ", shape_str(in.shape()));
  check_input("var_backward", "grad", grad, true);
  check_input("var_backward", "input", in, true);
  check_output("var_backward", "grad_input", grad_in, in.shape(), true);
  const std::int64_t outputs = numel_of(reduce_shape(in.shape(), mask, false));
  std::vector<A> mean(static_cast<std::size_t>(outputs));
  reduce_cpu_run(in, mask, mean_reducer<A, A>{mean.data()});
  const var_grad_scale sc = var_backward_scale(in.shape(), mask, dims.empty() || in.shape().empty(), correction);
  const strides_t gs = restore_reduced_strides(grad.strides(), mask, keepdim);
  const strides_t qs = subspace_strides(in.shape(), mask, false);
  const strides_t os = contiguous_strides(in.shape());
  const T* g = grad.data();
  const T* x = in.data();
  T* dx = grad_in.data();
  for_each_offset<4>(in.shape(), {&in.strides(), &gs, &qs, &os}, [&](auto o) {
    dx[o[3]] = cast<T>(var_grad_value(static_cast<A>(static_cast<compute_t<T>>(g[o[1]])),
                                      static_cast<A>(static_cast<compute_t<T>>(x[o[0]])),
                                      mean[static_cast<std::size_t>(o[2])], static_cast<A>(sc.scale), sc.degenerate));
  });
}

}  // namespace ccgraph::detail
