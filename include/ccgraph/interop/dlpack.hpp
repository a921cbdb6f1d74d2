// ccgraph/interop/dlpack.hpp: zero-copy exchange with PyTorch, JAX, CuPy and any DLPack
// producer or consumer (DLPack 0.6 and later, Debian's libdlpack-dev). Not in the umbrella header:
// include it where you exchange tensors.
//
//   DLManagedTensor* m = cg::to_dlpack(t);        // the consumer calls m->deleter(m)
//   auto u = cg::from_dlpack<float>(m);           // takes ownership; u views the same memory
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <dlpack/dlpack.h>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/tensor/device_runtime.hpp>
#include <ccgraph/tensor/from_blob.hpp>
#include <ccgraph/tensor/storage.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {
namespace detail {

/// DLPack's code for bool (kDLBool), added in DLPack 0.8; PyTorch exports bool tensors with it.
inline constexpr std::uint8_t dl_bool_code = 6;

/// A dtype's DLPack type (one lane).
inline DLDataType dl_dtype_of(dtype d) {
  switch (d) {
    case dtype::f32: return {kDLFloat, 32, 1};
    case dtype::f64: return {kDLFloat, 64, 1};
    case dtype::f16: return {kDLFloat, 16, 1};
    case dtype::bf16: return {kDLBfloat, 16, 1};
    case dtype::i32: return {kDLInt, 32, 1};
    case dtype::i64: return {kDLInt, 64, 1};
    case dtype::u8: return {kDLUInt, 8, 1};
    case dtype::boolean: return {dl_bool_code, 8, 1};
    case dtype::c64: return {kDLComplex, 64, 1};
    case dtype::c128: return {kDLComplex, 128, 1};
  }
  CCGRAPH_THROW(error, "to_dlpack: dtype ", d, " has no DLPack type");
}

/// The dtype of a DLPack type, or nullopt when ccgraph has none (i8, i16, u16, f8, lanes > 1...).
inline std::optional<dtype> dtype_of_dl(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  for (dtype d : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64, dtype::u8,
                  dtype::boolean, dtype::c64, dtype::c128}) {
    const DLDataType e = dl_dtype_of(d);
    if (e.code == t.code && e.bits == t.bits) return d;
  }
  return std::nullopt;
}

/// A DLPack type as text for errors: "int8", "float32x4", ...
inline std::string dl_dtype_str(DLDataType t) {
  static constexpr std::string_view names[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string s = t.code < std::size(names) ? std::string(names[t.code]) : "code" + std::to_string(t.code);
  s += std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

/// What an exported DLManagedTensor owns: the storage it views (so the memory outlives ccgraph's
/// own tensors) and the shape and strides arrays DLTensor points to.
struct dl_export_ctx {
  std::shared_ptr<storage> keep;
  std::vector<std::int64_t> shape, strides;
  DLManagedTensor managed{};
};

}  // namespace detail

/// Exports `t` as a DLPack tensor viewing the same memory (no copy): its storage lives until the
/// consumer calls `deleter` on the result, whatever happens to `t`. Complete on return: a pending
/// collective's result is waited for, and a device tensor's stream synchronised, so a consumer
/// on any stream reads final values.
template <class T>
DLManagedTensor* to_dlpack(const tensor<T>& t) {
  t.wait();
  const device dev = t.device();
  if (!dev.is_cpu()) detail::require_device_runtime("to_dlpack", dev).synchronize(dev);
  auto ctx = std::make_unique<detail::dl_export_ctx>();
  ctx->keep = t.storage();
  ctx->shape.assign(t.shape().begin(), t.shape().end());
  ctx->strides.assign(t.strides().begin(), t.strides().end());
  DLTensor& d = ctx->managed.dl_tensor;
  d.data = const_cast<void*>(static_cast<const void*>(t.data()));  // DLPack's pointer is not const
  d.device = dev.is_cpu() ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, static_cast<std::int32_t>(dev.index)};
  d.ndim = static_cast<std::int32_t>(ctx->shape.size());
  d.dtype = detail::dl_dtype_of(dtype_v<T>);
  d.shape = ctx->shape.data();
  d.strides = ctx->strides.data();
  d.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = [](DLManagedTensor* m) { delete static_cast<detail::dl_export_ctx*>(m->manager_ctx); };
  return &ctx.release()->managed;
}

/// Imports a DLPack tensor as tensor<T> viewing its memory (no copy), taking ownership: its
/// deleter runs when the last ccgraph tensor over it goes. Host (kDLCPU, kDLCUDAHost) and CUDA
/// (kDLCUDA, kDLCUDAManaged) memory; the element type must be T's. The producer's work on the
/// memory must be complete or ordered before ccgraph's (DLPack's rule: torch.to_dlpack and
/// `__dlpack__(stream=...)` see to it). On an error the caller keeps ownership.
template <class T>
tensor<T> from_dlpack(DLManagedTensor* m) {
  constexpr std::string_view what = "from_dlpack";
  CCGRAPH_CHECK(m != nullptr, what, ": null DLManagedTensor");
  const DLTensor& d = m->dl_tensor;
  const std::optional<dtype> dt = detail::dtype_of_dl(d.dtype);
  CCGRAPH_CHECK(dt.has_value(), what, ": DLPack type ", detail::dl_dtype_str(d.dtype), " has no ccgraph dtype");
  CCGRAPH_CHECK(*dt == dtype_v<T>, what, ": the DLPack tensor is ", *dt, ", not ", dtype_v<T>,
                " as asked (from_dlpack<", dtype_v<T>, ">)");
  CCGRAPH_CHECK(d.ndim >= 0 && (d.ndim == 0 || d.shape != nullptr), what, ": ndim ", d.ndim,
                d.shape ? "" : " with no shape array");
  device dev = device::cpu();
  switch (d.device.device_type) {
    case kDLCPU:
    case kDLCUDAHost: break;
    case kDLCUDA:
    case kDLCUDAManaged:
      dev = device::cuda(d.device.device_id);
      detail::require_device_runtime(what.data(), dev);
      break;
    default:
      CCGRAPH_THROW(error, what, ": DLPack device type ", static_cast<int>(d.device.device_type),
                    " is neither host nor CUDA memory");
  }
  shape_t shape(d.shape, d.shape + d.ndim);
  strides_t strides = d.strides ? strides_t(d.strides, d.strides + d.ndim) : contiguous_strides(shape);
  CCGRAPH_CHECK(d.byte_offset % sizeof(T) == 0, what, ": byte_offset ", d.byte_offset, " is not a multiple of ",
                sizeof(T), " (the size of ", dtype_v<T>, ")");
  const std::size_t bytes = detail::strided_extent_bytes(shape, strides, sizeof(T), what);
  char* data = static_cast<char*>(d.data) + d.byte_offset;
  CCGRAPH_CHECK(d.data != nullptr || bytes == 0, what, ": null data for a tensor of shape ", shape_str(shape));
  // Ownership passes here, after every check: the deleter runs with the last tensor over it.
  std::shared_ptr<void> owner(static_cast<void*>(m), [](void* p) {
    auto* mt = static_cast<DLManagedTensor*>(p);
    if (mt->deleter) mt->deleter(mt);
  });
  auto st = std::make_shared<detail::storage>(static_cast<void*>(data), bytes, dev, std::move(owner));
  return tensor<T>(std::move(st), std::move(shape), std::move(strides), 0);
}

}  // namespace ccgraph
