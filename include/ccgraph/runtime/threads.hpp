// ccgraph/runtime/threads.hpp: the `threads` backend. Each rank is a thread of this process;
// collectives are computed for real through shared memory on a per-rank communication worker,
// so asynchrony and overlap are real. This is the backend of CI and of the acceptance tests.
#pragma once

#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <chrono>
#include <compare>
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
#include <tuple>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/comm/communicator.hpp>
#include <ccgraph/runtime/cpu_collectives.hpp>
#include <ccgraph/comm/rank_context.hpp>

namespace ccgraph {

/// Settings of a threads world.
struct threads_options {
  /// How long a collective waits for the other members before failing with a timeout_error.
  /// Must be positive; milliseconds::max() waits forever. Defaults to $CCGRAPH_TIMEOUT_MS,
  /// else 300 s.
  std::chrono::milliseconds timeout = default_timeout();

  /// $CCGRAPH_TIMEOUT_MS if set (a positive whole number of milliseconds, else an error naming
  /// it), else 300 s.
  static std::chrono::milliseconds default_timeout() { return detail::default_timeout(); }
};

namespace detail {

/// What a group's collectives are numbered by: its members and its tag. Two calls belong to one
/// sequence exactly when their keys are equal: a tagged group over the same ranks is another
/// group, with its own sequence (as c10d's group tags give it its own communicator).
/// Point-to-point transfers are numbered per pair of ranks (`p2p`), apart from the group's
/// collectives: the k-th send from a to b meets the k-th receive on b from a.
struct threads_group_key {
  std::vector<int> ranks;
  std::string tag;
  bool p2p = false;
  friend auto operator<=>(const threads_group_key&, const threads_group_key&) = default;
  static threads_group_key of(const collective_request& r) {
    return {r.group.ranks, r.group.tag, std::holds_alternative<ops::batch_isend_irecv>(r.op)};
  }
};

/// A batch of point-to-point transfers split into one request per transfer, each over its pair
/// of ranks, in ops::p2p_transfers's order (the same on every rank).
CCGRAPH_DECL std::vector<std::shared_ptr<collective_request>> split_p2p(const collective_request& req);

/// One collective of one group (its position `seq` in the group's sequence), from the first
/// member's issue to the last member's completion: where the members' calls are compared and
/// where their communication workers meet. Guarded by the world's mutex.
struct threads_slot {
  threads_slot(std::int64_t seq_, ops::signature sig_, int first_rank)
      : seq(seq_),
        sig(std::move(sig_)),
        sig_rank(first_rank),
        reqs(sig.ranks.size(), nullptr),
        holds(sig.ranks.size()),
        works(sig.ranks.size()) {}
  int size() const { return static_cast<int>(sig.ranks.size()); }
  bool complete() const { return arrived == size(); }

  std::int64_t seq;
  ops::signature sig;  // what the first member issued (once, not per peer): the others must match
  int sig_rank;        // that first member
  std::vector<const collective_request*> reqs;             // arrived members, in group order
  std::vector<std::shared_ptr<collective_request>> holds;  // keeps peers' inputs alive
  std::vector<work_ptr> works;
  int arrived = 0;
  int finished = 0;
  std::condition_variable cv;  // its arrived members wait here for the others
  std::map<std::int64_t, std::shared_ptr<threads_slot>>* owner = nullptr;  // its group's pending slots
};

/// One launched collective as queued on a rank's communication worker.
struct threads_task {
  std::shared_ptr<collective_request> req;
  std::shared_ptr<threads_slot> slot;
  int index = 0;  // the rank's position in the group
  work_ptr done;
};

/// The state the ranks of one threads world share: group names, each group's sequence of
/// collectives (the slots where members are compared and meet), who is blocked where, and the
/// abort flag. Order checking costs O(group size) per call and O(pending collectives) memory:
/// the k-th collective of a group is recorded once, by its first member, and compared by the
/// others; ranks that disagree about which group comes next leave their workers waiting on each
/// other, and that cycle is found when the last of them blocks.
class threads_world {
 public:
  threads_world(int n, threads_options opt)
      : n_(n),
        opt_(opt),
        registry_(std::make_shared<group_registry>(n)),
        exited_(static_cast<std::size_t>(n), false),
        blocked_on_(static_cast<std::size_t>(n), nullptr),
        visit_(static_cast<std::size_t>(n), 0) {}

  const std::shared_ptr<group_registry>& registry() const { return registry_; }

  /// Issue-time bookkeeping on the calling rank's thread: fails at once if the world is
  /// aborted, if this collective differs from what a peer issued at the same position of the
  /// group, or if a member already returned without issuing it. Returns the task to queue.
  threads_task issue(std::shared_ptr<collective_request> req) {
    // The backend indexes members by the group: never let a group of another world in.
    check_group_fits(ops::name_of(req->op), req->group, req->rank, n_);
    threads_group_key key = threads_group_key::of(*req);
    const int me = req->group.index_of(req->rank);
    std::lock_guard lk(mu_);
    if (aborted_) std::rethrow_exception(error_for(req->rank));
    group_state& g = groups_[std::move(key)];
    if (g.issued.empty()) g.issued.assign(req->group.ranks.size(), 0);
    const std::int64_t seq = g.issued[static_cast<std::size_t>(me)]++;
    std::shared_ptr<threads_slot>& sp = g.pending[seq];
    if (!sp) {
      sp = std::make_shared<threads_slot>(seq, ops::signature(req->op, req->input_metas(), req->group), req->rank);
      sp->owner = &g.pending;
    } else if (ops::signature sig(req->op, req->input_metas(), req->group); !(sig == sp->sig)) {
      auto e = std::make_exception_ptr(collective_mismatch_error(concat(
          "collective mismatch between rank ", req->rank, " and rank ", sp->sig_rank, " at collective #",
          seq, " of group ", list_str(req->group.ranks), ": rank ", req->rank, " issued ", sig.str(),
          " but rank ", sp->sig_rank, " issued ", sp->sig.str())));
      abort_locked(req->rank, e);
      std::rethrow_exception(e);
    }
    if (exited_count_ > 0)
      for (std::size_t i = 0; i < g.issued.size(); ++i)
        if (exited_[static_cast<std::size_t>(req->group.ranks[i])] && g.issued[i] <= seq) {
          auto e = never_completes(*sp, req->group.ranks[i]);
          abort_locked(req->rank, e);
          std::rethrow_exception(e);
        }
    return threads_task{std::move(req), sp, me, std::make_shared<work>()};
  }

  /// Runs one collective on the issuing rank's worker: meet the other members, compute this
  /// rank's outputs, and complete every member's work once all have read all inputs (so no
  /// rank reuses an input buffer a peer is still reading).
  void run(threads_task& t) {
    const collective_request& req = *t.req;
    threads_slot& s = *t.slot;
    const int size = s.size();
    const auto me = static_cast<std::size_t>(t.index);
    // An output written in place over its own input (the executor's stolen all_reduce buffers):
    // peers must read a copy of that input, or they could see this member's partial result.
    snapshot_aliased_inputs(*t.req);
    std::unique_lock lk(mu_);
    if (aborted_) return t.done->fail(error_for(req.rank));
    s.reqs[me] = t.req.get();
    s.holds[me] = t.req;
    s.works[me] = t.done;
    if (++s.arrived == size) {
      if (size > 1) --waiting_slots_;
      s.cv.notify_all();
    } else {
      if (s.arrived == 1) ++waiting_slots_;
      blocked_on_[static_cast<std::size_t>(req.rank)] = &s;
      struct unblock {
        threads_slot*& b;
        ~unblock() { b = nullptr; }
      } guard{blocked_on_[static_cast<std::size_t>(req.rank)]};
      if (auto e = deadlock_through(req.rank)) return fail_locked(t, req.rank, e);
      const auto deadline = deadline_after(std::chrono::steady_clock::now(), opt_.timeout);  // max: forever
      while (!aborted_ && !s.complete()) {
        if (s.cv.wait_until(lk, deadline) == std::cv_status::timeout && !aborted_ && !s.complete()) {
          std::vector<int> missing;
          for (int i = 0; i < size; ++i)
            if (!s.reqs[static_cast<std::size_t>(i)]) missing.push_back(s.sig.ranks[static_cast<std::size_t>(i)]);
          return fail_locked(t, req.rank, std::make_exception_ptr(timeout_error(concat(
              req.describe(), " (collective #", s.seq, " on its group) timed out after ",
              timeout_text(opt_.timeout), " on rank ", req.rank, " waiting for ranks ",
              list_str(missing)))));
        }
      }
    }
    if (aborted_) return t.done->fail(error_for(req.rank));
    lk.unlock();
    try {
      run_cpu_collective(req, s.reqs, t.index);
    } catch (...) {
      lk.lock();
      return fail_locked(t, req.rank, std::current_exception());
    }
    lk.lock();
    if (++s.finished == size) {
      // Drop every member's references to its buffers before completing: once a wait returns,
      // nothing in the backend holds the memory (an executor can then tell its arena is free).
      for (auto& h : s.holds) {
        h->inputs.clear();
        h->outputs.clear();
      }
      for (auto& w : s.works) w->complete();
      s.owner->erase(s.seq);  // a no-op after an abort, which cleared every group's slots
    }
  }

  /// Records that `rank` failed with `e`: the first failure wins; every pending and future
  /// collective of every rank fails with an error naming it.
  void abort(int rank, std::exception_ptr e) {
    std::lock_guard lk(mu_);
    abort_locked(rank, std::move(e));
  }

  /// Records that `rank`'s function returned: a collective some member issued and `rank`
  /// never did can no longer complete, and fails the world at once instead of timing out.
  void mark_exited(int rank) {
    std::lock_guard lk(mu_);
    exited_[static_cast<std::size_t>(rank)] = true;
    ++exited_count_;
    if (aborted_) return;
    for (auto& [key, g] : groups_) {
      const auto it = std::lower_bound(key.ranks.begin(), key.ranks.end(), rank);
      if (it == key.ranks.end() || *it != rank) continue;
      const auto issued = g.issued[static_cast<std::size_t>(it - key.ranks.begin())];
      const auto never = g.pending.lower_bound(issued);  // issued by a peer, never by `rank`
      if (never == g.pending.end()) continue;
      return abort_locked(never->second->sig_rank, never_completes(*never->second, rank));
    }
  }

  /// The first failure, or null.
  std::exception_ptr first_error() const {
    std::lock_guard lk(mu_);
    return first_error_;
  }

 private:
  struct group_state {
    std::vector<std::int64_t> issued;  // per member (group order): collectives issued so far
    std::map<std::int64_t, std::shared_ptr<threads_slot>> pending;  // by position
  };

  /// What every rank but the failing one gets: a copy of a mismatch (every rank learns what
  /// disagreed), else an aborted_error naming the failing rank and its error.
  std::exception_ptr error_for(int rank) const {
    if (rank == failed_rank_) return first_error_;
    if (mismatch_) return std::make_exception_ptr(collective_mismatch_error(failure_));
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
    } catch (const collective_mismatch_error& x) {
      mismatch_ = true;
      failure_ = x.what();
    } catch (const std::exception& x) {
      failure_ = x.what();
    } catch (...) {
      failure_ = "unknown exception";
    }
    // Release every rank blocked on a collective that can no longer complete.
    for (auto& [key, g] : groups_) {
      for (auto& [seq, s] : g.pending) {
        for (std::size_t i = 0; i < s->works.size(); ++i)
          if (s->works[i]) s->works[i]->fail(error_for(s->reqs[i]->rank));
        s->cv.notify_all();
      }
      g.pending.clear();
    }
    waiting_slots_ = 0;
  }

  void fail_locked(threads_task& t, int rank, std::exception_ptr e) {
    abort_locked(rank, e);
    t.done->fail(error_for(rank));
  }

  std::exception_ptr never_completes(const threads_slot& s, int peer) const {
    return std::make_exception_ptr(collective_mismatch_error(concat(
        s.sig.str(), " (collective #", s.seq, " on its group), issued by rank ", s.sig_rank,
        ", can never complete: rank ", peer, " returned from its function without issuing it")));
  }

  /// A rank waits on a member of its collective that has not arrived; when that member's worker
  /// is itself blocked on another collective, it cannot arrive before that one completes (a
  /// worker runs its rank's collectives in issue order). A cycle of such waits never resolves:
  /// ranks that disagree about the order of their groups' collectives. `start` just blocked, so
  /// a cycle formed now passes through it; returns the mismatch error naming each rank's
  /// blocked collective, or null. Members that are idle or still busy are no edges: they may
  /// yet arrive.
  std::exception_ptr deadlock_through(int start) {
    if (waiting_slots_ < 2) return nullptr;  // every blocked worker waits on the same collective
    ++epoch_;
    visit_[static_cast<std::size_t>(start)] = epoch_;
    struct frame {
      int rank;
      std::size_t next;  // the next member of its blocked collective to look at
    };
    std::vector<frame> path{{start, 0}};
    while (!path.empty()) {
      const threads_slot& b = *blocked_on_[static_cast<std::size_t>(path.back().rank)];
      bool deeper = false;
      while (!deeper && path.back().next < b.reqs.size()) {
        const std::size_t i = path.back().next++;
        if (b.reqs[i]) continue;  // arrived
        const int m = b.sig.ranks[i];
        if (m == start) return cycle_error(path);
        const threads_slot* mb = blocked_on_[static_cast<std::size_t>(m)];
        if (!mb || mb->complete() || visit_[static_cast<std::size_t>(m)] == epoch_) continue;
        visit_[static_cast<std::size_t>(m)] = epoch_;
        path.push_back({m, 0});
        deeper = true;
      }
      if (!deeper) path.pop_back();
    }
    return nullptr;
  }

  template <class Frames>
  std::exception_ptr cycle_error(const Frames& path) const {
    // Start the cycle at its lowest rank, whichever rank closed it.
    std::size_t first = 0;
    for (std::size_t i = 1; i < path.size(); ++i)
      if (path[i].rank < path[first].rank) first = i;
    std::vector<int> ranks;
    for (std::size_t k = 0; k < path.size(); ++k) ranks.push_back(path[(first + k) % path.size()].rank);
    std::string who = ranks.size() == 2 ? concat("rank ", ranks[0], " and rank ", ranks[1]) : "ranks ";
    for (std::size_t k = 0; ranks.size() > 2 && k < ranks.size(); ++k)
      who += concat(k == 0 ? "" : k + 1 == ranks.size() ? " and " : ", ", ranks[k]);
    std::string waits;
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      const threads_slot& b = *blocked_on_[static_cast<std::size_t>(ranks[k])];
      const auto& mine = *b.reqs[static_cast<std::size_t>(std::lower_bound(b.sig.ranks.begin(), b.sig.ranks.end(), ranks[k]) -
                                                          b.sig.ranks.begin())];
      waits += concat(k ? "; " : "", "rank ", ranks[k], " waits in ", mine.describe(), " (collective #", b.seq,
                      " on its group) for rank ", ranks[(k + 1) % ranks.size()]);
    }
    return std::make_exception_ptr(collective_mismatch_error(concat(
        "collective mismatch between ", who, ", which issued their collectives in orders that ",
        "wait on each other: ", waits, "; none of these can complete")));
  }

  const int n_;
  const threads_options opt_;
  std::shared_ptr<group_registry> registry_;
  mutable std::mutex mu_;
  std::map<threads_group_key, group_state> groups_;
  std::vector<bool> exited_;
  int exited_count_ = 0;
  std::vector<threads_slot*> blocked_on_;  // per rank: the collective its worker waits in, or null
  int waiting_slots_ = 0;                  // collectives with some but not all members arrived
  std::vector<std::uint64_t> visit_;       // deadlock search marks (== epoch_: visited)
  std::uint64_t epoch_ = 0;
  bool aborted_ = false;
  bool mismatch_ = false;
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
    queued q;
    if (std::holds_alternative<ops::batch_isend_irecv>(req->op)) {
      // Issued now, on the rank's thread, as any collective: a mismatch throws here.
      for (auto& part : split_p2p(*req)) q.parts.push_back(world_.issue(std::move(part)));
      q.done = std::make_shared<work>();
    } else {
      q.parts.push_back(world_.issue(std::move(req)));
      q.done = q.parts.front().done;
    }
    work_ptr w = q.done;
    {
      std::lock_guard lk(mu_);
      queue_.push_back(std::move(q));
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
  /// One launch: a collective (one part, whose work is the launch's), or a batch of
  /// point-to-point transfers, run in their order and complete when all are.
  struct queued {
    std::vector<threads_task> parts;
    work_ptr done;
  };

  void loop() {
    while (true) {
      queued q;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        q = std::move(queue_.front());
        queue_.pop_front();
      }
      for (auto& t : q.parts) world_.run(t);
      if (q.parts.size() == 1 && q.done == q.parts.front().done) continue;
      // Both members of every transfer have arrived, so waiting here only waits for the peer
      // to finish its copy: it cannot block on another collective.
      try {
        for (auto& t : q.parts) t.done->wait();
        q.done->complete();
      } catch (...) {
        q.done->fail(std::current_exception());
      }
    }
  }

  threads_world& world_;
  int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<queued> queue_;
  bool stop_ = false;
  std::thread worker_;
};

/// Holds rank threads until every thread of the world exists, so a world that cannot be
/// created runs no rank's function at all (and leaves no rank waiting for a peer that never
/// started).
class start_gate {
 public:
  /// Blocks until opened (true) or cancelled (false).
  bool wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return state_ != closed; });
    return state_ == opened;
  }
  void open() { set(opened); }
  void cancel() { set(cancelled); }

 private:
  enum state_t { closed, opened, cancelled };
  void set(state_t s) {
    {
      std::lock_guard lk(mu_);
      state_ = s;
    }
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  state_t state_ = closed;
};

}  // namespace detail

/// Runs `fn(rank_context&)` on `n` ranks, each a thread with its own communication worker, and
/// returns when all have finished. If any rank throws, the world is aborted (every other rank's
/// pending and future collectives fail with an error naming it, or with the same
/// collective_mismatch_error when ranks disagreed about a collective) and the first rank's
/// exception is rethrown here. The world's 2n threads are all created before any rank starts;
/// when the process cannot create them (thread or memory limits) this throws a ccgraph::error
/// naming n and the failure, having run no rank's function.
template <class F>
void run_threads(int n, F&& fn, threads_options opt = {}) {
  CCGRAPH_CHECK(n >= 1 && n <= 4096, "run_threads: world size must be in [1, 4096], got ", n);
  detail::check_timeout("run_threads: threads_options::timeout", opt.timeout);
  detail::threads_world world(n, opt);
  detail::start_gate gate;
  std::vector<std::shared_ptr<detail::threads_comm>> comms;
  std::vector<std::thread> ranks;
  int created = 0;  // threads, workers first
  try {
    comms.reserve(static_cast<std::size_t>(n));
    ranks.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r, ++created) comms.push_back(std::make_shared<detail::threads_comm>(world, r));
    for (int r = 0; r < n; ++r, ++created) {
      ranks.emplace_back([&world, &fn, &gate, &comms, r, n] {
        if (!gate.wait()) return;
        const std::shared_ptr<detail::threads_comm>& comm = comms[static_cast<std::size_t>(r)];
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
  } catch (const std::exception& e) {
    gate.cancel();
    for (auto& t : ranks) t.join();
    comms.clear();  // idle workers: each stops at once
    CCGRAPH_THROW(error, "run_threads: cannot start a world of ", n, " ranks: creating thread ",
                  created + 1, " of its ", 2 * n, " threads failed (", e.what(),
                  "); no rank's function was run");
  }
  gate.open();
  for (auto& t : ranks) t.join();
  if (auto e = world.first_error()) std::rethrow_exception(e);
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/runtime/impl/threads.ipp>
#endif
