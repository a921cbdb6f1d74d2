// ccgraph/core/device.hpp: where a tensor's memory lives.
#pragma once

#include <compare>
#include <ostream>
#include <string>

namespace ccgraph {

/// A memory location: the host (`cpu`) or one CUDA device (`cuda:N`).
struct device {
  /// Kinds of memory.
  enum class kind : unsigned char { cpu, cuda };
  kind type = kind::cpu;
  int index = 0;

  /// The host.
  static constexpr device cpu() { return {kind::cpu, 0}; }
  /// CUDA device `i`.
  static constexpr device cuda(int i) { return {kind::cuda, i}; }
  constexpr bool is_cpu() const { return type == kind::cpu; }
  constexpr bool is_cuda() const { return type == kind::cuda; }
  friend constexpr bool operator==(const device&, const device&) = default;

  /// "cpu" or "cuda:N".
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

inline std::ostream& operator<<(std::ostream& os, const device& d) { return os << d.str(); }

}  // namespace ccgraph
