// ccgraph/runtime/threads.hpp: the `threads` backend. Each rank is a thread of this process;
// collectives are computed for real through shared memory on a per-rank communication worker,
// so asynchrony and overlap are real. This is the backend of CI and of the acceptance tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/runtime/communicator.hpp>
#include <ccgraph/runtime/cpu_collectives.hpp>
#include <ccgraph/runtime/rank_context.hpp>

namespace ccgraph {

/// Settings of a threads world.
struct threads_options {
  /// How long a collective waits for the other members before failing with a timeout_error.
  /// Defaults to $CCGRAPH_TIMEOUT_MS, else 300 s.
  std::chrono::milliseconds timeout = default_timeout();

  /// $CCGRAPH_TIMEOUT_MS if set to a positive number, else 300 s.
  static std::chrono::milliseconds default_timeout() { return detail::default_timeout(); }
};

namespace detail {

/// What identifies a group in a threads world: its ranks and its tag.
using threads_group_key = std::pair<std::vector<int>, std::string>;

/// One launched collective as queued on a rank's communication worker.
struct threads_task {
  std::shared_ptr<collective_request> req;
  threads_group_key group_key;  // the group's ranks and tag
  std::int64_t seq = 0;  // position among this group's collectives
  work_ptr done;
};

/// The state the ranks of one threads world share: group names, the rendezvous slots where the
/// members of each collective meet, cross-rank order checking, and the abort flag.
class threads_world {
 public:
  threads_world(int n, threads_options opt)
      : n_(n),
        opt_(opt),
        registry_(std::make_shared<group_registry>(n)),
        issued_(static_cast<std::size_t>(n)),
        exited_(static_cast<std::size_t>(n), false),
        pairs_(static_cast<std::size_t>(n), std::vector<pair_log>(static_cast<std::size_t>(n))) {}

  const std::shared_ptr<group_registry>& registry() const { return registry_; }

  /// Issue-time bookkeeping on the calling rank's thread: fails at once if the world is aborted
  /// or if this collective differs from what a peer issued at the same position; returns the
  /// collective's sequence number within its group.
  std::int64_t on_issue(const collective_request& req) {
    ops::signature sig(req.op, req.input_metas(), req.group);
    std::lock_guard lk(mu_);
    if (aborted_) std::rethrow_exception(error_for(req.rank));
    const std::int64_t seq = issued_[static_cast<std::size_t>(req.rank)][{req.group.ranks, req.group.tag}]++;
    // The k-th collective rank a issues with peer b must match the k-th one b issues with a,
    // whatever other groups either is in: this catches differing ops, groups, dtypes, shapes.
    for (int peer : req.group.ranks) {
      if (peer == req.rank) continue;
      auto& mine = pairs_[static_cast<std::size_t>(req.rank)][static_cast<std::size_t>(peer)];
      auto& theirs = pairs_[static_cast<std::size_t>(peer)][static_cast<std::size_t>(req.rank)];
      const std::int64_t position = mine.count++;
      if (theirs.pending.empty()) {
        mine.pending.push_back(sig);
        continue;
      }
      ops::signature other = std::move(theirs.pending.front());
      theirs.pending.pop_front();
      if (!(other == sig)) {
        auto e = std::make_exception_ptr(collective_mismatch_error(concat(
            "collective mismatch between rank ", req.rank, " and rank ", peer,
            " at their collective #", position, " with each other: rank ", req.rank, " issued ",
            sig.str(), " but rank ", peer, " issued ", other.str())));
        abort_locked(req.rank, e);
        std::rethrow_exception(e);
      }
    }
    return seq;
  }

  /// Runs one collective on the issuing rank's worker: meet the other members, compute this
  /// rank's outputs, and complete every member's work once all have read all inputs (so no
  /// rank reuses an input buffer a peer is still reading).
  void run(threads_task& t) {
    const collective_request& req = *t.req;
    const int size = req.group.size();
    const int me = req.group.index_of(req.rank);
    // An output written in place over its own input (the executor's stolen all_reduce buffers):
    // peers must read a copy of that input, or they could see this member's partial result.
    snapshot_aliased_inputs(*t.req);
    std::unique_lock lk(mu_);
    if (aborted_) return t.done->fail(error_for(req.rank));
    auto& sp = slots_[{t.group_key, t.seq}];
    if (!sp) sp = std::make_shared<slot>(size);
    const std::shared_ptr<slot> s = sp;
    s->reqs[static_cast<std::size_t>(me)] = t.req.get();
    s->holds[static_cast<std::size_t>(me)] = t.req;
    s->works[static_cast<std::size_t>(me)] = t.done;
    ++s->arrived;
    cv_.notify_all();
    const auto deadline = std::chrono::steady_clock::now() + opt_.timeout;
    while (!aborted_ && s->arrived < size) {
      if (auto e = missing_peer_error(req, t, *s)) return fail_locked(t, req.rank, e);
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !aborted_ && s->arrived < size) {
        std::vector<int> missing;
        for (int i = 0; i < size; ++i)
          if (!s->reqs[static_cast<std::size_t>(i)]) missing.push_back(req.group.ranks[static_cast<std::size_t>(i)]);
        return fail_locked(t, req.rank, std::make_exception_ptr(timeout_error(concat(
            req.describe(), " (collective #", t.seq, " on its group) timed out after ",
            opt_.timeout.count(), " ms on rank ", req.rank, " waiting for ranks ",
            list_str(missing)))));
      }
    }
    if (aborted_) return t.done->fail(error_for(req.rank));
    lk.unlock();
    try {
      run_cpu_collective(req, s->reqs, me);
    } catch (...) {
      lk.lock();
      return fail_locked(t, req.rank, std::current_exception());
    }
    lk.lock();
    if (++s->finished == size) {
      // Drop every member's references to its buffers before completing: once a wait returns,
      // nothing in the backend holds the memory (an executor can then tell its arena is free).
      for (auto& h : s->holds) {
        h->inputs.clear();
        h->outputs.clear();
      }
      for (auto& w : s->works) w->complete();
      slots_.erase({t.group_key, t.seq});
    }
  }

  /// Records that `rank` failed with `e`: the first failure wins; every pending and future
  /// collective of every rank fails with an error naming it.
  void abort(int rank, std::exception_ptr e) {
    std::lock_guard lk(mu_);
    abort_locked(rank, std::move(e));
  }

  /// Records that `rank`'s function returned: peers waiting for a collective it never issued
  /// fail at once instead of timing out.
  void mark_exited(int rank) {
    std::lock_guard lk(mu_);
    exited_[static_cast<std::size_t>(rank)] = true;
    cv_.notify_all();
  }

  /// The first failure, or null.
  std::exception_ptr first_error() const {
    std::lock_guard lk(mu_);
    return first_error_;
  }

 private:
  struct slot {
    explicit slot(int n)
        : reqs(static_cast<std::size_t>(n), nullptr),
          holds(static_cast<std::size_t>(n)),
          works(static_cast<std::size_t>(n)) {}
    std::vector<const collective_request*> reqs;          // in group order
    std::vector<std::shared_ptr<collective_request>> holds;  // keeps peers' inputs alive
    std::vector<work_ptr> works;
    int arrived = 0;
    int finished = 0;
  };
  struct pair_log {
    std::deque<ops::signature> pending;  // issued and not yet matched by the peer
    std::int64_t count = 0;
  };

  std::exception_ptr error_for(int rank) const {
    if (rank == failed_rank_) return first_error_;
    return std::make_exception_ptr(aborted_error(concat("rank ", rank, ": aborted because rank ",
                                                        failed_rank_, " failed: ", failure_)));
  }

  void abort_locked(int rank, std::exception_ptr e) {
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
    // Release every rank blocked on a collective that can no longer complete.
    for (auto& [key, s] : slots_)
      for (std::size_t i = 0; i < s->works.size(); ++i)
        if (s->works[i]) s->works[i]->fail(error_for(s->reqs[i]->rank));
    slots_.clear();
    cv_.notify_all();
  }

  void fail_locked(threads_task& t, int rank, std::exception_ptr e) {
    abort_locked(rank, e);
    t.done->fail(error_for(rank));
  }

  std::exception_ptr missing_peer_error(const collective_request& req, const threads_task& t,
                                        const slot& s) const {
    for (int i = 0; i < req.group.size(); ++i) {
      const int peer = req.group.ranks[static_cast<std::size_t>(i)];
      if (s.reqs[static_cast<std::size_t>(i)] || !exited_[static_cast<std::size_t>(peer)]) continue;
      auto& counts = issued_[static_cast<std::size_t>(peer)];
      auto it = counts.find(t.group_key);  // NOLINT
      if (it == counts.end() || it->second <= t.seq)
        return std::make_exception_ptr(collective_mismatch_error(concat(
            req.describe(), " (collective #", t.seq, " on its group) on rank ", req.rank,
            " can never complete: rank ", peer, " returned from its function without issuing it")));
    }
    return nullptr;
  }

  const int n_;
  const threads_options opt_;
  std::shared_ptr<group_registry> registry_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<threads_group_key, std::int64_t>, std::shared_ptr<slot>> slots_;
  std::vector<std::map<threads_group_key, std::int64_t>> issued_;
  std::vector<bool> exited_;
  std::vector<std::vector<pair_log>> pairs_;
  bool aborted_ = false;
  int failed_rank_ = -1;
  std::string failure_;
  std::exception_ptr first_error_;
};

/// A rank's communicator on the threads backend: launches go to a FIFO worker thread, so a
/// rank's collectives complete in issue order while its own thread goes on computing.
class threads_comm final : public communicator {
 public:
  threads_comm(threads_world& world, int rank) : world_(world), rank_(rank) {
    worker_ = std::thread([this] { loop(); });
  }
  threads_comm(const threads_comm&) = delete;
  threads_comm& operator=(const threads_comm&) = delete;
  ~threads_comm() override { drain_and_join(); }

  work_ptr launch(std::shared_ptr<collective_request> req) override {
    req->rank = rank_;
    threads_task t;
    t.group_key = {req->group.ranks, req->group.tag};
    t.seq = world_.on_issue(*req);
    t.req = std::move(req);
    t.done = std::make_shared<work>();
    work_ptr w = t.done;
    {
      std::lock_guard lk(mu_);
      queue_.push_back(std::move(t));
    }
    cv_.notify_one();
    return w;
  }

  /// Runs every queued collective to completion (or failure), then stops the worker.
  void drain_and_join() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (worker_.joinable()) worker_.join();
  }

 private:
  void loop() {
    while (true) {
      threads_task t;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        t = std::move(queue_.front());
        queue_.pop_front();
      }
      world_.run(t);
    }
  }

  threads_world& world_;
  int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<threads_task> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace detail

/// Runs `fn(rank_context&)` on `n` ranks, each a thread with its own communication worker, and
/// returns when all have finished. If any rank throws, the world is aborted (every other rank's
/// pending and future collectives fail with an error naming it) and the first rank's exception
/// is rethrown here.
template <class F>
void run_threads(int n, F&& fn, threads_options opt = {}) {
  CCGRAPH_CHECK(n >= 1 && n <= 4096, "run_threads: world size must be in [1, 4096], got ", n);
  detail::threads_world world(n, opt);
  std::vector<std::thread> ranks;
  ranks.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&world, &fn, r, n] {
      auto comm = std::make_shared<detail::threads_comm>(world, r);
      rank_context ctx(r, n, device::cpu(), world.registry(), comm);
      {
        detail::rank_scope scope(ctx);
        try {
          fn(ctx);
        } catch (...) {
          world.abort(r, std::current_exception());
        }
      }
      world.mark_exited(r);
      comm->drain_and_join();
    });
  }
  for (auto& t : ranks) t.join();
  if (auto e = world.first_error()) std::rethrow_exception(e);
}

}  // namespace ccgraph
