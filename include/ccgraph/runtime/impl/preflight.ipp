// ccgraph/runtime/impl/preflight.ipp: the non-template functions of
// <ccgraph/runtime/preflight.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/runtime/preflight.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/runtime/threads.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL work_ptr preflight_communicator::launch(std::shared_ptr<collective_request> req) {
  CCGRAPH_THROW(error, "preflight: rank ", rank_, "'s program ran ", req->describe(), at_site(req->source),
                " on tensors; preflight only traces: return the graph of cg::trace (collectives on the "
                "traced function's values), and schedule with preflight_options::passes (or, inside the "
                "program, with schedule_options{.agreement = collective_agreement::spmd})");
}

/// One collective as the backends match it: the group it is matched in (ranks, tag, whether it
/// is a point-to-point pair, as threads_group_key has it) and what every member must agree on.
struct matched_collective {
  std::tuple<std::vector<int>, std::string, bool> key;
  preflight_collective c;
};

/// `rank`'s collectives in `g`, in program order; a batch of point-to-point transfers as its
/// transfers, each over its pair (ops::p2p_transfers), as the backends match them.
CCGRAPH_DECL std::vector<matched_collective> matched_collectives(const graph& g, int rank) {
  std::vector<matched_collective> out;
  auto add = [&](const ops::signature& sig, const std::string& tag, bool p2p, const node& n) {
    preflight_collective c{rank, static_cast<std::int64_t>(out.size()), sig.str(), sig.ranks, site_str(n.source())};
    out.push_back({{sig.ranks, tag, p2p}, std::move(c)});
  };
  for (const node* n : g.nodes()) {
    if (!n->is_collective()) continue;
    if (auto* b = std::get_if<ops::batch_isend_irecv>(&n->kind())) {
      for (const auto& t : ops::p2p_transfers(*b, rank, *n->group())) add(ops::signature(t.op, {}, t.pair), t.pair.tag, true, *n);
      continue;
    }
    std::vector<tensor_meta> in;
    for (auto& a : n->args()) in.push_back(a.src->meta(a.index));
    add(ops::signature(*n->collective(), in, *n->group()), n->group()->tag, false, *n);
  }
  return out;
}

/// "all_reduce(...) at file:line (its collective #k)".
CCGRAPH_DECL std::string where(const preflight_collective& c) {
  return concat(c.text, " (its collective #", c.index, ")",
                c.site.empty() ? std::string(", call site unknown") : " at " + c.site);
}

CCGRAPH_DECL preflight_report match_collectives(const std::vector<graph>& graphs) {
  const int world = static_cast<int>(graphs.size());
  preflight_report rep;
  rep.world_size = world;
  std::vector<std::vector<matched_collective>> seqs;
  for (int r = 0; r < world; ++r) seqs.push_back(matched_collectives(graphs[static_cast<std::size_t>(r)], r));
  std::vector<std::size_t> head(static_cast<std::size_t>(world), 0);
  std::map<std::tuple<std::vector<int>, std::string, bool>, std::int64_t> done;  // per group: completed
  auto at_head = [&](int r) -> const matched_collective* {
    const auto& s = seqs[static_cast<std::size_t>(r)];
    const std::size_t h = head[static_cast<std::size_t>(r)];
    return h < s.size() ? &s[h] : nullptr;
  };
  auto out_of_world = [&](int m) { return m < 0 || m >= world; };

  // Each rank runs its collectives in order, and a collective completes once every member of
  // its group has reached it (a backend's communication worker). Complete what can complete,
  // in rank order, until nothing can.
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < world; ++r) {
      const matched_collective* mine = at_head(r);
      if (!mine) continue;
      const auto& members = std::get<0>(mine->key);
      for (int m : members)
        if (out_of_world(m)) {
          rep.problem = concat("preflight: rank ", r, " issues ", where(mine->c), " on a group with rank ", m,
                               ", outside the world of ", world, " ranks");
          rep.at = {mine->c};
          return rep;
        }
      bool all_here = true;
      for (int m : members) {
        const matched_collective* theirs = at_head(m);
        all_here = all_here && theirs && theirs->key == mine->key;
      }
      if (!all_here) continue;
      // Every member is at a collective of this group: they must all be the same one.
      bool same = true;
      for (int m : members) same = same && at_head(m)->c.text == mine->c.text;
      const std::int64_t pos = done[mine->key];
      if (!same) {
        std::string each;
        for (int m : members) {
          each += concat(each.empty() ? "" : "; ", "rank ", m, " issues ", where(at_head(m)->c));
          rep.at.push_back(at_head(m)->c);
        }
        rep.problem = concat("preflight: collective mismatch at collective #", pos, " of group ", list_str(members),
                             std::get<1>(mine->key).empty() ? "" : " (tag " + std::get<1>(mine->key) + ")", ": ", each);
        return rep;
      }
      ++done[mine->key];
      for (int m : members) ++head[static_cast<std::size_t>(m)];
      progress = true;
    }
  }

  // Stuck. A rank waiting on a member that issues nothing more is reported first (the lowest
  // such rank); else every waiting rank waits on a member busy in another group's collective.
  std::vector<int> stuck;
  for (int r = 0; r < world; ++r)
    if (at_head(r)) stuck.push_back(r);
  if (stuck.empty()) return rep;
  for (int r : stuck) {
    const matched_collective* mine = at_head(r);
    for (int m : std::get<0>(mine->key))
      if (!at_head(m)) {
        rep.problem = concat("preflight: collective mismatch: rank ", r, " issues ", where(mine->c), ", collective #",
                             done[mine->key], " of group ", list_str(std::get<0>(mine->key)), ", but rank ", m,
                             " issues no more collectives (it issues ", seqs[static_cast<std::size_t>(m)].size(),
                             " in all)");
        rep.at = {mine->c};
        return rep;
      }
  }
  std::string each;
  for (int r : stuck) {
    const matched_collective* mine = at_head(r);
    int other = -1;  // a member that is elsewhere
    for (int m : std::get<0>(mine->key))
      if (at_head(m)->key != mine->key) {
        other = m;
        break;
      }
    each += concat(each.empty() ? "" : "; ", "rank ", r, " waits in ", where(mine->c), " for rank ", other);
    rep.at.push_back(mine->c);
  }
  rep.problem = concat("preflight: collective mismatch: the ranks issue their collectives in orders that wait on "
                       "each other, so none of these can complete: ", each);
  return rep;
}

CCGRAPH_DECL preflight_report preflight_graphs(std::vector<graph> graphs, const preflight_options& opt) {
  const int world = static_cast<int>(graphs.size());
  // The traced programs first: a difference there is the user's, whatever the passes do.
  preflight_report rep = match_collectives(graphs);
  if (!rep.ok()) return rep;
  if (!opt.passes.empty()) {
    // Through a threads world on this CPU, so that bucket_collectives and
    // decompose_matmul_collectives agree across each group as they would on the real backend
    // (they exchange a few integers; nothing of the program runs).
    run_threads(world, [&](rank_context& ctx) {
      schedule_options so = opt.schedule;
      so.context = &ctx;
      so.agreement = collective_agreement::automatic;
      graph& g = graphs[static_cast<std::size_t>(ctx.rank())];
      for (const auto& p : opt.passes) apply_pass(g, p, so);
      lint(g);
    });
    rep = match_collectives(graphs);
    if (!rep.ok()) {
      std::string passes;
      for (const auto& p : opt.passes) passes += (passes.empty() ? "" : ", ") + p;
      rep.problem += concat(" (after the passes ", passes, ")");
      return rep;
    }
  }
  std::vector<timeline> tls;
  std::vector<std::string> names;
  for (int r = 0; r < world; ++r) {
    const graph& g = graphs[static_cast<std::size_t>(r)];
    preflight_rank pr;
    pr.rank = r;
    pr.nodes = g.size();
    for (const node* n : g.nodes()) pr.collectives += n->is_collective() ? 1 : 0;
    const memory_plan plan = plan_memory(g, opt.memory);
    pr.peak_bytes = plan.arena_bytes;
    pr.live_peak_bytes = plan.live_peak_bytes;
    tls.push_back(predict(g, opt.schedule));
    pr.predicted_us = tls.back().total_us;
    pr.exposed_comm_us = tls.back().exposed_comm_us;
    names.push_back(concat("rank ", r));
    rep.ranks.push_back(pr);
  }
  rep.trace_json = to_chrome_trace(tls, names);
  if (!opt.trace_path.empty()) {
    std::ofstream f(opt.trace_path, std::ios::binary);
    f << rep.trace_json;
    f.close();
    CCGRAPH_CHECK(f.good(), "preflight: cannot write the predicted timeline to '", opt.trace_path, "'");
  }
  return rep;
}

CCGRAPH_DECL preflight_args parse_preflight_args(int argc, const char* const* argv) {
  preflight_args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      CCGRAPH_CHECK(i + 1 < argc, "preflight: ", arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      a.help = true;
    } else if (arg == "--world") {
      const std::string v = value();
      a.world_size = static_cast<int>(parse_env_integer("--world", v, 1, 4096, "a whole number from 1 to 4096"));
    } else if (arg == "--trace") {
      a.options.trace_path = value();
      CCGRAPH_CHECK(!a.options.trace_path.empty(), "preflight: --trace needs a path");
    } else if (arg == "--passes") {
      const std::string v = value();
      std::stringstream ss(v);
      for (std::string p; std::getline(ss, p, ',');)
        if (!p.empty()) a.options.passes.push_back(p);
      const auto& known = schedule_pass_names();
      for (const auto& p : a.options.passes)
        CCGRAPH_CHECK(std::find(known.begin(), known.end(), p) != known.end(), "preflight: --passes: unknown pass '",
                      p, "'");
    } else {
      CCGRAPH_THROW(error, "preflight: unknown argument '", arg, "'");
    }
  }
  return a;
}

CCGRAPH_DECL std::string preflight_usage(const char* argv0) {
  std::string passes;
  for (auto p : schedule_pass_names()) passes += concat(passes.empty() ? "" : ", ", p);
  return concat("usage: ", argv0, " [--world N] [--trace out.json] [--passes a,b,c]\n",
                "  traces every rank's program on this CPU, checks that the ranks issue the same collectives\n",
                "  in the same order, reports each rank's planned peak memory and writes the merged\n",
                "  predicted timeline (Chrome trace JSON, one process per rank).\n",
                "  --world N     ranks (default 2)\n",
                "  --trace PATH  where to write the predicted timeline\n",
                "  --passes LIST schedule passes to apply first: ", passes, "\n",
                "exit status: 0 the ranks agree, 1 they do not, 2 bad command line\n");
}

CCGRAPH_DECL int finish_preflight_main(const preflight_report& r, const preflight_args& a, std::ostream& out) {
  out << r.str();
  if (r.ok() && !a.options.trace_path.empty()) out << "predicted timeline: " << a.options.trace_path << "\n";
  return r.ok() ? 0 : 1;
}

}  // namespace detail

CCGRAPH_DECL void preflight_report::check() const {
  if (!ok()) CCGRAPH_THROW(collective_mismatch_error, problem);
}

CCGRAPH_DECL std::string preflight_report::str() const {
  std::ostringstream os;
  if (!ok()) {
    os << "preflight: " << world_size << " ranks: FAILED\n" << problem << "\n";
    return os.str();
  }
  os << "preflight: " << world_size << " ranks issue the same collectives in the same order\n";
  for (const preflight_rank& r : ranks)
    os << "  rank " << r.rank << ": " << r.collectives << " collectives, " << r.nodes << " nodes, peak memory "
       << r.peak_bytes << " bytes (live peak " << r.live_peak_bytes << "), predicted " << r.predicted_us
       << " us (exposed communication " << r.exposed_comm_us << " us)\n";
  return os.str();
}

}  // namespace ccgraph
