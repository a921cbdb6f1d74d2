// ccgraph/nccl/backend.hpp: the `nccl` backend. One rank per GPU; a rank's collectives
// run on its communication stream, ordered after the compute that produced their inputs by an
// event, and their results are joined back by the event its wait enqueues. Communicators are
// set up non-blocking (from an exchanged id, or split from the world's for a mesh dimension),
// so a peer that never arrives or dies ends in an error after a timeout (the rank's
// communicators are aborted), never a hang; collectives run on a blocking child of each.
// Large all_reduces of two-GPU groups, and all_gathers and reduce_scatters of GPUs that reach
// each other, that a schedule overlaps with compute run on the copy engines instead
// (peer_channel.hpp), which leaves the SMs to the compute. A rank is made by
// run_gpus (a thread per GPU), init_from_env (a process per GPU) or adopt (on the caller's own
// communicator and stream).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/core/env.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/timeout.hpp>
#include <ccgraph/cuda/block_cache.hpp>
#include <ccgraph/cuda/compat.hpp>
#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/nccl_comm.hpp>
#include <ccgraph/cuda/nvtx.hpp>
#include <ccgraph/nccl/ops.hpp>
#include <ccgraph/cuda/peer_channel.hpp>
#include <ccgraph/cuda/runtime.hpp>
#include <ccgraph/cuda/stream.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/comm/communicator.hpp>
#include <ccgraph/comm/rank_context.hpp>
#include <ccgraph/runtime/store.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace ccgraph::cuda {

/// Which stream a rank's collectives run on.
enum class collective_stream : std::uint8_t {
  /// Always the rank's communication stream, ordered after the caller's stream by an event
  /// and joined back at the wait (PyTorch's c10d does the same): anything may overlap them.
  separate,
  /// The caller's stream for collectives a compiled graph's schedule overlaps with nothing
  /// (collective_request::overlap is `none`) when no copy-engine collective is still out on
  /// the communication stream (NCCL orders its own launches, not those), which saves the two
  /// cross-stream hops (host calls eagerly, graph edges in a CUDA Graph); the communication
  /// stream for the others and for eager calls. The default.
  automatic,
  /// Always the caller's stream: no collective overlaps compute, and none pays for the hops.
  /// For latency-bound loops of small collectives (a decode step's all_reduces).
  caller,
};

/// Which collectives run on the copy engines (see peer_channel.hpp) instead of NCCL's kernels:
/// all_reduces of two-GPU groups, all_gathers and reduce_scatters of groups of up to
/// peer_channel_max_ranks GPUs, where every GPU reaches every other (NVLink or PCIe peer
/// access). Either way every rank gets the values NCCL gives (bit for bit, but see
/// nccl_options::copy_engine_reassociates).
enum class copy_engine_all_reduce : std::uint8_t {
  /// None: NCCL runs every collective.
  off,
  /// Those a compiled graph's schedule overlaps with compute (collective_request::overlap is
  /// `compute` or `matmul`), of at least copy_engine_min_bytes: NCCL's kernels would wait for
  /// SMs the compute holds. The default.
  overlapped,
  /// Every one of at least copy_engine_min_bytes, eager calls included.
  always,
};

/// Options of the nccl backend.
struct nccl_options {
  /// How long a rank waits for its peers (communicator set-up, and any blocking wait on a
  /// collective) before its communicators are aborted and it fails with a timeout_error.
  /// Must be positive; milliseconds::max() waits forever. Defaults to $CCGRAPH_TIMEOUT_MS,
  /// else 300 s.
  std::chrono::milliseconds timeout = default_timeout();

  /// Most thread blocks (SMs) one collective may use, 0 for NCCL's choice (NCCL_MAX_CTAS
  /// also sets it). Fewer leave more of the GPU to the compute a collective overlaps with.
  int max_ctas = 0;

  /// SMs that GEMMs leave free while a collective of this rank may still be running (launched,
  /// not yet waited), so that the collective runs beside the GEMM instead of queueing for SMs a
  /// GEMM fills; 0 for none. Defaults to $CCGRAPH_GEMM_SM_CARVEOUT, else 0.
  int gemm_sm_carveout = default_gemm_sm_carveout();

  /// Which stream collectives run on. Defaults to $CCGRAPH_COLLECTIVE_STREAM (`separate`,
  /// `automatic` or `caller`), else `automatic`.
  collective_stream placement = default_placement();

  /// For collectives a compiled graph's schedule overlaps with a matmul (see
  /// collective_request::overlap): the most SMs they may use (a second communicator per
  /// group, capped at this many CTAs), and the SMs GEMMs leave free while one runs. 0 (the
  /// default, or $CCGRAPH_OVERLAP_SMS) treats them like any other collective.
  int overlap_sms = env_int("CCGRAPH_OVERLAP_SMS");

  /// Which collectives run on the copy engines (see copy_engine_all_reduce). Defaults to
  /// $CCGRAPH_COPY_ENGINE_ALL_REDUCE (`off`, `overlapped` or `always`), else `overlapped`.
  copy_engine_all_reduce copy_engine = default_copy_engine();

  /// The smallest collective (bytes, nccl-tests' size: the all_reduce's buffer, the
  /// all_gather's output, the reduce_scatter's input) `copy_engine` applies to: below it NCCL's
  /// latency wins.
  std::size_t copy_engine_min_bytes = std::size_t{1} << 20;

  /// Lets reduce_scatters of more than two ranks sum, average or multiply on the copy engines:
  /// each rank then reduces its chunk in rank order in f32, rounded once, where NCCL's ring
  /// rounds after each step in an order of its own, so the last bits differ from NCCL's
  /// (min and max, exact in any order, always may). Off by default: ccgraph's results are
  /// NCCL's bits unless asked otherwise.
  bool copy_engine_reassociates = false;

  /// $CCGRAPH_TIMEOUT_MS if set (a positive whole number of milliseconds, else an error naming
  /// it), else 300 s.
  static std::chrono::milliseconds default_timeout() { return ::ccgraph::detail::default_timeout(); }

  /// $CCGRAPH_COLLECTIVE_STREAM if it names a collective_stream, else `automatic`; any other
  /// value is an error naming it.
  static collective_stream default_placement() {
    return env_choice<collective_stream>("CCGRAPH_COLLECTIVE_STREAM", {{"automatic", collective_stream::automatic},
                                                                       {"separate", collective_stream::separate},
                                                                       {"caller", collective_stream::caller}});
  }

  /// $CCGRAPH_COPY_ENGINE_ALL_REDUCE if it names a copy_engine_all_reduce, else `overlapped`;
  /// any other value is an error naming it.
  static copy_engine_all_reduce default_copy_engine() {
    return env_choice<copy_engine_all_reduce>("CCGRAPH_COPY_ENGINE_ALL_REDUCE",
                                              {{"overlapped", copy_engine_all_reduce::overlapped},
                                               {"off", copy_engine_all_reduce::off},
                                               {"always", copy_engine_all_reduce::always}});
  }

  /// The value the environment variable `name` names among `choices` (unset or empty: the
  /// first); any other value is an error naming the variable, the value and the choices.
  template <class E>
  static E env_choice(const char* name, std::initializer_list<std::pair<std::string_view, E>> choices) {
    return ::ccgraph::detail::env_choice(name, choices);
  }

  /// $CCGRAPH_GEMM_SM_CARVEOUT if set (a number from 0 to 1024, else an error naming it), else 0.
  static int default_gemm_sm_carveout() { return env_int("CCGRAPH_GEMM_SM_CARVEOUT"); }

  /// The environment variable `name` as a number from 0 to 1024; 0 when unset or empty; any
  /// other text is an error naming the variable (never a silent 0).
  static int env_int(const char* name) {
    return static_cast<int>(::ccgraph::detail::env_integer(name, 0, 0, 1024));
  }
};

namespace detail {

/// Bytes `req` sends each peer on a copy-engine channel (a slot's size): the all_reduce's and
/// all_gather's input, the reduce_scatter's output.
inline std::size_t copy_engine_slot_bytes(const ::ccgraph::detail::collective_request& req) {
  const bool rs = std::holds_alternative<ops::reduce_scatter_tensor>(req.op);
  const tensor_meta& m = (rs ? req.outputs : req.inputs)[0].meta;
  return static_cast<std::size_t>(numel_of(m.shape)) * element_size(m.dtype);
}

/// Whether `req` may run on a copy-engine channel under `opt` (the channel must also exist:
/// peer access, set-up outside a recording): a single all_reduce of a two-rank group, a single
/// all_gather_into_tensor or reduce_scatter_tensor of 2 to peer_channel_max_ranks ranks, a
/// reduction of a type and op the kernel has whose bits are NCCL's (or
/// nccl_options::copy_engine_reassociates), large enough (nccl-tests' size), and overlapped as
/// the policy asks.
inline bool copy_engine_eligible(const nccl_options& opt, const ::ccgraph::detail::collective_request& req) {
  using ::ccgraph::detail::overlap_hint;
  if (opt.copy_engine == copy_engine_all_reduce::off) return false;
  const int n = req.group.size();
  if (n < 2 || n > peer_channel_max_ranks || req.inputs.size() != 1 || req.outputs.size() != 1) return false;
  const tensor_meta& in = req.inputs[0].meta;
  const auto in_bytes = static_cast<std::size_t>(numel_of(in.shape)) * element_size(in.dtype);
  std::size_t size = in_bytes;  // nccl-tests' size
  const auto reduces = [&](reduce_op op) {
    return peer_reduce_supports(in.dtype, op) && (peer_reduce_matches_nccl(op, n) || opt.copy_engine_reassociates);
  };
  if (const auto* ar = std::get_if<ops::all_reduce>(&req.op)) {
    if (n != 2 || !reduces(ar->op)) return false;  // every peer gets the whole buffer: for pairs
  } else if (std::holds_alternative<ops::all_gather_into_tensor>(req.op)) {
    size = in_bytes * static_cast<std::size_t>(n);
  } else if (const auto* rs = std::get_if<ops::reduce_scatter_tensor>(&req.op)) {
    if (!reduces(rs->op)) return false;
  } else {
    return false;
  }
  if (size < opt.copy_engine_min_bytes) return false;
  return opt.copy_engine == copy_engine_all_reduce::always || req.overlap == overlap_hint::compute ||
         req.overlap == overlap_hint::matmul;
}

/// Queues `req` (copy_engine_eligible) on `ch` on stream `s`.
inline void copy_engine_issue(const peer_channel& ch, const ::ccgraph::detail::collective_request& req,
                              cudaStream_t s) {
  const auto& in = req.inputs[0];
  const auto& out = req.outputs[0];
  void* i = buffer_address(in);
  void* o = buffer_address(out);
  const dtype dt = in.meta.dtype;
  if (const auto* ar = std::get_if<ops::all_reduce>(&req.op)) {
    ch.all_reduce(i, o, static_cast<std::size_t>(numel_of(in.meta.shape)), dt, ar->op, s);
  } else if (std::holds_alternative<ops::all_gather_into_tensor>(req.op)) {
    ch.all_gather(i, o, static_cast<std::size_t>(numel_of(in.meta.shape)), dt, s);
  } else if (const auto* rs = std::get_if<ops::reduce_scatter_tensor>(&req.op)) {
    ch.reduce_scatter(i, o, static_cast<std::size_t>(numel_of(out.meta.shape)), dt, rs->op, s);
  } else {
    const char* name = ::ccgraph::detail::visit([](const auto& op) { return op.name.data(); }, req.op);
    CCGRAPH_THROW(::ccgraph::error, "copy-engine collective: ", name, " has no copy-engine form");
  }
}

/// Where ranks publish and fetch the NCCL unique ids of their communicators: an in-process
/// table for run_gpus, the rendezvous store for one process per GPU.
class id_exchange {
 public:
  virtual ~id_exchange() = default;
  /// The id of communicator `key`: the `creator` makes and publishes it, the others wait for it
  /// up to `timeout` (then a timeout_error naming the key).
  virtual ncclUniqueId get(const std::string& key, bool creator, std::chrono::milliseconds timeout) = 0;
};

/// id_exchange among the threads of one process.
class local_id_exchange final : public id_exchange {
 public:
  ncclUniqueId get(const std::string& key, bool creator, std::chrono::milliseconds timeout) override {
    std::unique_lock lk(mu_);
    if (creator) {
      ncclUniqueId id{};
      CCGRAPH_CHECK_NCCL(ncclGetUniqueId(&id));
      ids_[key] = id;
      cv_.notify_all();
      return id;
    }
    const auto deadline = ::ccgraph::detail::deadline_after(std::chrono::steady_clock::now(), timeout);
    if (!cv_.wait_until(lk, deadline, [&] { return ids_.count(key) != 0 || aborted_; }) || aborted_)
      CCGRAPH_THROW(::ccgraph::timeout_error, "nccl: communicator ", key, " was not created by its first rank within ",
                    ::ccgraph::detail::timeout_text(timeout));
    return ids_.at(key);
  }
  /// Wakes every waiter with an error (a rank failed).
  void abort() {
    std::lock_guard lk(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, ncclUniqueId> ids_;
  bool aborted_ = false;
};

/// id_exchange through a rendezvous store (one process per GPU): the creator sets
/// "<prefix><key>" (prefix "ccgraph/nccl_id/"), the others get it (the store's timeout names
/// the key).
class store_id_exchange final : public id_exchange {
 public:
  explicit store_id_exchange(std::shared_ptr<::ccgraph::store> s, std::string prefix = "ccgraph/nccl_id/")
      : store_(std::move(s)), prefix_(std::move(prefix)) {}
  ncclUniqueId get(const std::string& key, bool creator, std::chrono::milliseconds) override {
    const std::string k = prefix_ + key;
    ncclUniqueId id{};
    if (creator) {
      CCGRAPH_CHECK_NCCL(ncclGetUniqueId(&id));
      std::vector<std::uint8_t> bytes(sizeof id);
      std::memcpy(bytes.data(), &id, sizeof id);
      store_->set(k, bytes);
      return id;
    }
    const std::vector<std::uint8_t> bytes = store_->get(k);
    CCGRAPH_CHECK(bytes.size() == sizeof id, "nccl: store key ", k, " holds ", bytes.size(),
                  " bytes, not an NCCL unique id (", sizeof id, ")");
    std::memcpy(&id, bytes.data(), sizeof id);
    return id;
  }

 private:
  std::shared_ptr<::ccgraph::store> store_;
  std::string prefix_;
};

/// id_exchange of an adopted rank without a store: a group that is not a mesh dimension (whose
/// communicator would be split from the adopted one) cannot get a communicator. Its error
/// names the group.
class no_id_exchange final : public id_exchange {
 public:
  ncclUniqueId get(const std::string& key, bool, std::chrono::milliseconds) override {
    // key: "nccl/0,2" or "nccl/0,2#tag" (nccl_rank::comm_for)
    std::string ranks = key.substr(key.find('/') + 1), tag;
    if (const auto h = ranks.find('#'); h != std::string::npos) {
      tag = " tagged '" + ranks.substr(h + 1) + "'";
      ranks.resize(h);
    }
    std::string listed;
    for (char ch : ranks) listed += ch == ',' ? std::string(", ") : std::string(1, ch);
    CCGRAPH_THROW(::ccgraph::error, "adopt: group [", listed, "]", tag,
                  " needs an NCCL communicator of its own, and it is not one part of a partition of "
                  "the world that every rank sets up at once (a mesh dimension, split from the adopted "
                  "communicator): its members must exchange an NCCL id, so pass a store in "
                  "adopt_options::store");
  }
};

/// State shared by the ranks of one run: who failed first, and why.
class gpu_world {
 public:
  /// Records that `rank` failed with `e` (the first failure wins).
  void abort(int rank, std::exception_ptr e) {
    std::lock_guard lk(mu_);
    cv_.notify_all();
    if (aborted_) return;
    aborted_ = true;
    failed_rank_ = rank;
    first_error_ = e;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      failure_ = x.what();
    } catch (...) {
      failure_ = "unknown exception";
    }
  }
  bool aborted() const {
    std::lock_guard lk(mu_);
    return aborted_;
  }
  /// The error a rank other than the failed one reports.
  std::string reason(int rank) const {
    std::lock_guard lk(mu_);
    return ::ccgraph::detail::concat("rank ", rank, ": aborted because rank ", failed_rank_,
                                     " failed: ", failure_);
  }
  int failed_rank() const {
    std::lock_guard lk(mu_);
    return failed_rank_;
  }
  std::exception_ptr first_error() const {
    std::lock_guard lk(mu_);
    return first_error_;
  }

  /// The ranks' meeting point at their end: true once all `n` arrived (their communicators can
  /// then be destroyed cleanly), false when the world was aborted or `timeout` passed first
  /// (then they are aborted: destroying one may wait for a peer that will never come).
  bool finish(int n, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    ++finished_;
    cv_.notify_all();
    const auto deadline = ::ccgraph::detail::deadline_after(std::chrono::steady_clock::now(), timeout);
    return cv_.wait_until(lk, deadline, [&] { return aborted_ || finished_ >= n; }) && !aborted_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int finished_ = 0;
  bool aborted_ = false;
  int failed_rank_ = -1;
  std::string failure_;
  std::exception_ptr first_error_;
};

/// A random number drawn per call (a meeting's name).
inline std::uint64_t fresh_token() {
  thread_local std::mt19937_64 gen{std::random_device{}() ^ process_token()};
  return gen();
}

/// Waits until `n` threads of this process called it with `key` (false when `timeout` passed
/// first): a host-only barrier, which no GPU work can hold up.
inline bool process_barrier(std::uint64_t key, int n, std::chrono::milliseconds timeout) {
  struct meeting {
    int arrived = 0, left = 0;
  };
  static std::mutex mu;
  static std::condition_variable cv;
  static std::map<std::uint64_t, meeting> meetings;  // (references to elements stay valid)
  std::unique_lock lk(mu);
  meeting& m = meetings[key];
  ++m.arrived;
  cv.notify_all();
  const auto deadline = ::ccgraph::detail::deadline_after(std::chrono::steady_clock::now(), timeout);
  const bool met = cv.wait_until(lk, deadline, [&] { return m.arrived >= n; });
  if (met ? ++m.left == n : (--m.arrived == 0 && m.left == 0)) meetings.erase(key);
  return met;
}

/// An event that several holders share (a work and the rank's in-flight list).
using shared_event = std::shared_ptr<CUevent_st>;

/// Recycles a rank's events: creating and destroying two per collective would cost more than
/// the launch itself. An event goes back when its last holder drops it; re-recording one that
/// is still pending is fine (waits enqueued earlier keep the earlier record).
class event_pool : public std::enable_shared_from_this<event_pool> {
 public:
  event_pool() = default;
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  ~event_pool() {
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
  }
  shared_event get() {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard lk(mu_);
      if (!free_.empty()) {
        e = free_.back();
        free_.pop_back();
      }
    }
    if (!e) CCGRAPH_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return shared_event(e, [pool = shared_from_this()](cudaEvent_t x) { pool->put(x); });
  }

 private:
  void put(cudaEvent_t e) {
    std::lock_guard lk(mu_);
    free_.push_back(e);
  }
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

/// True while the calling thread's stream records a CUDA Graph (queries are illegal then).
inline bool capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(current_stream(), &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

/// Collectives run on blocking communicators (see nccl_rank::comm_for), whose first collective
/// would otherwise make its connections lazily, blocking the host inside ncclGroupEnd until the
/// peer shows up: a missing peer would hang it there, out of the watchdog's reach. So NCCL
/// connects everything when a communicator is set up, where the non-blocking parent enforces
/// the timeout. NCCL reads the variable once, at its first communicator, so it is set when the
/// program starts (a value the user set is kept).
inline const bool nccl_connect_at_setup = [] {
  ::setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  return true;
}();

class nccl_rank;

/// The timing events a profiled collective (collective_request::timed) is recorded between,
/// on the stream it runs on; owned by its work.
struct timing_events {
  cudaEvent_t start = nullptr, end = nullptr;
  timing_events() {
    CCGRAPH_CHECK_CUDA(cudaEventCreate(&start));
    const cudaError_t st = cudaEventCreate(&end);
    if (st != cudaSuccess) (void)cudaEventDestroy(start);
    CCGRAPH_CHECK_CUDA(st);
  }
  timing_events(const timing_events&) = delete;
  timing_events& operator=(const timing_events&) = delete;
  ~timing_events() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(end);
  }
};

/// Completion of one collective on the nccl backend. Waiting enqueues a wait for its event on
/// the calling thread's stream (the host does not block; nothing when the collective ran on
/// that stream) and releases the buffers the collective used: any later free on that stream is
/// ordered after the collective.
class nccl_work final : public ::ccgraph::detail::work {
 public:
  /// `caller`: the stream it ran on when that was the caller's, else null (the
  /// communication stream).
  nccl_work(std::shared_ptr<nccl_rank> owner, shared_event done,
            std::shared_ptr<::ccgraph::detail::collective_request> req, bool capped, cudaStream_t caller,
            std::unique_ptr<timing_events> timing = nullptr, bool copy_engine = false)
      : owner_(std::move(owner)),
        done_(std::move(done)),
        req_(std::move(req)),
        capped_(capped),
        caller_(caller),
        timing_(std::move(timing)),
        copy_engine_(copy_engine) {}
  ~nccl_work() override;
  void wait() const override;
  bool ready() const override {
    if (capturing()) return false;
    return cudaEventQuery(done_.get()) == cudaSuccess;
  }
  std::pair<void*, void*> device_events() const override {
    if (!timing_) return {nullptr, nullptr};
    return {static_cast<void*>(timing_->start), static_cast<void*>(timing_->end)};
  }

 private:
  std::shared_ptr<nccl_rank> owner_;
  shared_event done_;
  mutable std::shared_ptr<::ccgraph::detail::collective_request> req_;
  bool capped_;  // ran on the overlap communicator
  cudaStream_t caller_;  // the caller's stream it ran on, or null
  std::unique_ptr<timing_events> timing_;  // a profiled call's (collective_request::timed)
  bool copy_engine_;  // ran on a copy-engine channel
  mutable std::mutex mu_;

  /// Orders the calling thread's stream after the collective.
  void order_current() const {
    const cudaStream_t cur = current_stream();
    if (cur != caller_) CCGRAPH_CHECK_CUDA(cudaStreamWaitEvent(cur, done_.get(), 0));
  }
};

/// One rank's endpoint on the nccl backend: its world communicator, sub-communicators made on
/// first use for other groups, the communication stream, and the watchdog state.
class nccl_rank final : public ::ccgraph::detail::communicator,
                        public std::enable_shared_from_this<nccl_rank> {
 public:
  nccl_rank(int rank, int world_size, int device, std::shared_ptr<id_exchange> ids,
            std::shared_ptr<gpu_world> world, nccl_options opt)
      : rank_(rank),
        world_size_(world_size),
        device_(device),
        ids_(std::move(ids)),
        world_(std::move(world)),
        // Checked before the stream below is made: a bad option costs no CUDA resource.
        opt_((::ccgraph::detail::check_timeout("nccl_options::timeout", opt.timeout), opt)),
        comm_stream_(make_comm_stream()),
        events_(std::make_shared<event_pool>()) {
    watchdog_.check = [this](std::chrono::steady_clock::duration waited, const char* what) {
      check_health(waited, what);
    };
  }
  nccl_rank(const nccl_rank&) = delete;
  nccl_rank& operator=(const nccl_rank&) = delete;
  ~nccl_rank() override { abort_comms(false); }  // whatever close() did not end cleanly

  /// Ends the rank's communicators: destroyed when `clean` (every peer is done with them too),
  /// else aborted (a peer may still be waiting: destroying could wait for it forever).
  void close(bool clean) {
    if (!clean) return abort_comms();
    for (auto& [k, c] : comms_) {  // (an adopted communicator stays the caller's, untouched)
      if (c.overlap) (void)ncclCommDestroy(c.overlap.release());
      if (c.data) (void)ncclCommDestroy(c.data.release());
      if (c.setup) (void)ncclCommDestroy(c.setup.release());
    }
    comms_.clear();
    adopted_ = nullptr;
    channels_.clear();  // every peer is done: nothing copies into their scratch any more
  }

  /// This rank, the world size and its CUDA device.
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  /// The stream collectives run on.
  cudaStream_t comm_stream() const { return comm_stream_.get(); }
  /// The watchdog blocking waits on this rank's threads poll.
  wait_watchdog* watchdog() { return &watchdog_; }

  /// The communicator of the group `ranks` (global ranks, in group order) tagged `tag`, made on
  /// first use: every member must ask for it (they do, by calling a collective on the group).
  /// Each (ranks, tag) has its own, as each c10d process group has. When the group is one part
  /// of `partition`, a partition of the world whose every rank asks at once (a mesh dimension),
  /// it is split from the world's communicator by ncclCommSplit; any other group is set up from
  /// an NCCL id its members exchange, since ranks outside it never call.
  ncclComm_t comm_for(const std::vector<int>& ranks, const std::vector<std::vector<int>>& partition = {},
                      const std::string& tag = {}) {
    auto it = comms_.find({ranks, tag});
    if (it != comms_.end()) return it->second.collectives();
    std::string key = "nccl/";
    for (std::size_t i = 0; i < ranks.size(); ++i) key += (i ? "," : "") + std::to_string(ranks[i]);
    if (!tag.empty()) key += "#" + tag;
    const auto pos = std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin();
    CCGRAPH_CHECK(pos < static_cast<std::ptrdiff_t>(ranks.size()), "nccl: rank ", rank_,
                  " is not in group ", key);
    device_scope scope(device_);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    const auto world = comms_.find({world_ranks_, std::string()});
    const bool split = !partition.empty() && world != comms_.end() && world->second.parent();
    const std::string what = (split ? "ncclCommSplit(world -> " : "ncclCommInitRankConfig(") + key + ")";
    ncclResult_t r = ncclSuccess;
    if (split) {
      const auto part = std::find(partition.begin(), partition.end(), ranks) - partition.begin();
      if (world->second.adopted) arrival_barrier(what.c_str());
      r = ncclCommSplit(world->second.parent(), static_cast<int>(part), static_cast<int>(pos), &c, &cfg);
    } else {
      const ncclUniqueId id = ids_->get(key, pos == 0, opt_.timeout);
      r = ncclCommInitRankConfig(&c, static_cast<int>(ranks.size()), id, static_cast<int>(pos), &cfg);
    }
    if (r != ncclInProgress) CCGRAPH_CHECK_NCCL(r);
    comm_pair& pair = comms_[{ranks, tag}];
    pair.setup = nccl_comm(c);  // owned before waiting, so a timeout's abort reaches it
    if (split) settle(world->second.parent(), what.c_str());
    settle(c, what.c_str());
    // Set-up ran non-blocking so that it can time out; collectives run on a blocking child
    // made by ncclCommSplit (collective over the same members, right away): a non-blocking
    // communicator may hand each launch to a helper thread and costs tens of microseconds per
    // collective. A hang on the blocking one is still ended by the watchdog's abort.
    if (nonblocking_) return c;  // (kept as a switch to compare the two modes)
    ncclConfig_t data_cfg = NCCL_CONFIG_INITIALIZER;
    data_cfg.blocking = 1;
    if (opt_.max_ctas > 0) data_cfg.maxCTAs = opt_.max_ctas;
    ncclComm_t d = nullptr;
    const ncclResult_t sr = ncclCommSplit(c, 0, static_cast<int>(pos), &d, &data_cfg);
    if (sr != ncclInProgress) CCGRAPH_CHECK_NCCL(sr);
    settle(c, ("ncclCommSplit(" + key + ")").c_str());
    pair.data = nccl_comm(d);
    return d;
  }

  /// The communicator for overlapped collectives of group `ranks`: a blocking child of its
  /// set-up communicator capped at overlap_sms CTAs, made on the group's first overlapped
  /// collective (which every member reaches, as the hint comes from the graph).
  ncclComm_t overlap_comm_for(const std::vector<int>& ranks, const std::vector<std::vector<int>>& partition,
                              const std::string& tag) {
    const ncclComm_t data = comm_for(ranks, partition, tag);
    comm_pair& pair = comms_.at({ranks, tag});
    if (pair.overlap) return pair.overlap.get();
    if (!pair.data && !pair.adopted) return data;  // CCGRAPH_NCCL_NONBLOCKING=1: one communicator per group
    const auto pos = std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin();
    device_scope scope(device_);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    cfg.maxCTAs = opt_.overlap_sms;
    ncclComm_t o = nullptr;
    if (pair.adopted) arrival_barrier("ncclCommSplit(adopted -> overlap communicator)");
    const ncclResult_t r = ncclCommSplit(pair.parent(), 0, static_cast<int>(pos), &o, &cfg);
    if (r != ncclInProgress) CCGRAPH_CHECK_NCCL(r);
    settle(pair.parent(), "ncclCommSplit(overlap communicator)");
    pair.overlap = nccl_comm(o);
    return o;
  }

  /// Starts `req` after the work already queued on the calling thread's stream (which produced
  /// its inputs): on the communication stream, or on the calling thread's own stream where
  /// nccl_options::placement says so.
  ::ccgraph::detail::work_ptr launch(std::shared_ptr<::ccgraph::detail::collective_request> req) override {
    fail_if_aborted();
    req->rank = rank_;
    const char* what = ::ccgraph::detail::visit([](const auto& o) { return o.name.data(); }, req->op);
    nvtx_scope range(what);  // Nsight Systems: the launch, named after the collective
    // A copy-engine collective always runs on the communication stream: the channel's flags
    // need one order of its collectives on each rank, and two streams could run them at once.
    const bool ce = copy_engine_eligible(opt_, *req) && !no_channel_.count({req->group.ranks, req->group.tag});
    // Automatic placement keeps a collective with nothing beside it on the caller's stream,
    // but not while copy-engine collectives are still out on the communication stream: NCCL
    // orders its own launches across streams, not those, so it would overtake them (a
    // decomposed matmul's last chunk, on NCCL's kernels on the caller's stream, started beside
    // its siblings' copy-engine all_reduces and waited for a peer still busy with them: 2 ms
    // for a 32 MiB all_reduce on 2 x H200).
    const bool on_caller = !ce && (opt_.placement == collective_stream::caller ||
                                   (opt_.placement == collective_stream::automatic &&
                                    req->overlap == ::ccgraph::detail::overlap_hint::none && unjoined_ce_ == 0));
    const cudaStream_t producer = current_stream();
    const cudaStream_t s = on_caller ? producer : comm_stream();
    const bool in_capture = capturing();
    if (!on_caller && (!in_capture || !ordered_after(comm_stream(), producer))) {
      CCGRAPH_CHECK_CUDA(cudaEventRecord(ready_.get(), producer));
      CCGRAPH_CHECK_CUDA(cudaStreamWaitEvent(comm_stream(), ready_.get(), 0));
    }
    const peer_channel* ch = ce ? channel_for(*req, s, in_capture) : nullptr;
    const bool capped = !ch && !on_caller && req->overlapped() && opt_.overlap_sms > 0;
    shared_event done = events_->get();
    // A profiled call: timed on the stream it runs on, from when that stream reaches it (after
    // its inputs' producer) to its end.
    std::unique_ptr<timing_events> timing;
    if (req->timed && !in_capture) {
      timing = std::make_unique<timing_events>();
      CCGRAPH_CHECK_CUDA(cudaEventRecord(timing->start, s));
    }
    if (ch) {
      detail::copy_engine_issue(*ch, *req, s);
      ++copy_engine_launched_;
      ++unjoined_ce_;
    } else {
      ncclComm_t c = capped ? overlap_comm_for(req->group.ranks, req->group.partition, req->group.tag)
                            : comm_for(req->group.ranks, req->group.partition, req->group.tag);
      // Several NCCL calls (coalesced forms, send/recv pairs) go in one group; a single call
      // is its own group, without the explicit one's extra host cost.
      // (A non-blocking communicator, CCGRAPH_NCCL_NONBLOCKING=1, reports through the group.)
      // So do those on an adopted communicator, which may be non-blocking: ccgraph cannot ask.
      const bool grouped = nonblocking_ || c == adopted_ || req->inputs.size() > 1 ||
                           detail::nccl_always_grouped(req->op);
      if (grouped) CCGRAPH_CHECK_NCCL(ncclGroupStart());
      ncclResult_t r = ncclSuccess;
      try {
        issue(*req, c, s, what);
      } catch (...) {
        if (grouped) (void)ncclGroupEnd();
        throw;
      }
      if (grouped) r = ncclGroupEnd();
      if (r != ncclInProgress) CCGRAPH_CHECK_NCCL(r);
      if (r == ncclInProgress) settle(c, what);
    }
    CCGRAPH_CHECK_CUDA(cudaEventRecord(done.get(), s));
    if (timing) CCGRAPH_CHECK_CUDA(cudaEventRecord(timing->end, s));
    // On the caller's stream, a free there is ordered after the collective, as after any
    // kernel: the request need not keep its buffers (only what names it in errors), so
    // tensors dropped meanwhile are reused at once and reaping frees nothing.
    if (on_caller)
      for (auto* side : {&req->inputs, &req->outputs})
        for (auto& b : *side) b.st.reset();
    if (!in_capture) track(done, s, req);
    ++launched_[on_caller];
    if (on_caller)  // it runs before anything the caller queues next: no GEMM runs beside it
      return std::make_shared<nccl_work>(shared_from_this(), std::move(done), std::move(req), false, s,
                                         std::move(timing));
    ++unjoined_[capped];
    update_carveout();
    return std::make_shared<nccl_work>(shared_from_this(), std::move(done), std::move(req), capped, nullptr,
                                       std::move(timing), ch != nullptr);
  }

  /// Collectives this rank launched on its communication stream ([0]) and on the caller's
  /// stream ([1]), recorded ones counted when recorded.
  std::array<std::uint64_t, 2> launched() const { return {launched_[0], launched_[1]}; }

  /// The groups this rank has a communicator for, as (ranks, tag): one per group it ran a
  /// collective on (the world's from the start), two groups of the same ranks with different
  /// tags included.
  std::vector<std::pair<std::vector<int>, std::string>> communicators() const {
    std::vector<std::pair<std::vector<int>, std::string>> out;
    for (const auto& [k, c] : comms_) out.push_back(k);
    return out;
  }

  /// Collectives this rank ran on a copy-engine channel (recorded ones counted when recorded).
  std::uint64_t copy_engine_launched() const { return copy_engine_launched_; }

  /// The calling thread's stream waits for everything launched on the communication stream.
  /// While recording a CUDA Graph that launched no collective, the communication stream is not
  /// part of the recording and there is nothing to join.
  void join() override {
    const bool in_capture = capturing();
    if (in_capture) {
      cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
      CCGRAPH_CHECK_CUDA(cudaStreamIsCapturing(comm_stream(), &st));
      if (st != cudaStreamCaptureStatusActive) return;
    }
    // Eagerly, nothing to do when this stream joined since the last launch there.
    const bool joined = !in_capture && joined_stream_ == current_stream() && joined_at_ == launched_[0];
    if (!joined && (!in_capture || !ordered_after(current_stream(), comm_stream()))) {
      shared_event e = events_->get();
      CCGRAPH_CHECK_CUDA(cudaEventRecord(e.get(), comm_stream()));
      CCGRAPH_CHECK_CUDA(cudaStreamWaitEvent(current_stream(), e.get(), 0));
    }
    if (!in_capture) {
      joined_stream_ = current_stream();
      joined_at_ = launched_[0];
    }
    unjoined_[0] = unjoined_[1] = 0;
    unjoined_ce_ = 0;
    update_carveout();
  }

  /// One collective's result (capped: an overlapped one) was joined by the calling thread's
  /// stream.
  void joined_one(bool capped, bool copy_engine = false) noexcept {
    if (unjoined_[capped] > 0) --unjoined_[capped];
    if (copy_engine && unjoined_ce_ > 0) --unjoined_ce_;
    update_carveout();
  }

  /// Throws the error this rank reports once the world is aborted (or this rank timed out).
  void fail_if_aborted() const {
    if (local_failure_.empty() && !world_->aborted()) return;
    if (!local_failure_.empty()) CCGRAPH_THROW(::ccgraph::timeout_error, local_failure_);
    CCGRAPH_THROW(::ccgraph::aborted_error, world_->reason(rank_));
  }

  /// Tears down every communicator of this rank without waiting for peers: in-flight kernels
  /// end, and later NCCL calls fail. Safe to call more than once. An adopted communicator
  /// (adopt_world) is aborted too when `adopted` (its abort function; a hang on it has no other
  /// end), else only forgotten.
  void abort_comms(bool adopted = true) {
    // First let queued copy-engine collectives pass their waits: NCCL's abort frees device
    // memory, and cudaFree waits for the whole device, a stream stuck on a flag included.
    release_channels();
    for (auto& [k, c] : comms_) {
      if (c.overlap) (void)ncclCommAbort(c.overlap.release());
      if (c.data) (void)ncclCommAbort(c.data.release());
      if (c.setup) (void)ncclCommAbort(c.setup.release());
    }
    comms_.clear();
    if (adopted_ && adopted) {
      adopted_aborted_ = true;
      try {
        if (abort_adopted_) abort_adopted_(adopted_);
        else (void)ncclCommAbort(adopted_);
      } catch (...) {  // (the caller's function; a failure here has nobody to report to)
      }
    }
    adopted_ = nullptr;
  }

  /// Makes `c`, the caller's communicator over the whole world (this rank its rank `rank()`),
  /// the world's: its collectives run on it and mesh dimensions are split from it, but ccgraph
  /// never destroys it. `abort` ends a hang on it (null: ncclCommAbort). Before the first
  /// comm_for.
  void adopt_world(ncclComm_t c, std::function<void(ncclComm_t)> abort) {
    CCGRAPH_CHECK(comms_.empty(), "nccl: adopt_world after the rank made communicators");
    comms_[{world_ranks_, std::string()}].adopted = c;
    adopted_ = c;
    abort_adopted_ = std::move(abort);
  }

  /// True once a timeout or failure made this rank abort its adopted communicator.
  bool adopted_aborted() const { return adopted_aborted_; }

  /// True while the rank holds communicators or copy-engine channels of its own (not an
  /// adopted one), which a clean end destroys only once every peer is done with them.
  bool owns_communicators() const {
    return !channels_.empty() ||
           std::any_of(comms_.begin(), comms_.end(), [](const auto& kv) { return !kv.second.adopted; });
  }

  /// Waits until every rank of the world reached this call (a world_gather of nothing).
  void world_barrier(const char* what) { (void)world_gather(0, 0, what); }

  /// Every rank's two values (`a`, `b`), in rank order, gathered over the world's communicator
  /// (also a barrier), waited for under the watchdog: a missing peer is a timeout_error and the
  /// communicators aborted, never a hang.
  std::vector<std::uint64_t> world_gather(std::uint64_t a, std::uint64_t b, const char* what) {
    const ncclComm_t c = comm_for(world_ranks_);
    device_scope scope(device_);
    current_watchdog_guard g(&watchdog_);
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(world_size_));
    const std::uint64_t mine[2] = {a, b};
    void* d = nullptr;
    CCGRAPH_CHECK_CUDA(cudaMallocAsync(&d, all.size() * sizeof(std::uint64_t), comm_stream()));
    try {
      auto* slot = static_cast<std::uint64_t*>(d) + 2 * rank_;
      // (From pageable memory: the call returns once `mine` was read.)
      CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(slot, mine, sizeof mine, cudaMemcpyHostToDevice, comm_stream()));
      CCGRAPH_CHECK_NCCL(ncclGroupStart());
      const ncclResult_t ag = ncclAllGather(slot, d, 2, ncclUint64, c, comm_stream());
      const ncclResult_t r = ncclGroupEnd();
      CCGRAPH_CHECK_NCCL(ag);
      if (r != ncclInProgress) CCGRAPH_CHECK_NCCL(r);
      if (r == ncclInProgress) settle(c, what);
      wait_stream(comm_stream(), what);  // under the watchdog: the copy below cannot block
      CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(all.data(), d, all.size() * sizeof(std::uint64_t),
                                         cudaMemcpyDeviceToHost, comm_stream()));
      CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(comm_stream()));
    } catch (...) {
      (void)cudaFreeAsync(d, comm_stream());
      throw;
    }
    CCGRAPH_CHECK_CUDA(cudaFreeAsync(d, comm_stream()));
    return all;
  }

  /// Destroys the rank's communicators (close(true)) and returns once every rank of the world
  /// that shares this process has destroyed its own: NCCL frees the communicators of ranks in
  /// one process when the last of them destroys its own, and that waits for their GPUs to be
  /// idle, so a rank that went on to a collective there (the caller's, on an adopted
  /// communicator) would wait for a peer that waits for it. The ranks sharing the process are
  /// found by a world_gather, which is also the barrier that a clean close needs first.
  void close_with_process_peers(const char* what) {
    const std::vector<std::uint64_t> all = world_gather(process_token(), fresh_token(), what);
    const std::uint64_t me = all[2 * static_cast<std::size_t>(rank_)];
    int local = 0;
    std::uint64_t key = 0;  // the lowest local rank's fresh token: the same on each local rank
    for (int r = world_size_ - 1; r >= 0; --r)
      if (all[2 * static_cast<std::size_t>(r)] == me) {
        ++local;
        key = all[2 * static_cast<std::size_t>(r) + 1];
      }
    close(true);
    if (local > 1 && !process_barrier(key, local, opt_.timeout))
      CCGRAPH_THROW(::ccgraph::timeout_error, "nccl: rank ", rank_, ": ", what, ": the ", local - 1,
                    " other rank(s) of this process did not destroy their communicators within ",
                    opt_.timeout.count(), " ms");
  }

  /// Waits until everything queued on the communication stream has run (end of the rank).
  void drain() {
    current_watchdog_guard g(&watchdog_);
    wait_stream(comm_stream(), "draining collectives at the end of the rank");
  }

  /// RAII: installs a watchdog for blocking waits on this thread.
  class current_watchdog_guard {
   public:
    explicit current_watchdog_guard(wait_watchdog* w) : prev_(current_watchdog()) { current_watchdog() = w; }
    current_watchdog_guard(const current_watchdog_guard&) = delete;
    current_watchdog_guard& operator=(const current_watchdog_guard&) = delete;
    ~current_watchdog_guard() { current_watchdog() = prev_; }

   private:
    wait_watchdog* prev_;
  };

 private:
  struct inflight {
    shared_event done;
    cudaStream_t stream = nullptr;  // it ran on
    std::shared_ptr<::ccgraph::detail::collective_request> req;  // for the timeout's message
    std::size_t bytes = 0;  // of its buffers
  };
  /// What a group's communicators are kept by: its ranks and its tag.
  using comm_key = std::pair<std::vector<int>, std::string>;
  /// A group's communicators: the non-blocking one it was set up with and the blocking child
  /// its collectives run on.
  struct comm_pair {
    nccl_comm setup;
    nccl_comm data;     // empty under CCGRAPH_NCCL_NONBLOCKING=1: collectives use `setup`
    nccl_comm overlap;  // capped at overlap_sms CTAs, made on first overlapped use
    ncclComm_t adopted = nullptr;  // the caller's (adopt_world): collectives and splits use it,
                                   // ccgraph never destroys it (setup and data stay empty)
    /// The communicator collectives run on.
    ncclComm_t collectives() const { return adopted ? adopted : data ? data.get() : setup.get(); }
    /// The communicator children are split from (non-blocking, or the caller's).
    ncclComm_t parent() const { return adopted ? adopted : setup.get(); }
  };

  static std::vector<int> all_ranks(int n) {
    std::vector<int> r(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = i;
    return r;
  }

  static stream make_comm_stream() {
    int lo = 0, hi = 0;
    CCGRAPH_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    return stream(cudaStreamNonBlocking, hi);  // communication first: it is on the critical path
  }

  /// While both record one CUDA Graph: true when the next node on `later` already depends on
  /// everything recorded on `earlier` so far (each of `earlier`'s frontier nodes is one of
  /// `later`'s), so a join would only add a redundant edge. Back-to-back collectives then chain
  /// directly on the communication branch, as one stream would, instead of hopping through
  /// the compute branch at every wait.
  static bool ordered_after(cudaStream_t later, cudaStream_t earlier) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t* deps = nullptr;
    std::size_t n = 0;
    CCGRAPH_CHECK_CUDA(capture_dependencies(earlier, &st, &deps, &n));
    if (st != cudaStreamCaptureStatusActive) return false;
    const std::vector<cudaGraphNode_t> before(deps, deps + n);
    CCGRAPH_CHECK_CUDA(capture_dependencies(later, &st, &deps, &n));
    if (st != cudaStreamCaptureStatusActive || n == 0) return false;
    return std::all_of(before.begin(), before.end(),
                       [&](cudaGraphNode_t d) { return std::find(deps, deps + n, d) != deps + n; });
  }

  /// Before splitting from an adopted communicator: that split blocks the host until every rank
  /// calls it when the caller made the communicator blocking (NCCL's group follows the
  /// parent), out of the watchdog's reach. A barrier under the watchdog first makes sure every
  /// rank got there (a missing one is a timeout_error instead of a hang).
  void arrival_barrier(const char* what) { world_barrier(what); }

  /// Polls a non-blocking communicator until its last call finished, with the timeout.
  void settle(ncclComm_t c, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      ncclResult_t st = ncclSuccess;
      CCGRAPH_CHECK_NCCL(ncclCommGetAsyncError(c, &st));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) {
        abort_comms();
        ::ccgraph::cuda::detail::throw_nccl_error(st, what, __FILE__, __LINE__);
      }
      if (world_->aborted()) {
        abort_comms();
        fail_if_aborted();
      }
      if (::ccgraph::detail::past_timeout(std::chrono::steady_clock::now() - start, opt_.timeout)) {
        abort_comms();
        local_failure_ = ::ccgraph::detail::concat("rank ", rank_, ": ", what, " did not complete within ",
                                                   ::ccgraph::detail::timeout_text(opt_.timeout), " (a peer never arrived)");
        CCGRAPH_THROW(::ccgraph::timeout_error, local_failure_);
      }
      std::this_thread::yield();
    }
  }

  /// Remembers a launched collective until it is seen complete (it holds its buffers until
  /// then, which is when they may be freed anyway). Completed ones are dropped in batches,
  /// once the list holds `reap_count` collectives or `reap_bytes` of buffers (which bounds the
  /// memory it keeps from reuse): an event query costs 0.2-2 us of host time (most for the
  /// first query after the event completed), as much as a third of an eager launch.
  void track(const shared_event& done, cudaStream_t s,
             const std::shared_ptr<::ccgraph::detail::collective_request>& req) {
    static constexpr std::size_t reap_count = 64;
    static constexpr std::size_t reap_bytes = std::size_t{256} << 20;
    std::size_t bytes = 0;
    for (const auto* side : {&req->inputs, &req->outputs})
      for (const auto& b : *side)
        bytes += static_cast<std::size_t>(numel_of(b.meta.shape)) * element_size(b.meta.dtype);
    if (inflight_.size() >= reap_count || inflight_bytes_ + bytes > reap_bytes) reap();
    inflight_.push_back({done, s, req, bytes});
    inflight_bytes_ += bytes;
  }

  /// Drops the collectives seen complete. A stream runs its work in order, so the newest
  /// entry of a stream that is complete means all of that stream's are: usually one query per
  /// stream settles the list. Of a stream whose newest is still running, the oldest entries
  /// are queried until one is pending.
  void reap() {
    std::vector<std::pair<cudaStream_t, bool>> newest;  // per stream: its newest is complete
    for (auto it = inflight_.rbegin(); it != inflight_.rend(); ++it)
      if (std::none_of(newest.begin(), newest.end(), [&](const auto& p) { return p.first == it->stream; }))
        newest.emplace_back(it->stream, cudaEventQuery(it->done.get()) == cudaSuccess);
    std::vector<bool> complete(inflight_.size(), false);
    for (auto& [st, all] : newest)
      for (std::size_t i = 0; i < inflight_.size(); ++i) {  // oldest first
        if (inflight_[i].stream != st) continue;
        if (!all && cudaEventQuery(inflight_[i].done.get()) != cudaSuccess) break;
        complete[i] = true;
      }
    std::deque<inflight> kept;
    inflight_bytes_ = 0;
    for (std::size_t i = 0; i < inflight_.size(); ++i)
      if (!complete[i]) {
        inflight_bytes_ += inflight_[i].bytes;
        kept.push_back(std::move(inflight_[i]));
      }
    inflight_.swap(kept);
  }

  /// The watchdog: a peer's failure or a communicator error ends the wait at once; so does
  /// running past the timeout, naming the oldest collective still running.
  void check_health(std::chrono::steady_clock::duration waited, const char* what) {
    if (world_->aborted()) {
      abort_comms();
      fail_if_aborted();
    }
    for (auto& [k, pair] : comms_) {
      const ncclComm_t c = pair.collectives();
      if (!c) continue;
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(c, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
        abort_comms();
        ::ccgraph::cuda::detail::throw_nccl_error(st, what, __FILE__, __LINE__);
      }
    }
    if (!::ccgraph::detail::past_timeout(waited, opt_.timeout)) return;
    std::string pending = "none";
    for (auto& f : inflight_)
      if (cudaEventQuery(f.done.get()) != cudaSuccess) {
        pending = f.req->describe();
        break;
      }
    abort_comms();
    local_failure_ = ::ccgraph::detail::concat("rank ", rank_, ": ", what, " waited more than ",
                                               ::ccgraph::detail::timeout_text(opt_.timeout), "; oldest unfinished collective: ",
                                               pending, " (a peer never issued it or died)");
    CCGRAPH_THROW(::ccgraph::timeout_error, local_failure_);
  }

  /// The copy-engine channel of `req`'s group with room for its input, set up or grown now on
  /// `s`, the communication stream (both ranks reach this call together: they run the same
  /// collectives); null where the group has none (then NCCL runs it). Nothing is set up while
  /// recording a CUDA Graph: the executor's first, eager call makes it, and every rank records
  /// alike. A replay runs its all_reduces after the rank's eager ones (executor::replay joins
  /// them first), so each rank runs a channel's all_reduces in one order.
  const peer_channel* channel_for(const ::ccgraph::detail::collective_request& req, cudaStream_t s, bool in_capture) {
    const auto& ranks = req.group.ranks;
    const comm_key key{ranks, req.group.tag};
    if (no_channel_.count(key)) return nullptr;
    const std::size_t bytes = detail::copy_engine_slot_bytes(req);
    auto it = channels_.find(key);
    if (it != channels_.end() && it->second->capacity() >= bytes) return it->second.get();
    if (in_capture) return nullptr;
    const ncclComm_t c = comm_for(ranks, req.group.partition, req.group.tag);
    device_scope scope(device_);
    if (it == channels_.end()) {
      auto ch = peer_channel::open(c, req.group.index_of(rank_), req.group.size(), device_, bytes, s);
      if (!ch) {
        no_channel_.insert(key);
        return nullptr;
      }
      return channels_.emplace(key, std::move(ch)).first->second.get();
    }
    if (!it->second->reserve(c, bytes, s)) {
      no_channel_.insert(key);
      return nullptr;
    }
    return it->second.get();
  }

  /// After an abort: lets this rank's queued copy-engine collectives pass their waits until its
  /// streams drain (at most two seconds), so that nothing waits for a peer that is gone.
  void release_channels() noexcept {
    if (channels_.empty()) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    const cudaStream_t streams[2] = {comm_stream(), current_stream()};
    while (true) {
      for (auto& [k, ch] : channels_) ch->release();
      bool busy = false;
      for (cudaStream_t st : streams) busy = busy || cudaStreamQuery(st) == cudaErrorNotReady;
      (void)cudaGetLastError();
      if (!busy || std::chrono::steady_clock::now() > until) return;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  /// Enqueues the NCCL calls of `req` on stream `s` (inside a group when there are several):
  /// nccl_impl<O>::issue per tensor or issue_request per request (cuda/nccl_ops.hpp).
  void issue(const ::ccgraph::detail::collective_request& req, ncclComm_t c, cudaStream_t s, const char* what) {
    ::ccgraph::detail::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          detail::nccl_issue<O>(o, req, c, s, what);
        },
        req.op);
  }

  int rank_;
  int world_size_;
  int device_;
  std::shared_ptr<id_exchange> ids_;
  std::shared_ptr<gpu_world> world_;
  nccl_options opt_;
  stream comm_stream_;
  event ready_;  // orders the communication stream after the producer; re-recorded per launch
  std::shared_ptr<event_pool> events_;
  std::map<comm_key, comm_pair> comms_;
  ncclComm_t adopted_ = nullptr;  // the caller's world communicator (adopt_world), if any
  std::function<void(ncclComm_t)> abort_adopted_;  // how to end a hang on it; null: ncclCommAbort
  bool adopted_aborted_ = false;
  std::map<comm_key, std::unique_ptr<peer_channel>> channels_;  // copy-engine collectives, per group
  std::set<comm_key> no_channel_;  // groups whose ranks cannot have one
  std::uint64_t copy_engine_launched_ = 0;
  std::deque<inflight> inflight_;
  // CCGRAPH_NCCL_NONBLOCKING=1: collectives run on the non-blocking set-up communicators.
  const bool nonblocking_ = ::ccgraph::detail::env_flag("CCGRAPH_NCCL_NONBLOCKING", false);
  std::size_t inflight_bytes_ = 0;  // buffers the entries of inflight_ hold
  std::string local_failure_;
  wait_watchdog watchdog_;
  std::vector<int> world_ranks_ = all_ranks(world_size_);  // the world communicator's key
  int unjoined_[2] = {0, 0};  // on the communication stream, not yet waited ([1]: capped ones)
  int unjoined_ce_ = 0;       // of those, copy-engine collectives
  std::uint64_t launched_[2] = {0, 0};  // see launched()
  cudaStream_t joined_stream_ = nullptr;  // the stream the last eager join() ordered ...
  std::uint64_t joined_at_ = ~std::uint64_t{0};  // ... after this many communication-stream launches

  /// The SMs this thread's GEMMs leave free: to the collectives still running.
  void update_carveout() noexcept {
    int sms = unjoined_[0] > 0 ? opt_.gemm_sm_carveout : 0;
    if (unjoined_[1] > 0) sms = std::max(sms, opt_.overlap_sms);
    gemm_sm_carveout() = sms;
  }
};

inline nccl_work::~nccl_work() {
  if (!req_) return;
  if (current_stream() != caller_) (void)cudaStreamWaitEvent(current_stream(), done_.get(), 0);
  if (!caller_) owner_->joined_one(capped_, copy_engine_);
}

inline void nccl_work::wait() const {
  std::lock_guard lk(mu_);
  owner_->fail_if_aborted();
  order_current();
  if (req_ && !caller_) owner_->joined_one(capped_, copy_engine_);
  req_.reset();  // later frees on this stream come after the collective
}

/// The calling thread as one rank of the nccl backend: what process_rank and adopted_rank
/// share. While it lives, the rank's GPU is the thread's default device for tensors, the
/// compute stream (the rank's own, or the caller's) is its current stream, small blocks freed
/// there are cached, blocking waits poll the rank's watchdog, and a rank_context is in scope.
/// Made and ended on one thread; its owner calls finish() first in its destructor.
class thread_rank {
 public:
  /// Rank `rank` of `world_size` on GPU `dev` (already the current device), computing on
  /// `compute` (a non-blocking stream of its own when empty). `make(world, dev)` makes the
  /// rank's nccl_rank; its world communicator is then set up (collective over the world).
  template <class Make>
  thread_rank(int rank, int world_size, int dev, std::optional<cudaStream_t> compute, Make&& make)
      : world_(std::make_shared<gpu_world>()),
        registry_(std::make_shared<group_registry>(world_size)),
        device_(dev),
        dev_guard_(device::cuda(dev)),
        own_(own_stream(!compute)),
        stream_(compute ? *compute : own_->get()),
        on_(stream_),
        blocks_(stream_, dev) {
    comm_ = std::forward<Make>(make)(world_, dev);
    watchdog_.emplace(comm_->watchdog());
    std::vector<int> all(static_cast<std::size_t>(world_size));
    for (int i = 0; i < world_size; ++i) all[static_cast<std::size_t>(i)] = i;
    (void)comm_->comm_for(all);  // the world communicator, up front
    ctx_.emplace(rank, world_size, device::cuda(dev), registry_, comm_);
    scope_.emplace(*ctx_);
  }
  thread_rank(const thread_rank&) = delete;
  thread_rank& operator=(const thread_rank&) = delete;

  /// Ends the rank: leaves its scope, waits for its compute stream and its collectives (under
  /// the watchdog), then `end(comm)` ends the communicators (a barrier with the peers, then
  /// close(true)); if anything throws, they are aborted instead (a destructor cannot report it;
  /// peers see the abort).
  template <class End>
  void finish(End&& end) noexcept {
    scope_.reset();
    try {
      wait_stream(stream_, "draining the rank's compute at its end");
      comm_->drain();
      std::forward<End>(end)(*comm_);
    } catch (...) {
      comm_->close(false);
    }
    ctx_.reset();
    watchdog_.reset();
  }

  rank_context& context() { return *ctx_; }
  nccl_rank& comm() { return *comm_; }
  cudaStream_t compute_stream() const { return stream_; }

 private:
  static std::optional<stream> own_stream(bool wanted) {
    std::optional<stream> s;
    if (wanted) s.emplace(cudaStreamNonBlocking);
    return s;
  }

  std::shared_ptr<gpu_world> world_;
  std::shared_ptr<group_registry> registry_;
  int device_;
  device_guard dev_guard_;
  std::optional<stream> own_;  // the compute stream when the rank has its own
  cudaStream_t stream_;
  stream_guard on_;
  block_cache blocks_;  // small blocks freed on stream_ (ends before it)
  std::shared_ptr<nccl_rank> comm_;
  std::optional<nccl_rank::current_watchdog_guard> watchdog_;
  std::optional<rank_context> ctx_;
  std::optional<::ccgraph::detail::rank_scope> scope_;
};

}  // namespace detail

/// This process's rank when each GPU has its own process (launched by torchrun, mpirun with
/// the variables set, or scripts/ccgraph-launch). Made by init_from_env(); while it lives, the
/// thread that made it is the rank: collectives called there go through its communicator,
/// tensors are created on its GPU, and compute runs on its stream. Destroy it on that thread;
/// the destructor waits for the rank's queued work (with the watchdog).
class process_rank {
 public:
  process_rank(const env_config& cfg, nccl_options opt)
      : cfg_(cfg),
        store_(make_store_from_env(cfg)),
        rank_(cfg.rank, cfg.world_size, set_device(cfg), std::nullopt,
              [&](std::shared_ptr<detail::gpu_world> world, int dev) {
                return std::make_shared<detail::nccl_rank>(cfg.rank, cfg.world_size, dev,
                                                           std::make_shared<detail::store_id_exchange>(store_),
                                                           std::move(world), opt);
              }) {}
  process_rank(const process_rank&) = delete;
  process_rank& operator=(const process_rank&) = delete;
  ~process_rank() {
    rank_.finish([&](detail::nccl_rank& comm) {
      barrier(*store_, "ccgraph/finish", cfg_.rank, cfg_.world_size);  // peers are done too
      comm.close(true);
    });
  }

  /// The rank's context (rank, world size, device, groups).
  rank_context& context() { return rank_.context(); }
  /// The launcher's settings this rank was made from.
  const env_config& config() const { return cfg_; }
  /// The rendezvous store (for the program's own keys and barriers).
  ::ccgraph::store& rendezvous() { return *store_; }

 private:
  static int set_device(const env_config& cfg) {
    const int n = device_count();
    CCGRAPH_CHECK(cfg.local_rank < n, "init_from_env: LOCAL_RANK=", cfg.local_rank, " but ", n,
                  " CUDA device", n == 1 ? " is" : "s are", " visible");
    CCGRAPH_CHECK_CUDA(cudaSetDevice(cfg.local_rank));
    return cfg.local_rank;
  }

  env_config cfg_;
  std::shared_ptr<::ccgraph::store> store_;
  detail::thread_rank rank_;
};

/// Options of adopt().
struct adopt_options {
  /// The backend's options (timeout, collective placement, copy engines, ...). max_ctas applies
  /// to the communicators ccgraph makes, not to the adopted one, which keeps the caller's
  /// configuration.
  nccl_options nccl = {};

  /// Where the members of a group that is not a mesh dimension exchange the NCCL id of its
  /// communicator (ranks outside the group never call, so it cannot be split from the adopted
  /// communicator). Null: such a group's first collective is an error naming it. Any store the
  /// ranks share (tcp_store, file_store, or one of the caller's).
  std::shared_ptr<::ccgraph::store> store = nullptr;

  /// Prefix of the keys ccgraph sets in `store`: an adoption after another over the same store
  /// needs a prefix of its own (the keys would hand it the first one's NCCL ids).
  std::string store_prefix = "ccgraph/adopt/";

  /// How ccgraph ends a hang on the adopted communicator (a timeout, a peer's failure, an NCCL
  /// error): called once, on the thread that found it, with the communicator; it must abort it
  /// (ncclCommAbort, or its owner's own abort, such as ProcessGroupNCCL's). Null: ccgraph calls
  /// ncclCommAbort itself, which frees the communicator: the caller must then neither use nor
  /// destroy it (adopted_rank::communicator_aborted() says whether that happened).
  std::function<void(ncclComm_t)> abort = nullptr;
};

/// The calling thread as a rank of ccgraph's nccl backend on the caller's own NCCL
/// communicator and CUDA stream (a training loop that already has them, its own or PyTorch's
/// ProcessGroupNCCL's). Made by adopt(); while it lives, collectives called on this thread run
/// on that communicator (world groups) or on communicators split from it (mesh dimensions),
/// and tensors are created on its GPU with their kernels, copies and collectives ordered on the
/// caller's stream like any other work there: after what the caller queued before, before what
/// it queues next, collectives on ccgraph's communication stream joined back at their wait.
///
/// The communicator stays the caller's: ccgraph never destroys or finalizes it, and the caller
/// may use it again once the adopted_rank ended. On a timeout, a peer's failure or an NCCL
/// error, ccgraph aborts it (adopt_options::abort), as nothing else ends a kernel hung on it
/// (make it with NCCL_RUNTIME_CONNECT=0, as ccgraph's own are: a lazily connecting one can
/// block the host in a first launch while a peer is missing, out of the watchdog's reach).
/// ccgraph issues its collectives on it in this thread's program order; any the caller issues
/// itself on it meanwhile must come in the same order on every rank, as NCCL requires.
///
/// Destroy it on the thread that made it. Its end waits (host) for the work queued on the
/// stream, and is collective over the world when ccgraph made communicators or copy-engine
/// channels of its own (with adopt_options::store, a store barrier before destroying them and
/// one after; else a 16-byte all_gather on the adopted communicator before, and after, a
/// barrier among the ranks that share this process), so it destroys them knowing the peers
/// are done, and returns only once the peers in this process destroyed theirs (NCCL frees
/// those together, waiting for their GPUs: a collective of the caller's queued meanwhile on
/// one of them would wait forever).
class adopted_rank {
 public:
  adopted_rank(ncclComm_t world, cudaStream_t compute, adopt_options opt)
      : world_(world),
        opt_(std::move(opt)),
        where_(check(world, compute, opt_.nccl.timeout)),
        uncaught_(std::uncaught_exceptions()),
        rank_(where_.rank, where_.world_size, where_.device, compute,
              [&](std::shared_ptr<detail::gpu_world> w, int dev) {
                std::shared_ptr<detail::id_exchange> ids;
                if (opt_.store)
                  ids = std::make_shared<detail::store_id_exchange>(opt_.store, opt_.store_prefix + "nccl_id/");
                else
                  ids = std::make_shared<detail::no_id_exchange>();
                auto c = std::make_shared<detail::nccl_rank>(where_.rank, where_.world_size, dev, std::move(ids),
                                                             std::move(w), opt_.nccl);
                c->adopt_world(world_, opt_.abort);
                return c;
              }) {}
  adopted_rank(const adopted_rank&) = delete;
  adopted_rank& operator=(const adopted_rank&) = delete;
  ~adopted_rank() {
    // Ended by an exception: the peers may be anywhere in their programs, so no barrier (a
    // collective here could pair with one of theirs); ccgraph's own communicators are aborted,
    // the caller's is left to the caller.
    const bool unwinding = std::uncaught_exceptions() > uncaught_;
    rank_.finish([&](detail::nccl_rank& comm) {
      if (unwinding) return comm.abort_comms(false);
      // No rank leaves before its peers in this process destroyed their communicators too
      // (nccl_rank::close_with_process_peers says why): with a store, a second store barrier
      // after the destroys, host-only like the first.
      if (opt_.store) {
        barrier(*opt_.store, opt_.store_prefix + "finish", where_.rank, where_.world_size);
        comm.close(true);
        barrier(*opt_.store, opt_.store_prefix + "closed", where_.rank, where_.world_size);
      } else if (comm.owns_communicators()) {  // the same on every rank: only splits, made by all
        comm.close_with_process_peers("the end of an adopted rank");
      } else {
        comm.close(true);
      }
    });
  }

  /// The rank's context (rank, world size, device, groups).
  rank_context& context() { return rank_.context(); }
  /// The adopted communicator (the caller's).
  ncclComm_t communicator() const { return world_; }
  /// The adopted stream (the caller's): ccgraph's compute stream while this lives.
  cudaStream_t stream() const { return rank_.compute_stream(); }
  /// True once ccgraph aborted the adopted communicator (a timeout, a peer's failure or an
  /// NCCL error; adopt_options::abort says how).
  bool communicator_aborted() { return rank_.comm().adopted_aborted(); }

 private:
  struct place {
    int rank, world_size, device;
  };

  /// The communicator's rank, size and device, after checking that the calling thread's
  /// current device and `compute`'s device are the communicator's.
  static place check(ncclComm_t world, cudaStream_t compute, std::chrono::milliseconds timeout) {
    ::ccgraph::detail::check_timeout("nccl_options::timeout", timeout);
    CCGRAPH_CHECK(world != nullptr, "adopt: the communicator is null (pass the caller's ncclComm_t, made by "
                                    "ncclCommInitRank, ncclCommInitAll or ncclCommSplit)");
    // A non-blocking communicator may still be setting up: wait for it, under the timeout.
    const auto start = std::chrono::steady_clock::now();
    ncclResult_t st = ncclSuccess;
    while (true) {
      CCGRAPH_CHECK_NCCL(ncclCommGetAsyncError(world, &st));
      if (st != ncclInProgress) break;
      if (::ccgraph::detail::past_timeout(std::chrono::steady_clock::now() - start, timeout))
        CCGRAPH_THROW(::ccgraph::timeout_error, "adopt: the communicator was still being set up after ",
                      ::ccgraph::detail::timeout_text(timeout), " (ncclCommGetAsyncError: ncclInProgress)");
      std::this_thread::yield();
    }
    CCGRAPH_CHECK(st == ncclSuccess, "adopt: the communicator reports ", ncclGetErrorString(st),
                  " (ncclCommGetAsyncError): a failed communicator cannot be adopted");
    place p{};
    CCGRAPH_CHECK_NCCL(ncclCommUserRank(world, &p.rank));
    CCGRAPH_CHECK_NCCL(ncclCommCount(world, &p.world_size));
    CCGRAPH_CHECK_NCCL(ncclCommCuDevice(world, &p.device));
    int current = -1;
    CCGRAPH_CHECK_CUDA(cudaGetDevice(&current));
    CCGRAPH_CHECK(current == p.device, "adopt: the communicator (rank ", p.rank, " of ", p.world_size,
                  ") is on cuda:", p.device, " but the calling thread's current device is cuda:", current,
                  " (call cudaSetDevice(", p.device, ") first)");
    // (First: a recording stream is refused before any other query touches it.)
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CCGRAPH_CHECK_CUDA(cudaStreamIsCapturing(compute, &cap));
    CCGRAPH_CHECK(cap == cudaStreamCaptureStatusNone, "adopt: stream ", static_cast<const void*>(compute),
                  " is recording a CUDA Graph (adopt outside the recording; compile(..., {.cuda_graph "
                  "= true}) records its own)");
    int on = -1;
    const cudaError_t sd = detail::stream_device(compute, &on);
    if (sd != cudaSuccess) {
      (void)cudaGetLastError();
      CCGRAPH_THROW(::ccgraph::error, "adopt: stream ", static_cast<const void*>(compute),
                    " is not a usable CUDA stream: ", cudaGetErrorName(sd), " (", cudaGetErrorString(sd), ")");
    }
    CCGRAPH_CHECK(on == p.device, "adopt: stream ", static_cast<const void*>(compute), " is on ",
                  on < 0 ? std::string("another device") : "cuda:" + std::to_string(on),
                  " but the communicator (rank ", p.rank, " of ", p.world_size, ") is on cuda:", p.device);
    return p;
  }

  ncclComm_t world_;
  adopt_options opt_;
  place where_;
  int uncaught_;
  detail::thread_rank rank_;
};

/// Makes the calling thread a rank on the caller's NCCL communicator `world` (its rank and
/// size are the communicator's; it must be on the calling thread's current device) with the
/// caller's CUDA stream `compute` (of that device) as the compute stream; see adopted_rank.
/// Every rank of `world` calls it. A null communicator, a device mismatch or a communicator in
/// error is an error naming the values.
[[nodiscard]] inline std::unique_ptr<adopted_rank> adopt(ncclComm_t world, cudaStream_t compute,
                                                         adopt_options opt = {}) {
  return std::make_unique<adopted_rank>(world, compute, std::move(opt));
}

/// Joins the job described by the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT; CCGRAPH_STORE_FILE for a file store): this process becomes one
/// rank on GPU LOCAL_RANK, its NCCL world communicator made through the rendezvous store.
inline std::unique_ptr<process_rank> init_from_env(nccl_options opt = {}) {
  return std::make_unique<process_rank>(env_config::from_env(), opt);
}

/// Runs `fn(rank_context&)` on `n` GPUs of this process, one thread per GPU (rank r on device
/// r), with NCCL communicators; returns when all ranks finished. Each rank's tensors are created
/// on its GPU (its default device) and its compute runs on its own stream. If a rank throws,
/// every other rank's waits fail with an aborted_error naming it, and the first rank's exception
/// is rethrown here.
template <class F>
void run_gpus(int n, F&& fn, nccl_options opt = {}) {
  const int devices = device_count();
  CCGRAPH_CHECK(n >= 1 && n <= devices, "run_gpus: asked for ", n, " ranks but ", devices,
                " CUDA device", devices == 1 ? " is" : "s are", " visible");
  auto world = std::make_shared<detail::gpu_world>();
  auto ids = std::make_shared<detail::local_id_exchange>();
  auto registry = std::make_shared<group_registry>(n);
  std::vector<std::thread> ranks;
  ranks.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      std::shared_ptr<detail::nccl_rank> comm;
      try {
        CCGRAPH_CHECK_CUDA(cudaSetDevice(r));
        device_guard dev(device::cuda(r));
        stream compute(cudaStreamNonBlocking);
        stream_guard on(compute.get());
        detail::block_cache blocks(compute.get(), r);  // before `compute` ends: it frees there
        comm = std::make_shared<detail::nccl_rank>(r, n, r, ids, world, opt);
        detail::nccl_rank::current_watchdog_guard wd(comm->watchdog());
        std::vector<int> all(static_cast<std::size_t>(n));
        for (int i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
        (void)comm->comm_for(all);  // the world communicator, up front
        {
          rank_context ctx(r, n, device::cuda(r), registry, comm);
          ::ccgraph::detail::rank_scope scope(ctx);
          fn(ctx);
        }
        detail::wait_stream(compute.get(), "draining the rank's compute at its end");
        comm->drain();
        comm->close(world->finish(n, opt.timeout));
      } catch (...) {
        world->abort(r, std::current_exception());
        ids->abort();
        if (comm) comm->abort_comms();
      }
    });
  }
  for (auto& t : ranks) t.join();
  if (auto e = world->first_error()) std::rethrow_exception(e);
}

}  // namespace ccgraph::cuda
