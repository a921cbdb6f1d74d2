// ccgraph/tensor/tensor.hpp: tensor<T>, a shared, strided view of typed memory that may still be
// pending (the output of a collective not yet waited on).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/expr/fwd.hpp>
#include <ccgraph/tensor/async.hpp>
#include <ccgraph/tensor/device_runtime.hpp>
#include <ccgraph/tensor/kernel_tree.hpp>
#include <ccgraph/tensor/storage.hpp>
#include <ccgraph/tensor/strided.hpp>

namespace ccgraph {

/// An n-dimensional array of T. Copies are cheap handles that share memory, like torch.Tensor.
///
/// A tensor returned by a functional collective is *pending*: its bytes are still being written
/// by the communication worker. View operations (reshape of a contiguous tensor, chunk, narrow,
/// transpose, ...) keep it pending; any use that reads the values (data(), to_vector(), compute,
/// printing) first waits, as PyTorch's AsyncCollectiveTensor does.
template <element T>
class tensor : public pointwise_operators::operand_tag {  // finds the pointwise operators
 public:
  using value_type = T;

  /// An empty 1-d tensor (shape [0]).
  tensor() : tensor(empty_of({0})) {}

  /// Wraps existing storage (used by backends and views).
  tensor(std::shared_ptr<detail::storage> st, shape_t shape, strides_t strides, std::int64_t offset,
         detail::work_ptr pending = {})
      : storage_(std::move(st)),
        shape_(std::move(shape)),
        strides_(std::move(strides)),
        offset_(offset),
        pending_(std::move(pending)) {}

  /// Evaluates a lazy pointwise expression into a new tensor.
  template <expression E>
  tensor(const E& e)  // NOLINT: implicit, so `tensor<float> c = relu(a) + b;` reads naturally
      : tensor(eval_expr(e)) {}

  /// A new, uninitialised contiguous tensor on this thread's default device (the host unless
  /// the rank runs on a GPU; see default_device()).
  static tensor empty(shape_t shape) { return empty_of(std::move(shape), default_device()); }
  /// A new, uninitialised contiguous tensor on `dev`.
  static tensor empty(shape_t shape, ccgraph::device dev) { return empty_of(std::move(shape), dev); }
  /// A new, uninitialised contiguous tensor on `dev`; `what` names the caller in errors (a shape
  /// too large to count or to allocate).
  static tensor empty(shape_t shape, ccgraph::device dev, std::string_view what) {
    return empty_of(std::move(shape), dev, what);
  }

  /// A new tensor holding `values` in row-major order with the given shape, on this thread's
  /// default device.
  static tensor from(std::initializer_list<T> values, shape_t shape) {
    return from_range(values.begin(), values.size(), std::move(shape));
  }
  /// A new tensor holding `values` in row-major order with the given shape.
  static tensor from(const std::vector<T>& values, shape_t shape) {
    return from_range(values.begin(), values.size(), std::move(shape));
  }
  /// A new 1-d tensor holding `values`.
  static tensor from(const std::vector<T>& values) {
    return from_range(values.begin(), values.size(), {static_cast<std::int64_t>(values.size())});
  }

  // ---- metadata (never waits) ----
  /// Sizes of the dimensions.
  const shape_t& shape() const { return shape_; }
  /// Size of dimension `d` (negative counts from the end).
  std::int64_t size(std::int64_t d) const { return shape_[indexed_dim(d, "size")]; }
  /// Element strides of the dimensions.
  const strides_t& strides() const { return strides_; }
  /// Offset of the first element in the storage, in elements.
  std::int64_t storage_offset() const { return offset_; }
  /// Number of dimensions.
  int dim() const { return static_cast<int>(shape_.size()); }
  /// Number of elements.
  std::int64_t numel() const { return numel_of(shape_); }
  /// The runtime element-type tag.
  static constexpr ccgraph::dtype dtype() { return dtype_v<T>; }
  /// Where the memory lives.
  ccgraph::device device() const { return storage_ ? storage_->dev() : ccgraph::device::cpu(); }
  /// True when elements are laid out row-major without gaps.
  bool is_contiguous() const {
    std::int64_t expect = 1;
    for (std::size_t i = shape_.size(); i-- > 0;) {
      if (shape_[i] != 1 && strides_[i] != expect) return false;
      expect *= shape_[i];
    }
    return true;
  }
  /// The shared storage (backends use this to pass buffers without copying).
  const std::shared_ptr<detail::storage>& storage() const { return storage_; }

  // ---- async ----
  /// True while a collective is still writing this tensor and nobody has waited on it.
  bool is_pending() const { return pending_ && !pending_->ready(); }
  /// The completion this tensor waits on, or null.
  const detail::work_ptr& pending_work() const { return pending_; }
  /// Waits for the collective that produces this tensor (a no-op if it is not pending);
  /// rethrows the collective's error.
  void wait() const {
    if (pending_) {
      pending_->wait();
      pending_.reset();
    }
  }

  // ---- element access (waits) ----
  /// Pointer to the first element; waits if pending.
  T* data() const {
    wait();
    return data_unsynced();
  }
  /// Pointer to the first element without waiting: for backends that order accesses themselves.
  T* data_unsynced() const {
    return storage_ ? static_cast<T*>(storage_->data()) + offset_ : nullptr;
  }
  /// The element at a full index; waits if pending. Host tensors only (a reference into device
  /// memory would be unusable): read a device tensor with item(), to_vector() or cpu().
  T& at(std::initializer_list<std::int64_t> index) const {
    CCGRAPH_CHECK(device().is_cpu(), "tensor::at: tensor of shape ", shape_str(shape_), " is on ",
                  device(), "; copy it to the host with cpu() first");
    CCGRAPH_CHECK(index.size() == shape_.size(), "tensor::at: ", index.size(),
                  " indices for a tensor of shape ", shape_str(shape_));
    std::int64_t off = 0;
    std::size_t d = 0;
    for (auto i : index) {
      CCGRAPH_CHECK(i >= 0 && i < shape_[d], "tensor::at: index ", i, " out of range for dim ", d,
                    " of size ", shape_[d]);
      off += i * strides_[d++];
    }
    return data()[off];
  }
  /// The value of a one-element tensor; waits if pending (a device tensor: copies it to the host).
  T item() const {
    CCGRAPH_CHECK(numel() == 1, "tensor::item: tensor of shape ", shape_str(shape_),
                  " has ", numel(), " elements, not 1");
    if (!device().is_cpu()) return cpu().item();
    return *data();
  }
  /// The values in row-major order (a copy on the host); waits if pending.
  std::vector<T> to_vector() const {
    if (!device().is_cpu()) return cpu().to_vector();
    std::vector<T> out;
    out.reserve(static_cast<std::size_t>(numel()));
    const T* p = data();
    detail::for_each_offset<1>(shape_, {&strides_}, [&](auto o) { out.push_back(p[o[0]]); });
    return out;
  }

  // ---- devices ----
  /// A contiguous copy on `dev` (this tensor itself when it is already contiguous there), like
  /// torch's .to(device). A copy to the host is complete when this returns; one to a device is
  /// ordered on the calling thread's stream.
  tensor to(ccgraph::device dev) const {
    if (dev == device() && is_contiguous()) return *this;
    const tensor src = contiguous();
    tensor out = empty_of(shape_, dev);
    const std::size_t bytes = static_cast<std::size_t>(numel()) * sizeof(T);
    if (bytes == 0) return out;
    const ccgraph::device via = dev.is_cpu() ? src.device() : dev;
    detail::require_device_runtime("tensor::to", via)
        .copy(out.data_unsynced(), dev, src.data(), src.device(), bytes);
    return out;
  }
  /// A copy on the host (or this tensor, when it is a contiguous host tensor).
  tensor cpu() const { return to(ccgraph::device::cpu()); }
  /// A copy on CUDA device `i`.
  tensor cuda(int i = 0) const { return to(ccgraph::device::cuda(i)); }

  // ---- views (never wait; keep the pending state) ----
  /// A view with a new shape (one size may be -1); copies only when the layout requires it.
  tensor reshape(shape_t new_shape) const {
    new_shape = infer_shape(std::move(new_shape), "reshape");
    if (is_contiguous()) return {storage_, new_shape, contiguous_strides(new_shape), offset_, pending_};
    return contiguous().reshape(std::move(new_shape));
  }
  /// A view with a new shape; the tensor must be contiguous.
  tensor view(shape_t new_shape) const {
    CCGRAPH_CHECK(is_contiguous(), "view: tensor of shape ", shape_str(shape_),
                  " is not contiguous; use reshape");
    return reshape(std::move(new_shape));
  }
  /// A 1-d view of all elements.
  tensor flatten() const { return reshape({numel()}); }
  /// Splits into `chunks` views along `dim`, each of size ceil(size/chunks) but the last
  /// (PyTorch's chunk: fewer pieces when the size is small, `chunks` empty ones when it is 0).
  std::vector<tensor> chunk(std::int64_t chunks, std::int64_t dim = 0) const {
    CCGRAPH_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
    const int d = indexed_dim(dim, "chunk");
    const std::int64_t n = shape_[d];
    if (n == 0) return std::vector<tensor>(static_cast<std::size_t>(chunks), narrow(d, 0, 0));
    const std::int64_t step = (n + chunks - 1) / chunks;
    std::vector<tensor> out;
    for (std::int64_t start = 0; start < n; start += step)
      out.push_back(narrow(d, start, std::min(step, n - start)));
    return out;
  }
  /// Elements [start, start+length) along `dim`, as a view.
  tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const {
    const int d = indexed_dim(dim, "narrow");
    if (start < 0) start += shape_[d];
    CCGRAPH_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d], "narrow: start ", start,
                  " + length ", length, " exceeds dim ", d, " of size ", shape_[d]);
    shape_t s = shape_;
    s[d] = length;
    return {storage_, s, strides_, offset_ + start * strides_[d], pending_};
  }
  /// The slice at `index` along `dim`, with that dimension removed.
  tensor select(std::int64_t dim, std::int64_t index) const {
    const int d = indexed_dim(dim, "select");
    if (index < 0) index += shape_[d];
    CCGRAPH_CHECK(index >= 0 && index < shape_[d], "select: index ", index,
                  " out of range for dim ", d, " of size ", shape_[d]);
    shape_t s = shape_;
    strides_t st = strides_;
    s.erase(s.begin() + d);
    st.erase(st.begin() + d);
    return {storage_, s, st, offset_ + index * strides_[d], pending_};
  }
  /// Swaps two dimensions, as a view.
  tensor transpose(std::int64_t d0, std::int64_t d1) const {
    const int a = normalize_dim(d0, shape_.size(), "transpose");
    const int b = normalize_dim(d1, shape_.size(), "transpose");
    if (shape_.empty()) return *this;  // 0-d: transpose(0, -1) is a no-op, as in PyTorch
    shape_t s = shape_;
    strides_t st = strides_;
    std::swap(s[a], s[b]);
    std::swap(st[a], st[b]);
    return {storage_, s, st, offset_, pending_};
  }
  /// Reorders dimensions, as a view: result dim i is this tensor's dim `order[i]`.
  tensor permute(const std::vector<std::int64_t>& order) const {
    CCGRAPH_CHECK(order.size() == shape_.size(), "permute: ", order.size(),
                  " dims given for a tensor of rank ", shape_.size());
    shape_t s(order.size());
    strides_t st(order.size());
    std::vector<bool> seen(order.size(), false);
    for (std::size_t i = 0; i < order.size(); ++i) {
      const int d = normalize_dim(order[i], shape_.size(), "permute");
      CCGRAPH_CHECK(!seen[d], "permute: dim ", d, " repeated in ", list_str(order));
      seen[d] = true;
      s[i] = shape_[d];
      st[i] = strides_[d];
    }
    return {storage_, s, st, offset_, pending_};
  }
  /// Inserts a dimension of size 1 at `dim`, as a view.
  tensor unsqueeze(std::int64_t dim) const {
    const int d = normalize_dim(dim, shape_.size() + 1, "unsqueeze");
    shape_t s = shape_;
    strides_t st = strides_;
    const std::int64_t stride = d < static_cast<int>(shape_.size()) ? strides_[d] * shape_[d] : 1;
    s.insert(s.begin() + d, 1);
    st.insert(st.begin() + d, stride);
    return {storage_, s, st, offset_, pending_};
  }

  // ---- copies (wait) ----
  /// This tensor if already contiguous, else a contiguous copy.
  tensor contiguous() const {
    if (is_contiguous()) return *this;
    return clone();
  }
  /// A contiguous copy.
  tensor clone() const {
    tensor out = empty_of(shape_, device());
    out.copy_(*this);
    return out;
  }
  /// Copies `src` (same shape, or broadcastable to it) into this tensor's elements, in place.
  tensor& copy_(const tensor& src) {
    if (src.shape_ != shape_) {
      const shape_t b = broadcast_shapes(shape_, src.shape_, "copy_");
      CCGRAPH_CHECK(b == shape_, "copy_: source of shape ", shape_str(src.shape_),
                    " cannot be broadcast to destination shape ", shape_str(shape_));
    }
    CCGRAPH_CHECK(src.device() == device(), "copy_: source on ", src.device(),
                  " but destination on ", device(), "; move it with .to(device) first");
    const strides_t ss = detail_broadcast_strides(src, shape_);
    const T* s = src.data();
    T* d = data();
    if (!device().is_cpu()) {
      detail::launch_device_pointwise("copy_", device(), detail::tensor_kernel<T, 1>{s}, d, shape_,
                                      std::array<strides_t, 2>{strides_, ss});
      return *this;
    }
    detail::for_each_offset<2>(shape_, {&strides_, &ss}, [&](auto o) { d[o[0]] = s[o[1]]; });
    return *this;
  }
  /// Fills every element with `value`, in place.
  tensor& fill_(T value) {
    T* d = data();
    if (!device().is_cpu()) {
      detail::launch_device_pointwise("fill_", device(), detail::scalar_kernel<T>{value}, d, shape_,
                                      std::array<strides_t, 1>{strides_});
      return *this;
    }
    detail::for_each_offset<1>(shape_, {&strides_}, [&](auto o) { d[o[0]] = value; });
    return *this;
  }
  /// Tiles the tensor: dim i repeated `times[i]` times (PyTorch's repeat; extra leading
  /// entries add dimensions).
  tensor repeat(const std::vector<std::int64_t>& times) const {
    (void)repeat_shape(shape_, times);  // validates
    const std::size_t extra = times.size() - shape_.size();
    shape_t in_shape(extra, 1);
    in_shape.insert(in_shape.end(), shape_.begin(), shape_.end());
    strides_t in_strides(extra, 0);
    in_strides.insert(in_strides.end(), strides_.begin(), strides_.end());
    // View the output as [t0, s0, t1, s1, ...] and copy the source with stride 0 over each ti.
    shape_t out_shape(times.size());
    shape_t split;
    strides_t src_split;
    for (std::size_t i = 0; i < times.size(); ++i) {
      out_shape[i] = times[i] * in_shape[i];
      split.push_back(times[i]);
      split.push_back(in_shape[i]);
      src_split.push_back(0);
      src_split.push_back(in_strides[i]);
    }
    tensor out = empty_of(out_shape, device());
    const strides_t dst_split = contiguous_strides(split);
    const T* s = data();
    T* d = out.data_unsynced();
    if (!device().is_cpu()) {
      detail::launch_device_pointwise("repeat", device(), detail::tensor_kernel<T, 1>{s}, d, split,
                                      std::array<strides_t, 2>{dst_split, src_split});
      return out;
    }
    detail::for_each_offset<2>(split, {&dst_split, &src_split}, [&](auto o) { d[o[0]] = s[o[1]]; });
    return out;
  }
  /// The shape of `repeat(times)` on a tensor of `shape`; throws for too few or negative counts.
  static shape_t repeat_shape(const shape_t& shape, const std::vector<std::int64_t>& times) {
    CCGRAPH_CHECK(times.size() >= shape.size(), "repeat: ", times.size(),
                  " repeat counts for a tensor of rank ", shape.size(),
                  "; need at least one per dimension");
    for (auto r : times) CCGRAPH_CHECK(r >= 0, "repeat: negative count in ", list_str(times));
    shape_t out(times.size());
    const std::size_t extra = times.size() - shape.size();
    for (std::size_t i = 0; i < times.size(); ++i)
      CCGRAPH_CHECK(checked_mul(times[i], i < extra ? 1 : shape[i - extra], out[i]), "repeat: ",
                    list_str(times), " times shape ", shape_str(shape), " has a size past 2^63 - 1");
    (void)checked_numel(out, "repeat");
    return out;
  }

  /// A copy converted to element type U.
  template <element U>
  tensor<U> to() const {
    auto out = tensor<U>::empty(shape_, device());
    const T* s = data();
    U* d = out.data_unsynced();
    const strides_t cs = contiguous_strides(shape_);
    if (!device().is_cpu()) {
      detail::launch_device_pointwise("to", device(),
                                      detail::cast_kernel<U, detail::tensor_kernel<T, 1>>{{s}}, d,
                                      shape_, std::array<strides_t, 2>{cs, strides_});
      return out;
    }
    detail::for_each_offset<2>(shape_, {&cs, &strides_}, [&](auto o) { d[o[0]] = detail::cast<U>(s[o[1]]); });
    return out;
  }

  /// Strides that read `t` broadcast to `target` (0 on broadcast dims).
  static strides_t detail_broadcast_strides(const tensor& t, const shape_t& target) {
    strides_t st(target.size(), 0);
    const std::size_t lead = target.size() - t.shape_.size();
    for (std::size_t i = 0; i < t.shape_.size(); ++i)
      st[lead + i] = t.shape_[i] == 1 && target[lead + i] != 1 ? 0 : t.strides_[i];
    return st;
  }

 private:
  static tensor empty_of(shape_t shape, ccgraph::device dev = ccgraph::device::cpu(),
                         std::string_view what = "tensor") {
    auto st = detail::allocate_elements(dev, shape, dtype_v<T>, what);
    strides_t strides = contiguous_strides(shape);
    return tensor(std::move(st), std::move(shape), std::move(strides), 0);
  }

  template <class It>
  static tensor from_range(It first, std::size_t count, shape_t shape) {
    CCGRAPH_CHECK(static_cast<std::int64_t>(count) == numel_of(shape), "tensor::from: ", count,
                  " values do not fill shape ", shape_str(shape), " (", numel_of(shape),
                  " elements)");
    tensor out = empty_of(std::move(shape));
    T* d = out.data_unsynced();
    for (std::size_t i = 0; i < count; ++i, ++first) d[i] = static_cast<T>(*first);
    return default_device().is_cpu() ? out : out.to(default_device());
  }

  /// normalize_dim for ops that index into a dimension: a 0-d tensor has none (normalize_dim
  /// accepts dim 0 / -1 at rank 0, which would read past the empty shape).
  int indexed_dim(std::int64_t dim, const char* what) const {
    CCGRAPH_CHECK(!shape_.empty(), what, ": dim ", dim, " is out of range for a tensor of rank 0");
    return normalize_dim(dim, shape_.size(), what);
  }

  shape_t infer_shape(shape_t s, const char* what) const {
    int infer = -1;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] == -1) {
        CCGRAPH_CHECK(infer < 0, what, ": only one dimension can be -1 in ", shape_str(s));
        infer = static_cast<int>(i);
      } else {
        CCGRAPH_CHECK(s[i] >= 0, what, ": invalid size ", s[i], " in ", shape_str(s));
      }
    }
    shape_t given = s;  // the sizes given, counted with overflow checks
    if (infer >= 0) given[static_cast<std::size_t>(infer)] = 1;
    CCGRAPH_CHECK(countable(given), what, ": shape ", shape_str(s),
                  " has too many elements (the product of its sizes exceeds 2^63 - 1)");
    const std::int64_t known = numel_of(given);
    if (infer >= 0) {
      CCGRAPH_CHECK(known != 0 && numel() % known == 0, what, ": shape ", shape_str(s),
                    " is invalid for input of size ", numel());
      s[infer] = numel() / known;
    }
    CCGRAPH_CHECK(checked_numel(s, what) == numel(), what, ": shape ", shape_str(s),
                  " is invalid for input of size ", numel(), " (shape ", shape_str(shape_), ")");
    return s;
  }

  template <class E>
  static tensor eval_expr(const E& e) {
    using V = typename std::remove_cvref_t<E>::value_type;
    static_assert(std::is_same_v<V, T>,
                  "tensor<T>(expression): mixing dtypes: the expression's element type differs "
                  "from the tensor's; convert one side with .to<U>()");
    return e.eval();
  }

  std::shared_ptr<detail::storage> storage_;
  shape_t shape_;
  strides_t strides_;
  std::int64_t offset_ = 0;
  mutable detail::work_ptr pending_;  // reset by the first wait
};

/// True for tensor<T> types.
template <class X>
inline constexpr bool is_tensor_v = false;
template <class T>
inline constexpr bool is_tensor_v<tensor<T>> = true;

/// Any tensor<T>.
template <class X>
concept tensor_type = is_tensor_v<std::remove_cvref_t<X>>;

namespace detail {
/// A tensor of `shape` filled with `value` on this thread's default device; `what` names the
/// factory in errors.
template <element T>
tensor<T> filled(shape_t shape, T value, std::string_view what) {
  auto t = tensor<T>::empty(std::move(shape), default_device(), what);
  t.fill_(value);
  return t;
}
}  // namespace detail

/// A tensor of `shape` filled with `value`.
template <element T>
tensor<T> full(shape_t shape, T value) {
  return detail::filled<T>(std::move(shape), value, "full");
}
/// A tensor of zeros.
template <element T>
tensor<T> zeros(shape_t shape) {
  return detail::filled<T>(std::move(shape), T(0), "zeros");
}
/// A tensor of ones.
template <element T>
tensor<T> ones(shape_t shape) {
  return detail::filled<T>(std::move(shape), T(1), "ones");
}
/// A tensor of `shape`, uninitialised.
template <element T>
tensor<T> empty(shape_t shape) {
  return tensor<T>::empty(std::move(shape), default_device(), "empty");
}
/// The 1-d tensor [start, start+step, ...) up to (excluding) `end`.
template <element T>
tensor<T> arange(double start, double end, double step = 1.0) {
  CCGRAPH_CHECK(step != 0, "arange: step must be nonzero");
  const double span = (end - start) / step;
  // 2^63 as a double: a larger (or NaN) count would make the conversion undefined.
  CCGRAPH_CHECK(span < 9223372036854775808.0, "arange: [", start, ", ", end, ") in steps of ", step,
                " has too many elements");
  const auto n = static_cast<std::int64_t>(span > 0 ? std::ceil(span) : 0);
  auto t = tensor<T>::empty({n}, device::cpu(), "arange");
  T* d = t.data_unsynced();
  for (std::int64_t i = 0; i < n; ++i) d[i] = detail::cast<T>(start + static_cast<double>(i) * step);
  return default_device().is_cpu() ? t : t.to(default_device());
}
/// The 1-d tensor [0, 1, ..., n-1].
template <element T>
tensor<T> arange(std::int64_t n) {
  return arange<T>(0.0, static_cast<double>(n), 1.0);
}

}  // namespace ccgraph
