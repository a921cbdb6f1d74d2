// ccgraph/tensor/storage.hpp: reference-counted memory behind tensors.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/error.hpp>
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
};

}  // namespace ccgraph::detail
