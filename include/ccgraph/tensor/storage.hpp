// ccgraph/tensor/storage.hpp: reference-counted memory behind tensors.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

#include <ccgraph/core/device.hpp>
#include <ccgraph/core/error.hpp>

namespace ccgraph::detail {

/// A block of bytes on one device. Tensors and their views share one storage through a
/// shared_ptr; the deleter knows how the bytes were obtained (host heap here, CUDA pools later).
class storage {
 public:
  using deleter_fn = void (*)(void*, std::size_t);

  storage(void* data, std::size_t bytes, device dev, deleter_fn del)
      : data_(data), bytes_(bytes), dev_(dev), del_(del) {}
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;
  ~storage() {
    if (data_ && del_) del_(data_, bytes_);
  }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  device dev() const { return dev_; }

  /// 64-byte aligned host memory (cache line, and wide enough for any vector load).
  static std::shared_ptr<storage> host(std::size_t bytes) {
    static constexpr std::align_val_t align{64};
    void* p = bytes ? ::operator new(bytes, align) : nullptr;
    return std::make_shared<storage>(p, bytes, device::cpu(), [](void* q, std::size_t) {
      ::operator delete(q, align);
    });
  }

 private:
  void* data_;
  std::size_t bytes_;
  device dev_;
  deleter_fn del_;
};

}  // namespace ccgraph::detail
