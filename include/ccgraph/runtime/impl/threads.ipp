// ccgraph/runtime/impl/threads.ipp: the non-template functions of
// <ccgraph/runtime/threads.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/runtime/threads.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::vector<std::shared_ptr<collective_request>> split_p2p(const collective_request& req) {
  const auto& b = std::get<ops::batch_isend_irecv>(req.op);
  std::vector<std::size_t> slot(b.ops.size());  // per transfer: its input (send) or output (recv)
  std::size_t sends = 0, recvs = 0;
  for (std::size_t i = 0; i < b.ops.size(); ++i) slot[i] = b.ops[i].is_send ? sends++ : recvs++;
  std::vector<std::shared_ptr<collective_request>> out;
  for (auto& t : ops::p2p_transfers(b, req.rank, req.group)) {
    auto r = std::make_shared<collective_request>();
    const bool is_send = t.op.ops[0].is_send;
    r->op = std::move(t.op);
    r->group = std::move(t.pair);
    r->rank = req.rank;
    r->overlap = req.overlap;
    r->source = req.source;
    if (is_send) r->inputs.push_back(req.inputs.at(slot[t.index]));
    else r->outputs.push_back(req.outputs.at(slot[t.index]));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace detail

}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL threads_task threads_world::issue(std::shared_ptr<collective_request> req) {
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
    sp->sig_source = req->source;
  } else if (ops::signature sig(req->op, req->input_metas(), req->group); !(sig == sp->sig)) {
    auto e = std::make_exception_ptr(collective_mismatch_error(concat(
        "collective mismatch between rank ", req->rank, " and rank ", sp->sig_rank, " at collective #",
        seq, " of group ", list_str(req->group.ranks), ": rank ", req->rank, " issued ", sig.str(),
        at_site(req->source), " but rank ", sp->sig_rank, " issued ", sp->sig.str(), at_site(sp->sig_source))));
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

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL void threads_world::run(threads_task& t) {
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
            req.describe(), at_site(req.source), " (collective #", s.seq, " on its group) timed out after ",
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

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL void threads_world::abort(int rank, std::exception_ptr e) {
  std::lock_guard lk(mu_);
  abort_locked(rank, std::move(e));
}

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL void threads_world::mark_exited(int rank) {
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

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL std::exception_ptr threads_world::first_error() const {
  std::lock_guard lk(mu_);
  return first_error_;
}

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL std::exception_ptr threads_world::error_for(int rank) const {
  if (rank == failed_rank_) return first_error_;
  if (mismatch_) return std::make_exception_ptr(collective_mismatch_error(failure_));
  return std::make_exception_ptr(aborted_error(concat("rank ", rank, ": aborted because rank ",
                                                      failed_rank_, " failed: ", failure_)));
}

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL void threads_world::abort_locked(int rank, std::exception_ptr e) {
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
  // Rethrown by run_threads too: info, not error, so a failing test or program is not told twice.
  detail::log(log_level::info, "threads", "rank ", rank, " failed, aborting the world: ", failure_);
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

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL void threads_world::fail_locked(threads_task& t, int rank, std::exception_ptr e) {
  abort_locked(rank, e);
  t.done->fail(error_for(rank));
}

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL std::exception_ptr threads_world::never_completes(const threads_slot& s, int peer) const {
  return std::make_exception_ptr(collective_mismatch_error(concat(
      s.sig.str(), " (collective #", s.seq, " on its group), issued by rank ", s.sig_rank, at_site(s.sig_source),
      ", can never complete: rank ", peer, " returned from its function without issuing it")));
}

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL std::exception_ptr threads_world::deadlock_through(int start) {
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

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {


}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL work_ptr threads_comm::launch(std::shared_ptr<collective_request> req) {
  req->rank = rank_;
  const bool timed = req->timed;
  queued q;
  if (std::holds_alternative<ops::batch_isend_irecv>(req->op)) {
    // Issued now, on the rank's thread, as any collective: a mismatch throws here.
    for (auto& part : split_p2p(*req)) q.parts.push_back(world_.issue(std::move(part)));
    q.done = std::make_shared<work>();
  } else {
    q.parts.push_back(world_.issue(std::move(req)));
    q.done = q.parts.front().done;
  }
  // Before the worker sees it: only this rank's worker runs (and so completes) it.
  if (timed) q.done->enable_timing();
  work_ptr w = q.done;
  {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(q));
  }
  cv_.notify_one();
  return w;
}

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL void threads_comm::drain_and_join() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (worker_.joinable()) worker_.join();
}

}  // namespace detail
}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL void threads_comm::loop() {
  while (true) {
    queued q;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      q = std::move(queue_.front());
      queue_.pop_front();
    }
    q.done->mark_started();  // a profiled call's collective: when the worker took it up
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

}  // namespace detail
}  // namespace ccgraph
