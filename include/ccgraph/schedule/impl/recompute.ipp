// ccgraph/schedule/impl/recompute.ipp: the non-template functions of
// <ccgraph/schedule/recompute.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/recompute.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::vector<recompute_candidate> recompute_candidates(const graph& g, const liveness_info& live,
                                                             const value_plan& vp, const runtime_estimator& estimate) {
  const auto& nodes = g.nodes();
  const std::size_t n = nodes.size();
  // Per producer: the last position of a node that reads one of its values and is not one of
  // them (a view or wait of it): until where the value is read as it is.
  auto is_alias_of = [&](const node* r, int id) {
    return aliases_input(*r) && r->num_outputs() == 1 && vp.producer_of[g.position(r)][0] == id;
  };
  std::vector<std::size_t> last_read(vp.producers.size(), 0);
  for (std::size_t id = 0; id < vp.producers.size(); ++id)
    for (const value_ref& v : vp.producers[id].aliases)
      for (const node* r : live.readers(v))
        if (!is_alias_of(r, static_cast<int>(id))) last_read[id] = std::max(last_read[id], g.position(r));

  std::vector<recompute_candidate> out;
  struct access {
    std::size_t pos, end;
    node* r;
  };
  std::vector<access> acc;
  for (std::size_t p = 0; p < n; ++p) {
    node* nd = nodes[p];
    if (nd->category() != op_category::pointwise || draws_random(nd->kind()) || nd->num_outputs() != 1) continue;
    const int id = vp.producer_of[p][0];
    if (id < 0) continue;
    const planned_producer& pr = vp.producers[static_cast<std::size_t>(id)];
    if (vp.plan.buffers[static_cast<std::size_t>(pr.buffer)].values.size() != 1) continue;  // reduced in place
    // Who reads the value: the nodes that are not its views, each once, by position.
    recompute_candidate c;
    acc.clear();
    bool ok = true;
    for (const value_ref& v : pr.aliases) {
      if (v.src != nd) {
        ok = ok && v.src->args().size() == 1;  // a view copies from its one input
        c.views.push_back(v.src);
      }
      for (const node* r : live.readers(v))
        if (!is_alias_of(r, id)) acc.push_back({g.position(r), live.read_end(r), const_cast<node*>(r)});
    }
    if (!ok || acc.empty()) continue;
    std::sort(acc.begin(), acc.end(), [](const access& a, const access& b) { return a.pos < b.pos; });
    acc.erase(std::unique(acc.begin(), acc.end(), [](const access& a, const access& b) { return a.pos == b.pos; }),
              acc.end());
    // The cut with the longest free stretch: readers up to `i` keep the value (none: the node
    // is moved), readers from i + 1 on read the copy.
    std::size_t best_len = 0, best_cut = 0, best_lo = 0;
    std::size_t early_end = p;  // the value's last read by the early readers (its own position first)
    for (std::size_t i = 0; i <= acc.size() - 1; ++i) {
      // cut i: readers [0, i) early, [i, size) late.
      // (a node moved right before its first reader frees nothing: its own position is not counted)
      const std::size_t lo = i == 0 ? p + 1 : early_end + 1;
      const std::size_t late = acc[i].pos;
      if (late > lo && late - lo > best_len) best_len = late - lo, best_cut = i, best_lo = lo;
      early_end = std::max(early_end, acc[i].end);
    }
    if (best_len == 0) continue;
    c.late = acc[best_cut].r;
    // Every input must be alive at the copy anyway: a graph input (or derived from one), or read
    // as it is at or after the first late reader.
    for (const value_ref& a : nd->args()) {
      const int ia = vp.producer_of[g.position(a.src)][static_cast<std::size_t>(a.index)];
      ok = ok && (ia < 0 || last_read[static_cast<std::size_t>(ia)] >= acc[best_cut].pos);
      if (ia >= 0) c.inputs.push_back(ia);
    }
    if (!ok) continue;
    c.n = nd;
    c.value = id;
    for (std::size_t i = best_cut; i < acc.size(); ++i) c.late_readers.push_back(acc[i].r);
    c.lo = best_lo;
    c.hi = acc[best_cut].pos - 1;
    c.bytes = vp.plan.buffers[static_cast<std::size_t>(pr.buffer)].bytes;
    c.cost = best_cut == 0 ? 0.0 : estimate(*nd);
    out.push_back(std::move(c));
  }
  return out;
}

CCGRAPH_DECL void apply_recompute(graph& g, const std::vector<const recompute_candidate*>& chosen) {
  std::unordered_map<const node*, std::vector<node*>> before;  // copies to place before a node
  std::unordered_set<const node*> added;
  std::vector<node*> maybe_dead;
  for (const recompute_candidate* c : chosen) {
    std::unordered_map<const node*, node*> copy;  // the node and its views -> their copies
    std::vector<node*>& here = before[c->late];
    node* nc = g.add(c->n->kind(), c->n->args(), c->n->group(), c->n->name() + "_re");
    copy[c->n] = nc;
    here.push_back(nc);
    added.insert(nc);
    // A view's copy reads the copy of its input (views come after their inputs in aliases).
    auto copy_of = [&](auto& self, node* v) -> node* {
      if (auto it = copy.find(v); it != copy.end()) return it->second;
      const value_ref in = v->args().at(0);
      node* vc = g.add(v->kind(), {value_ref{self(self, in.src), in.index}}, v->group(), v->name());
      copy[v] = vc;
      here.push_back(vc);
      added.insert(vc);
      return vc;
    };
    std::unordered_set<const node*> mine(c->views.begin(), c->views.end());
    mine.insert(c->n);
    for (node* r : c->late_readers) {
      auto args = r->args();
      for (value_ref& a : args)
        if (mine.count(a.src)) a.src = copy_of(copy_of, a.src);
      g.set_args(r, std::move(args));
    }
    maybe_dead.push_back(c->n);
    maybe_dead.insert(maybe_dead.end(), c->views.begin(), c->views.end());
  }
  // The views (and nodes) nothing reads any more: later ones first, so a view read only by a
  // dead view is dead too.
  std::sort(maybe_dead.begin(), maybe_dead.end(),
            [&](const node* a, const node* b) { return g.position(a) > g.position(b); });
  std::unordered_set<const node*> dead;
  std::vector<node*> erase;
  for (node* v : maybe_dead) {
    if (dead.count(v)) continue;
    bool read = false;
    for (const node* u : v->users()) read = read || !dead.count(u);
    if (!read) {
      dead.insert(v);
      erase.push_back(v);
    }
  }
  g.erase(erase);
  std::vector<node*> order;
  order.reserve(g.size());
  for (node* nd : g.nodes()) {
    if (added.count(nd)) continue;
    if (auto it = before.find(nd); it != before.end()) order.insert(order.end(), it->second.begin(), it->second.end());
    order.push_back(nd);
  }
  restore_topological_order(g, order);
}

}  // namespace detail

CCGRAPH_DECL std::size_t recompute_pointwise(graph& g, const runtime_estimator& estimate, const recompute_options& opt) {
  CCGRAPH_CHECK(opt.max_added_time >= 0, "recompute_pointwise: max_added_time must be at least 0, got ",
                opt.max_added_time);
  if (g.size() < 3) return 0;
  std::vector<detail::recompute_candidate> cands;
  std::int64_t peak = 0;
  std::vector<std::int64_t> load(g.size(), 0);
  {
    const detail::liveness_info live(g);
    const detail::value_plan vp = detail::plan_values(g, live, opt.memory);
    peak = vp.plan.live_peak_bytes;
    if (peak == 0) return 0;
    std::vector<std::int64_t> delta(g.size() + 1, 0);
    for (const detail::pack_item& it : vp.items) {
      delta[it.first] += it.bytes;
      delta[std::min(it.last, g.size() - 1) + 1] -= it.bytes;
    }
    std::int64_t cur = 0;
    for (std::size_t t = 0; t < g.size(); ++t) load[t] = cur += delta[t];
    cands = detail::recompute_candidates(g, live, vp, estimate);
  }
  if (cands.empty()) return 0;
  double total = 0;
  for (const node* nd : g.nodes())
    if (!nd->is_collective()) total += estimate(*nd);
  double budget = opt.max_added_time * total;

  // Levels of the peak: cover every position at the current peak with candidates, tentatively;
  // once the peak is lower, keep them; when a position at the peak cannot be covered, drop the
  // tentative ones and stop. A candidate one of whose inputs is a taken value, or whose value
  // a taken one reads, is not taken: its choice assumed that value's readers unchanged.
  detail::range_max_tree tree(load);
  std::vector<char> taken(cands.size(), 0);
  std::vector<std::size_t> kept, trial;
  std::unordered_set<int> taken_values, read_values;  // of the taken candidates
  auto touches = [&](const detail::recompute_candidate& c) {
    if (read_values.count(c.value)) return true;
    for (int v : c.inputs)
      if (taken_values.count(v)) return true;
    return false;
  };
  auto mark = [&](const detail::recompute_candidate& c) {
    taken_values.insert(c.value);
    read_values.insert(c.inputs.begin(), c.inputs.end());
  };
  std::int64_t level = tree.max();
  while (true) {
    if (tree.max() < level) {
      kept.insert(kept.end(), trial.begin(), trial.end());
      trial.clear();
      level = tree.max();
    }
    const std::size_t t = tree.argmax();
    std::size_t best = cands.size();
    for (std::size_t i = 0; i < cands.size(); ++i) {
      const auto& c = cands[i];
      if (taken[i] || c.lo > t || c.hi < t || c.cost > budget || touches(c)) continue;
      if (best == cands.size()) {
        best = i;
        continue;
      }
      const auto& b = cands[best];
      if (c.bytes != b.bytes ? c.bytes > b.bytes
          : c.cost != b.cost ? c.cost < b.cost
                             : c.hi - c.lo > b.hi - b.lo)
        best = i;
    }
    if (best == cands.size()) {
      for (std::size_t i : trial) {
        taken[i] = 0;
        tree.add(cands[i].lo, cands[i].hi, cands[i].bytes);
        budget += cands[i].cost;
      }
      trial.clear();
      break;
    }
    taken[best] = 1;
    trial.push_back(best);
    mark(cands[best]);
    tree.add(cands[best].lo, cands[best].hi, -cands[best].bytes);
    budget -= cands[best].cost;
  }
  if (kept.empty()) return 0;
  std::sort(kept.begin(), kept.end(), [&](std::size_t a, std::size_t b) {
    return g.position(cands[a].n) < g.position(cands[b].n);
  });
  std::vector<const detail::recompute_candidate*> chosen;
  for (std::size_t i : kept) chosen.push_back(&cands[i]);
  // The model above says the peak goes down; the planner has the last word.
  const graph before = g;
  detail::apply_recompute(g, chosen);
  const detail::liveness_info live(g);
  if (detail::plan_values(g, live, opt.memory).plan.live_peak_bytes >= peak) {
    g = before;
    return 0;
  }
  return chosen.size();
}

}  // namespace ccgraph
