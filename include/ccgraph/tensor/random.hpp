// ccgraph/tensor/random.hpp: random tensors from a counter-based generator (Philox4x32-10; see
// ccgraph/tensor/philox.hpp for the counter layout). Like torch.manual_seed / torch.rand:
//
//   cg::manual_seed(42);                              // the calling rank's default generator
//   auto x = cg::randn<float>({4, 4});                // draws from it: the next call differs
//   auto u = cg::uniform<float>({8}, -1, 1);          // [lo, hi)
//   auto v = cg::uniform<float>({8}, -1, 1, 7);       // an explicit seed: always the same values
//   cg::generator g(123);  auto w = cg::randn<float>({8}, g);   // a generator of one's own
//
// The same seed, stream and offset give the same bits on the CPU and on a GPU.
//
// Ranks. Each thread has its own default generator (a rank is a thread on the threads and nccl
// backends, a process with one thread under init_from_env), seeded with one fixed constant
// (c10's default_rng_seed_val), so without manual_seed every rank draws the same numbers. Ranks
// that call `cg::manual_seed(s)` with the same s (as torch.manual_seed(s) on every rank) keep
// drawing the same numbers; `cg::manual_seed(s, ctx.rank())` gives each rank its own Philox
// stream (counter words 2-3), statistically independent of the others' and reproducible from s.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <utility>

#include <ccgraph/core/error.hpp>
#include <ccgraph/tensor/philox.hpp>
#include <ccgraph/tensor/tensor.hpp>

namespace ccgraph {

/// A stateful Philox generator: seed (the key), stream (counter words 2-3) and offset (the next
/// counter; each draw of n values advances it by ceil(n / per_counter), see philox.hpp).
/// Copies share one state, like torch.Generator objects in Python; draws from several threads
/// through one state are serialised.
class generator {
 public:
  /// c10's default_rng_seed_val: what every thread's default generator starts from.
  static constexpr std::uint64_t default_seed = 67280421310721ull;

  /// What a generator's state is: restore it with set_state to draw the same values again.
  struct state_t {
    std::uint64_t seed = default_seed;
    std::uint64_t stream = 0;
    std::uint64_t offset = 0;
    bool operator==(const state_t&) const = default;
  };

  /// A generator seeded with `seed`, drawing from Philox stream `stream`, at offset 0.
  explicit generator(std::uint64_t seed = default_seed, std::uint64_t stream = 0)
      : s_(std::make_shared<shared>(state_t{seed, stream, 0})) {}

  /// Reseeds: seed and stream as given, offset back to 0 (torch.Generator.manual_seed).
  generator& manual_seed(std::uint64_t seed, std::uint64_t stream = 0) {
    std::lock_guard lk(s_->mu);
    s_->st = {seed, stream, 0};
    return *this;
  }
  /// The seed.
  std::uint64_t seed() const { return state().seed; }
  /// The Philox stream.
  std::uint64_t stream() const { return state().stream; }
  /// The next counter a draw starts at.
  std::uint64_t offset() const { return state().offset; }
  /// Moves to counter `offset` (e.g. to skip what other ranks drew).
  void set_offset(std::uint64_t offset) {
    std::lock_guard lk(s_->mu);
    s_->st.offset = offset;
  }
  /// The whole state (seed, stream, offset).
  state_t state() const {
    std::lock_guard lk(s_->mu);
    return s_->st;
  }
  /// Restores a state from state().
  void set_state(const state_t& st) {
    std::lock_guard lk(s_->mu);
    s_->st = st;
  }
  /// Reserves `counters` counters for one draw: returns where it starts and advances the offset.
  detail::philox_stream reserve(std::uint64_t counters) const {
    std::lock_guard lk(s_->mu);
    const detail::philox_stream at{s_->st.seed, s_->st.stream, s_->st.offset};
    s_->st.offset += counters;
    return at;
  }
  /// True when both handles share one state.
  bool operator==(const generator& o) const { return s_ == o.s_; }

 private:
  struct shared {
    explicit shared(state_t s) : st(s) {}
    mutable std::mutex mu;
    state_t st;
  };
  std::shared_ptr<shared> s_;
};

/// The calling thread's default generator (the calling rank's: a rank is a thread), seeded with
/// generator::default_seed until manual_seed.
inline generator& default_generator() {
  thread_local generator g;
  return g;
}

/// Seeds the calling rank's default generator (torch.manual_seed): seed `seed`, offset 0,
/// Philox stream `stream`. Ranks that pass the same seed and stream draw the same numbers; pass
/// `ctx.rank()` as the stream for per-rank streams.
inline void manual_seed(std::uint64_t seed, std::uint64_t stream = 0) { default_generator().manual_seed(seed, stream); }

namespace detail {

/// Draws `d` into a new contiguous tensor of `shape` on `dev`, advancing `gen`: on the device
/// with the generated kernel when this translation unit has it (nvcc with <ccgraph/cuda.hpp>),
/// else on the host and copied there (the same bits either way). `what` names the call in
/// errors; a bad shape fails before the generator advances.
template <class Dist>
tensor<typename Dist::value_type> draw_tensor(shape_t shape, const Dist& d, const generator& gen, device dev,
                                              std::string_view what) {
  using T = typename Dist::value_type;
  const std::int64_t n = checked_numel(shape, what);
  const philox_stream at = dist_draws(d) ? gen.reserve(counters_for<Dist>(n)) : philox_stream{};
  using K = random_kernel<Dist, 1>;
  if constexpr (has_device_pointwise<K, T, 2>) {
    if (dev.is_cuda()) {
      auto t = tensor<T>::empty(shape, dev, what);
      const strides_t cs = contiguous_strides(shape);
      launch_device_pointwise("random", dev, K{d, at}, t.data_unsynced(), shape, std::array<strides_t, 2>{cs, cs});
      return t;
    }
  }
  auto t = tensor<T>::empty(std::move(shape), device::cpu(), what);
  fill_random(t.data_unsynced(), d, at, 0, n);
  return dev.is_cpu() ? t : t.to(dev);
}

/// uniform_dist<T> for [lo, hi), with PyTorch's checks ("uniform: ...").
template <class T>
uniform_dist<T> make_uniform(double lo, double hi) {
  CCGRAPH_CHECK(std::isfinite(lo) && std::isfinite(hi), "uniform: lo and hi must be finite, got lo=", lo,
                ", hi=", hi);
  CCGRAPH_CHECK(lo <= hi, "uniform: expects lo <= hi to draw from [lo, hi), but got lo=", lo, " > hi=", hi);
  using C = typename uniform_dist<T>::compute;
  uniform_dist<T> d;
  d.lo = static_cast<C>(lo);
  d.range = static_cast<C>(hi - lo);
  d.hi = hi;
  if constexpr (!std::is_integral_v<T>)
    CCGRAPH_CHECK(std::isfinite(d.range), "uniform: hi - lo = ", hi - lo, " overflows ", dtype_v<T>);
  return d;
}

}  // namespace detail

/// A tensor of values drawn uniformly from [lo, hi) with `gen` (floating types; integers: the
/// floor of such a value, lo..hi-1 for whole bounds; bool: a fair coin), on this thread's
/// default device. Advances `gen`.
template <element T>
tensor<T> uniform(shape_t shape, double lo, double hi, const generator& gen) {
  return detail::draw_tensor(std::move(shape), detail::make_uniform<T>(lo, hi), gen, default_device(), "uniform");
}
/// uniform(shape, lo, hi, gen) from the calling rank's default generator: two draws differ.
template <element T>
tensor<T> uniform(shape_t shape, double lo = -1.0, double hi = 1.0) {
  return uniform<T>(std::move(shape), lo, hi, default_generator());
}
/// uniform(shape, lo, hi, generator(seed)): the same values for the same seed, every call.
template <element T>
tensor<T> uniform(shape_t shape, double lo, double hi, std::uint64_t seed) {
  return uniform<T>(std::move(shape), lo, hi, generator(seed));
}

/// A tensor of standard normal values (Box-Muller, like torch.randn) drawn with `gen`, on this
/// thread's default device. Advances `gen`.
template <element T>
tensor<T> randn(shape_t shape, const generator& gen) {
  static_assert(is_floating(dtype_v<T>), "ccgraph::randn: needs a floating-point element type (f32, f64, bf16, f16)");
  return detail::draw_tensor(std::move(shape), detail::normal_dist<T>{}, gen, default_device(), "randn");
}
/// randn(shape, gen) from the calling rank's default generator: two draws differ.
template <element T>
tensor<T> randn(shape_t shape) {
  return randn<T>(std::move(shape), default_generator());
}

}  // namespace ccgraph
