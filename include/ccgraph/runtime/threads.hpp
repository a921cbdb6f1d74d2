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
#include <ccgraph/core/log.hpp>
#include <ccgraph/core/source_location.hpp>
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
  std::source_location sig_source{};  // where that member called it (line 0: unknown)
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
  CCGRAPH_DECL threads_task issue(std::shared_ptr<collective_request> req);

  /// Runs one collective on the issuing rank's worker: meet the other members, compute this
  /// rank's outputs, and complete every member's work once all have read all inputs (so no
  /// rank reuses an input buffer a peer is still reading).
  CCGRAPH_DECL void run(threads_task& t);

  /// Records that `rank` failed with `e`: the first failure wins; every pending and future
  /// collective of every rank fails with an error naming it.
  CCGRAPH_DECL void abort(int rank, std::exception_ptr e);

  /// Records that `rank`'s function returned: a collective some member issued and `rank`
  /// never did can no longer complete, and fails the world at once instead of timing out.
  CCGRAPH_DECL void mark_exited(int rank);

  /// The first failure, or null.
  CCGRAPH_DECL std::exception_ptr first_error() const;

 private:
  struct group_state {
    std::vector<std::int64_t> issued;  // per member (group order): collectives issued so far
    std::map<std::int64_t, std::shared_ptr<threads_slot>> pending;  // by position
  };

  /// What every rank but the failing one gets: a copy of a mismatch (every rank learns what
  /// disagreed), else an aborted_error naming the failing rank and its error.
  CCGRAPH_DECL std::exception_ptr error_for(int rank) const;

  CCGRAPH_DECL void abort_locked(int rank, std::exception_ptr e);

  CCGRAPH_DECL void fail_locked(threads_task& t, int rank, std::exception_ptr e);

  CCGRAPH_DECL std::exception_ptr never_completes(const threads_slot& s, int peer) const;

  /// A rank waits on a member of its collective that has not arrived; when that member's worker
  /// is itself blocked on another collective, it cannot arrive before that one completes (a
  /// worker runs its rank's collectives in issue order). A cycle of such waits never resolves:
  /// ranks that disagree about the order of their groups' collectives. `start` just blocked, so
  /// a cycle formed now passes through it; returns the mismatch error naming each rank's
  /// blocked collective, or null. Members that are idle or still busy are no edges: they may
  /// yet arrive.
  CCGRAPH_DECL std::exception_ptr deadlock_through(int start);

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
    std::string waits, sites;
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      const threads_slot& b = *blocked_on_[static_cast<std::size_t>(ranks[k])];
      const auto& mine = *b.reqs[static_cast<std::size_t>(std::lower_bound(b.sig.ranks.begin(), b.sig.ranks.end(), ranks[k]) -
                                                          b.sig.ranks.begin())];
      if (known_site(mine.source)) sites += concat(sites.empty() ? "" : ", ", "rank ", ranks[k], " at ", site_str(mine.source));
      waits += concat(k ? "; " : "", "rank ", ranks[k], " waits in ", mine.describe(), " (collective #", b.seq,
                      " on its group) for rank ", ranks[(k + 1) % ranks.size()]);
    }
    return std::make_exception_ptr(collective_mismatch_error(concat(
        "collective mismatch between ", who, ", which issued their collectives in orders that ",
        "wait on each other: ", waits, "; none of these can complete",
        sites.empty() ? "" : " (called from " + sites + ")")));
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

  CCGRAPH_DECL work_ptr launch(std::shared_ptr<collective_request> req) override;

  /// Runs every queued collective to completion (or failure), then stops the worker.
  CCGRAPH_DECL void drain_and_join();

 private:
  /// One launch: a collective (one part, whose work is the launch's), or a batch of
  /// point-to-point transfers, run in their order and complete when all are.
  struct queued {
    std::vector<threads_task> parts;
    work_ptr done;
  };

  CCGRAPH_DECL void loop();

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
  detail::log(log_level::info, "threads", "world of ", n, " ranks started (collective timeout ",
              detail::timeout_text(opt.timeout), ")");
  gate.open();
  for (auto& t : ranks) t.join();
  if (auto e = world.first_error()) std::rethrow_exception(e);
}

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/runtime/impl/threads.ipp>
#endif
