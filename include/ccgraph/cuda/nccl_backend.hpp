// ccgraph/cuda/nccl_backend.hpp: the `nccl` backend. One rank per GPU; a rank's collectives
// run on its communication stream, ordered after the compute that produced their inputs by an
// event, and their results are joined back by the event its wait enqueues. Communicators are
// non-blocking, so a peer that never arrives or dies ends in an error after a timeout (the
// rank's communicators are aborted), never a hang.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/cuda/current.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/nccl_comm.hpp>
#include <ccgraph/cuda/runtime.hpp>
#include <ccgraph/cuda/stream.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/runtime/communicator.hpp>
#include <ccgraph/runtime/rank_context.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace ccgraph::cuda {

/// Options of the nccl backend.
struct nccl_options {
  /// How long a rank waits for its peers (communicator set-up, and any blocking wait on a
  /// collective) before its communicators are aborted and it fails with a timeout_error.
  /// Defaults to $CCGRAPH_TIMEOUT_MS, else 300 s.
  std::chrono::milliseconds timeout = default_timeout();

  /// $CCGRAPH_TIMEOUT_MS if set to a positive number, else 300 s.
  static std::chrono::milliseconds default_timeout() {
    if (const char* s = std::getenv("CCGRAPH_TIMEOUT_MS")) {
      const long long v = std::atoll(s);
      if (v > 0) return std::chrono::milliseconds(v);
    }
    return std::chrono::milliseconds(300000);
  }
};

namespace detail {

/// The NCCL element type of `dt` (bool travels as bytes, as in PyTorch).
inline ncclDataType_t nccl_dtype(dtype dt) {
  switch (dt) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8: return ncclUint8;
    case dtype::boolean: return ncclUint8;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f16: return ncclFloat16;
  }
  CCGRAPH_THROW(::ccgraph::error, "nccl: unsupported dtype ", dt);
}

/// The NCCL reduction of `op`; NCCL has no bitwise reductions.
inline ncclRedOp_t nccl_redop(reduce_op op, const char* what) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::avg: return ncclAvg;
    case reduce_op::product: return ncclProd;
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
    default: break;
  }
  CCGRAPH_THROW(::ccgraph::error, what, ": reduce op ", op,
                " is not supported by NCCL (it has sum, avg, product, min, max)");
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
    if (!cv_.wait_for(lk, timeout, [&] { return ids_.count(key) != 0 || aborted_; }) || aborted_)
      CCGRAPH_THROW(::ccgraph::timeout_error, "nccl: communicator ", key, " was not created by its first rank within ",
                    timeout.count(), " ms");
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

/// State shared by the ranks of one run: who failed first, and why.
class gpu_world {
 public:
  /// Records that `rank` failed with `e` (the first failure wins).
  void abort(int rank, std::exception_ptr e) {
    std::lock_guard lk(mu_);
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

 private:
  mutable std::mutex mu_;
  bool aborted_ = false;
  int failed_rank_ = -1;
  std::string failure_;
  std::exception_ptr first_error_;
};

/// An owned event that several holders share (a work and the rank's in-flight list).
using shared_event = std::shared_ptr<CUevent_st>;
inline shared_event make_event() {
  cudaEvent_t e = nullptr;
  CCGRAPH_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return shared_event(e, [](cudaEvent_t x) { (void)cudaEventDestroy(x); });
}

/// True while the calling thread's stream records a CUDA Graph (queries are illegal then).
inline bool capturing() {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(current_stream(), &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

class nccl_rank;

/// Completion of one collective on the nccl backend. Waiting enqueues a wait for its event on
/// the calling thread's stream (the host does not block) and releases the buffers the
/// collective used: any later free on that stream is ordered after the collective.
class nccl_work final : public ::ccgraph::detail::work {
 public:
  nccl_work(std::shared_ptr<nccl_rank> owner, shared_event done,
            std::shared_ptr<::ccgraph::detail::collective_request> req)
      : owner_(std::move(owner)), done_(std::move(done)), req_(std::move(req)) {}
  ~nccl_work() override {
    if (req_) (void)cudaStreamWaitEvent(current_stream(), done_.get(), 0);
  }
  void wait() const override;
  bool ready() const override {
    if (capturing()) return false;
    return cudaEventQuery(done_.get()) == cudaSuccess;
  }

 private:
  std::shared_ptr<nccl_rank> owner_;
  shared_event done_;
  mutable std::shared_ptr<::ccgraph::detail::collective_request> req_;
  mutable std::mutex mu_;
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
        opt_(opt),
        comm_stream_(make_comm_stream()) {
    watchdog_.check = [this](std::chrono::steady_clock::duration waited, const char* what) {
      check_health(waited, what);
    };
  }
  nccl_rank(const nccl_rank&) = delete;
  nccl_rank& operator=(const nccl_rank&) = delete;
  ~nccl_rank() override {
    // Local teardown only: the rank already drained its streams (or aborted).
    for (auto& [k, c] : comms_)
      if (c) (void)ncclCommDestroy(c.release());
  }

  /// This rank, the world size and its CUDA device.
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  /// The stream collectives run on.
  cudaStream_t comm_stream() const { return comm_stream_.get(); }
  /// The watchdog blocking waits on this rank's threads poll.
  wait_watchdog* watchdog() { return &watchdog_; }

  /// The communicator of the group `ranks` (global ranks, in group order), made on first use:
  /// every member must ask for it (they do, by calling a collective on the group).
  ncclComm_t comm_for(const std::vector<int>& ranks) {
    auto it = comms_.find(ranks);
    if (it != comms_.end()) return it->second.get();
    std::string key = "nccl/";
    for (std::size_t i = 0; i < ranks.size(); ++i) key += (i ? "," : "") + std::to_string(ranks[i]);
    const auto pos = std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin();
    CCGRAPH_CHECK(pos < static_cast<std::ptrdiff_t>(ranks.size()), "nccl: rank ", rank_,
                  " is not in group ", key);
    const ncclUniqueId id = ids_->get(key, pos == 0, opt_.timeout);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    device_scope scope(device_);
    const ncclResult_t r =
        ncclCommInitRankConfig(&c, static_cast<int>(ranks.size()), id, static_cast<int>(pos), &cfg);
    if (r != ncclInProgress) CCGRAPH_CHECK_NCCL(r);
    settle(c, ("ncclCommInitRankConfig(" + key + ")").c_str());
    return comms_.emplace(ranks, nccl_comm(c)).first->second.get();
  }

  /// Starts `req` on the communication stream after the work already queued on the calling
  /// thread's stream (which produced its inputs).
  ::ccgraph::detail::work_ptr launch(std::shared_ptr<::ccgraph::detail::collective_request> req) override {
    fail_if_aborted();
    req->rank = rank_;
    const char* what = std::visit([](const auto& o) { return o.name.data(); }, req->op);
    ncclComm_t c = comm_for(req->group.ranks);
    const cudaStream_t producer = current_stream();
    const bool in_capture = capturing();
    shared_event ready = make_event(), done = make_event();
    CCGRAPH_CHECK_CUDA(cudaEventRecord(ready.get(), producer));
    CCGRAPH_CHECK_CUDA(cudaStreamWaitEvent(comm_stream(), ready.get(), 0));
    CCGRAPH_CHECK_NCCL(ncclGroupStart());
    try {
      issue(*req, c, what);
    } catch (...) {
      (void)ncclGroupEnd();
      throw;
    }
    const ncclResult_t r = ncclGroupEnd();
    if (r != ncclInProgress) CCGRAPH_CHECK_NCCL(r);
    if (r == ncclInProgress) settle(c, what);
    CCGRAPH_CHECK_CUDA(cudaEventRecord(done.get(), comm_stream()));
    if (!in_capture) track(done, *req);
    return std::make_shared<nccl_work>(shared_from_this(), std::move(done), std::move(req));
  }

  /// The calling thread's stream waits for everything launched on the communication stream.
  void join() override {
    shared_event e = make_event();
    CCGRAPH_CHECK_CUDA(cudaEventRecord(e.get(), comm_stream()));
    CCGRAPH_CHECK_CUDA(cudaStreamWaitEvent(current_stream(), e.get(), 0));
  }

  /// Throws the error this rank reports once the world is aborted (or this rank timed out).
  void fail_if_aborted() const {
    if (local_failure_.empty() && !world_->aborted()) return;
    if (!local_failure_.empty()) CCGRAPH_THROW(::ccgraph::timeout_error, local_failure_);
    CCGRAPH_THROW(::ccgraph::aborted_error, world_->reason(rank_));
  }

  /// Tears down every communicator of this rank without waiting for peers: in-flight kernels
  /// end, and later NCCL calls fail. Safe to call more than once.
  void abort_comms() {
    for (auto& [k, c] : comms_)
      if (c) (void)ncclCommAbort(c.release());
    comms_.clear();
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
    std::string what;
    std::vector<int> ranks;
    std::vector<tensor_meta> metas;
  };

  static stream make_comm_stream() {
    int lo = 0, hi = 0;
    CCGRAPH_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    return stream(cudaStreamNonBlocking, hi);  // communication first: it is on the critical path
  }

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
      if (std::chrono::steady_clock::now() - start > opt_.timeout) {
        abort_comms();
        local_failure_ = ::ccgraph::detail::concat("rank ", rank_, ": ", what, " did not complete within ",
                                                   opt_.timeout.count(), " ms (a peer never arrived)");
        CCGRAPH_THROW(::ccgraph::timeout_error, local_failure_);
      }
      std::this_thread::yield();
    }
  }

  void track(const shared_event& done, const ::ccgraph::detail::collective_request& req) {
    while (!inflight_.empty() && cudaEventQuery(inflight_.front().done.get()) == cudaSuccess)
      inflight_.pop_front();
    inflight_.push_back({done, std::visit([](const auto& o) { return std::string(o.name); }, req.op),
                         req.group.ranks, req.input_metas()});
  }

  /// The watchdog: a peer's failure or a communicator error ends the wait at once; so does
  /// running past the timeout, naming the oldest collective still running.
  void check_health(std::chrono::steady_clock::duration waited, const char* what) {
    if (world_->aborted()) {
      abort_comms();
      fail_if_aborted();
    }
    for (auto& [k, c] : comms_) {
      if (!c) continue;
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(c.get(), &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
        abort_comms();
        ::ccgraph::cuda::detail::throw_nccl_error(st, what, __FILE__, __LINE__);
      }
    }
    if (waited <= opt_.timeout) return;
    std::string pending = "none";
    for (auto& f : inflight_)
      if (cudaEventQuery(f.done.get()) != cudaSuccess) {
        pending = ::ccgraph::detail::concat(f.what, " over ranks ", list_str(f.ranks), " with input ",
                                            f.metas.empty() ? std::string("-") : f.metas.front().str());
        break;
      }
    abort_comms();
    local_failure_ = ::ccgraph::detail::concat("rank ", rank_, ": ", what, " waited more than ",
                                               opt_.timeout.count(), " ms; oldest unfinished collective: ",
                                               pending, " (a peer never issued it or died)");
    CCGRAPH_THROW(::ccgraph::timeout_error, local_failure_);
  }

  /// Enqueues the NCCL calls of `req` (inside a group).
  void issue(const ::ccgraph::detail::collective_request& req, ncclComm_t c, const char* what) {
    const cudaStream_t s = comm_stream();
    auto numel = [](const ::ccgraph::detail::buffer& b) { return static_cast<std::size_t>(numel_of(b.meta.shape)); };
    auto ptr = [](const ::ccgraph::detail::buffer& b) {
      return static_cast<void*>(static_cast<char*>(b.st ? b.st->data() : nullptr) +
                                b.offset * static_cast<std::int64_t>(element_size(b.meta.dtype)));
    };
    const int me = req.group.index_of(rank_);
    std::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          for (std::size_t i = 0; i < req.inputs.size(); ++i) {
            const auto& in = req.inputs[i];
            const auto& out = req.outputs[i];
            const ncclDataType_t dt = nccl_dtype(in.meta.dtype);
            if constexpr (std::is_same_v<O, ops::all_reduce> || std::is_same_v<O, ops::all_reduce_coalesced>) {
              CCGRAPH_CHECK_NCCL(ncclAllReduce(ptr(in), ptr(out), numel(in), dt, nccl_redop(o.op, what), c, s));
            } else if constexpr (std::is_same_v<O, ops::all_gather_into_tensor> ||
                                 std::is_same_v<O, ops::all_gather_into_tensor_coalesced>) {
              CCGRAPH_CHECK_NCCL(ncclAllGather(ptr(in), ptr(out), numel(in), dt, c, s));
            } else if constexpr (std::is_same_v<O, ops::reduce_scatter_tensor> ||
                                 std::is_same_v<O, ops::reduce_scatter_tensor_coalesced>) {
              CCGRAPH_CHECK_NCCL(
                  ncclReduceScatter(ptr(in), ptr(out), numel(out), dt, nccl_redop(o.op, what), c, s));
            } else if constexpr (std::is_same_v<O, ops::broadcast>) {
              CCGRAPH_CHECK_NCCL(ncclBroadcast(ptr(in), ptr(out), numel(in), dt, req.group.index_of(o.src), c, s));
            } else {
              static_assert(std::is_same_v<O, ops::all_to_all_single>);
              // Grouped send/recv: rows of dim 0, split per peer in group order.
              const int n = req.group.size();
              const std::int64_t rows_in = in.meta.shape.empty() ? 1 : in.meta.shape[0];
              const std::int64_t row = rows_in ? numel_of(in.meta.shape) / rows_in : 0;
              auto splits = [&](const std::vector<std::int64_t>& v, std::int64_t total) {
                return v.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(n), total / n) : v;
              };
              const std::int64_t rows_out = out.meta.shape.empty() ? 1 : out.meta.shape[0];
              const auto ins = splits(o.input_split_sizes, rows_in);
              const auto outs = splits(o.output_split_sizes, rows_out);
              const auto esz = static_cast<std::int64_t>(element_size(in.meta.dtype));
              std::int64_t so = 0, ro = 0;
              for (int j = 0; j < n; ++j) {
                const auto sj = static_cast<std::size_t>(j);
                if (ins[sj] * row > 0)
                  CCGRAPH_CHECK_NCCL(ncclSend(static_cast<char*>(ptr(in)) + so * row * esz,
                                              static_cast<std::size_t>(ins[sj] * row), dt, j, c, s));
                if (outs[sj] * row > 0)
                  CCGRAPH_CHECK_NCCL(ncclRecv(static_cast<char*>(ptr(out)) + ro * row * esz,
                                              static_cast<std::size_t>(outs[sj] * row), dt, j, c, s));
                so += ins[sj];
                ro += outs[sj];
              }
            }
          }
        },
        req.op);
    (void)me;
  }

  int rank_;
  int world_size_;
  int device_;
  std::shared_ptr<id_exchange> ids_;
  std::shared_ptr<gpu_world> world_;
  nccl_options opt_;
  stream comm_stream_;
  std::map<std::vector<int>, nccl_comm> comms_;
  std::deque<inflight> inflight_;
  std::string local_failure_;
  wait_watchdog watchdog_;
};

inline void nccl_work::wait() const {
  std::lock_guard lk(mu_);
  owner_->fail_if_aborted();
  CCGRAPH_CHECK_CUDA(cudaStreamWaitEvent(current_stream(), done_.get(), 0));
  req_.reset();  // later frees on this stream come after the collective
}

}  // namespace detail

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
