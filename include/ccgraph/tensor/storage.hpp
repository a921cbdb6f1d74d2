// ccgraph/tensor/storage.hpp: reference-counted memory behind tensors.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/shape.hpp>
#include <ccgraph/tensor/device_runtime.hpp>

namespace ccgraph::detail {

/// A block of bytes on one device. Tensors and their views share one storage through a
/// shared_ptr; the deleter knows how the bytes were obtained (host heap, or the device
/// runtime's stream-ordered pool).
class storage {
 public:
  using deleter_fn = void (*)(void*, std::size_t, device);

  storage(void* data, std::size_t bytes, device dev, deleter_fn del)
      : data_(data), bytes_(bytes), dev_(dev), del_(del) {}
  /// Memory ccgraph does not own (from_blob, from_dlpack): `owner` is released, running whatever
  /// deleter it carries, when the last tensor viewing the storage goes.
  storage(void* data, std::size_t bytes, device dev, std::shared_ptr<void> owner)
      : data_(data), bytes_(bytes), dev_(dev), del_(nullptr), owner_(std::move(owner)) {}
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() {
    if (data_ && del_) del_(data_, bytes_, dev_);
  }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  device dev() const { return dev_; }

  /// 64-byte aligned host memory (cache line, and wide enough for any vector load).
  static std::shared_ptr<storage> host(std::size_t bytes) {
    static constexpr std::align_val_t align{64};
    void* p = bytes ? ::operator new(bytes, align) : nullptr;
    return std::make_shared<storage>(p, bytes, device::cpu(), [](void* q, std::size_t, device) {
      ::operator delete(q, align);
    });
  }

  /// `bytes` on `dev`: host memory, or device memory from the installed device runtime (its
  /// caching, stream-ordered pool: freeing is ordered after the work already queued).
  static std::shared_ptr<storage> allocate(device dev, std::size_t bytes) {
    if (dev.is_cpu()) return host(bytes);
    const device_runtime& rt = require_device_runtime("tensor allocation", dev);
    void* p = bytes ? rt.allocate(dev, bytes) : nullptr;
    return std::make_shared<storage>(p, bytes, dev, [](void* q, std::size_t n, device d) {
      if (const device_runtime* r = device_runtime_slot()) r->deallocate(d, q, n);
    });
  }

 private:
  void* data_;
  std::size_t bytes_;
  device dev_;
  deleter_fn del_;
  std::shared_ptr<void> owner_;  // foreign memory's owner, released after del_ (which is null then)
};

/// The storage of a new contiguous tensor of `shape` and element type `dt` on `dev`. The shape
/// is validated (checked_numel) and its byte count must be representable; an allocation that
/// fails is a ccgraph::error naming `what` (the call), the tensor and its byte count, not a
/// std::bad_alloc.
inline std::shared_ptr<storage> allocate_elements(device dev, const shape_t& shape, dtype dt,
                                                  std::string_view what) {
  const std::int64_t n = checked_numel(shape, what);
  const auto elem = static_cast<std::int64_t>(element_size(dt));
  std::int64_t bytes = 0;
  CCGRAPH_CHECK(checked_mul(n, elem, bytes), what, ": ", dt, shape_str(shape), " needs ", n, " x ",
                elem, " bytes, more than 2^63 - 1");
  try {
    return storage::allocate(dev, static_cast<std::size_t>(bytes));
  } catch (const std::bad_alloc&) {
    CCGRAPH_THROW(error, what, ": cannot allocate ", dt, shape_str(shape), " (", bytes,
                  " bytes) on ", dev, ": out of memory");
  }
}

}  // namespace ccgraph::detail
