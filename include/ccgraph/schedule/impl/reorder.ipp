// ccgraph/schedule/impl/reorder.ipp: the non-template functions of
// <ccgraph/schedule/reorder.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/reorder.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL void apply_order(graph& g, const dep_graph& d, const std::vector<std::size_t>& order) {
  std::vector<node*> nodes;
  nodes.reserve(order.size());
  for (std::size_t i : order) nodes.push_back(d.nodes[i]);
  std::stable_partition(nodes.begin(), nodes.end(),
                        [](const node* n) { return !std::holds_alternative<ops::output>(n->kind()); });
  g.reorder(nodes);
}

CCGRAPH_DECL bool is_fixed(const node* n) {
  return std::holds_alternative<ops::placeholder>(n->kind()) || std::holds_alternative<ops::output>(n->kind());
}

CCGRAPH_DECL std::vector<double> node_costs(const dep_graph& d, const runtime_estimator& estimate, const char* pass) {
  std::vector<double> cost(d.size(), 0.0);
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (is_fixed(d.nodes[i])) continue;
    cost[i] = estimate(*d.nodes[i]);
    CCGRAPH_CHECK(std::isfinite(cost[i]) && cost[i] >= 0, pass, ": the run-time estimate of %", d.nodes[i]->name(),
                  " (", d.nodes[i]->op(), ") is ", cost[i], " us; estimates must be finite and not negative");
  }
  return cost;
}

CCGRAPH_DECL std::vector<std::size_t> first_dependent_collective(const dep_graph& d,
                                                           const std::vector<std::size_t>& comms) {
  const std::size_t n = d.size();
  std::vector<std::size_t> index(n, comms.size()), first(n, comms.size());
  for (std::size_t c = 0; c < comms.size(); ++c) index[comms[c]] = c;
  for (std::size_t k = n; k-- > 0;)
    for (std::size_t u : d.users[k]) first[k] = std::min({first[k], first[u], index[u]});
  return first;
}

}  // namespace detail

CCGRAPH_DECL void sink_waits(graph& g) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  std::vector<std::size_t> order;
  order.reserve(n);
  std::vector<char> pending(n, 0);  // a wait not placed yet
  std::vector<std::size_t> due;
  for (std::size_t i = 0; i < n; ++i) {
    if (d.nodes[i]->is_wait()) {
      pending[i] = 1;
      continue;
    }
    // The pending waits that i reads go just before it, by original position (tuple_sorted).
    due.clear();
    for (std::size_t j : d.inputs[i])
      if (pending[j]) due.push_back(j);
    std::sort(due.begin(), due.end());
    for (std::size_t w : due) {
      pending[w] = 0;
      order.push_back(w);
    }
    order.push_back(i);
  }
  std::vector<std::size_t> waits;  // nobody reads them
  for (std::size_t i = 0; i < n; ++i)
    if (pending[i]) waits.push_back(i);
  // Waits nobody reads stay before the output node.
  if (!waits.empty() && !order.empty() && detail::is_fixed(d.nodes[order.back()]) &&
      std::holds_alternative<ops::output>(d.nodes[order.back()]->kind())) {
    const std::size_t out = order.back();
    order.pop_back();
    order.insert(order.end(), waits.begin(), waits.end());
    order.push_back(out);
  } else {
    order.insert(order.end(), waits.begin(), waits.end());
  }
  detail::apply_order(g, d, order);
}

CCGRAPH_DECL void raise_comms(graph& g) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  std::vector<std::size_t> reversed;
  reversed.reserve(n);
  std::deque<std::size_t> comms;  // pending, front = latest in program order
  std::vector<char> pending(n, 0);
  for (std::size_t k = n; k-- > 0;) {
    if (d.nodes[k]->is_collective()) {
      comms.push_back(k);
      pending[k] = 1;
      continue;
    }
    // Pending collectives that read k go right after it, with every pending one later in
    // program order (they keep their order): pop down to the earliest reader of k.
    std::size_t earliest = n;
    for (std::size_t u : d.users[k])  // ascending: the first pending one is the earliest
      if (pending[u]) {
        earliest = u;
        break;
      }
    while (earliest < n && !comms.empty() && comms.front() >= earliest) {
      pending[comms.front()] = 0;
      reversed.push_back(comms.front());
      comms.pop_front();
    }
    reversed.push_back(k);
  }
  // Collectives with no inputs left (none read a node) go first.
  for (std::size_t c : comms) reversed.push_back(c);
  std::vector<std::size_t> order(reversed.rbegin(), reversed.rend());
  // Placeholders stay first.
  std::stable_partition(order.begin(), order.end(), [&](std::size_t i) {
    return std::holds_alternative<ops::placeholder>(d.nodes[i]->kind());
  });
  detail::apply_order(g, d, order);
}

CCGRAPH_DECL void reorder_compute_for_overlap(graph& g, const runtime_estimator& estimate) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  std::vector<std::size_t> comms;
  for (std::size_t i = 0; i < n; ++i)
    if (d.nodes[i]->is_collective()) comms.push_back(i);
  if (comms.empty()) return;
  const std::vector<double> cost = detail::node_costs(d, estimate, "reorder_compute_for_overlap");

  // Step 2 visits ready compute by the first collective that needs it, then program order: a
  // fixed order of all nodes, so a tree over it holding half of each candidate's cost (the
  // skip test) finds the next candidate that fits the time left.
  const std::vector<std::size_t> first = detail::first_dependent_collective(d, comms);
  std::vector<std::size_t> by_need(n), rank(n);
  std::iota(by_need.begin(), by_need.end(), std::size_t{0});
  std::stable_sort(by_need.begin(), by_need.end(),
                   [&](std::size_t a, std::size_t b) { return first[a] < first[b]; });
  for (std::size_t r = 0; r < n; ++r) rank[by_need[r]] = r;
  detail::first_below_tree candidates(n);

  std::vector<std::size_t> order;
  order.reserve(n);
  std::vector<int> indeg(n, 0);
  std::vector<char> scheduled(n, 0);
  bool in_step2 = false;               // step 2 only considers nodes ready when it starts
  std::vector<std::size_t> ready_later;  // nodes that became ready during step 2
  auto make_ready = [&](std::size_t i) {
    if (d.nodes[i]->is_collective()) return;  // never a candidate
    if (in_step2) ready_later.push_back(i);
    else candidates.set(rank[i], cost[i] / 2);
  };
  for (std::size_t i = 0; i < n; ++i) {
    indeg[i] = static_cast<int>(d.inputs[i].size());
    if (indeg[i] == 0) make_ready(i);
  }
  auto schedule_node = [&](std::size_t i) {
    CCGRAPH_CHECK(indeg[i] == 0 && !scheduled[i], "reorder_compute_for_overlap: %", d.nodes[i]->name(),
                  " scheduled before its inputs");
    scheduled[i] = 1;
    candidates.clear(rank[i]);
    order.push_back(i);
    for (std::size_t u : d.users[i])
      if (--indeg[u] == 0) make_ready(u);
  };
  // The unscheduled ancestors of node c, ascending. Every ancestor of a scheduled node is
  // scheduled, so the walk stops at scheduled nodes and costs only what it finds.
  std::vector<std::size_t> visited(n, n);  // visited[k] == c: found by the walk from c
  std::vector<std::size_t> stack;
  auto unscheduled_ancestors = [&](std::size_t c) {
    std::vector<std::size_t> found;
    stack.assign(d.inputs[c].begin(), d.inputs[c].end());
    while (!stack.empty()) {
      const std::size_t k = stack.back();
      stack.pop_back();
      if (scheduled[k] || visited[k] == c) continue;
      visited[k] = c;
      found.push_back(k);
      for (std::size_t j : d.inputs[k])
        if (!scheduled[j] && visited[j] != c) stack.push_back(j);
    }
    std::sort(found.begin(), found.end());
    return found;
  };

  // Graph inputs stay first, as in Inductor (they are not nodes there); then the first
  // collective and what it needs.
  for (std::size_t i = 0; i < n; ++i)
    if (std::holds_alternative<ops::placeholder>(d.nodes[i]->kind())) schedule_node(i);
  for (std::size_t i : unscheduled_ancestors(comms[0])) schedule_node(i);
  schedule_node(comms[0]);

  std::vector<char> after_prev(n, 0);  // in step 1's set: depends on the previous collective
  double rolled_over = 0;
  for (std::size_t idx = 1; idx < comms.size(); ++idx) {
    const std::size_t prev = comms[idx - 1];
    // Step 1: what the next collective needs that does not depend on the previous one. The
    // previous collective is the last node scheduled, so no scheduled node depends on it: a
    // node of the set depends on it when it reads it or a node of the set that does.
    const std::vector<std::size_t> needs = unscheduled_ancestors(comms[idx]);
    for (std::size_t i : needs) {
      after_prev[i] = 0;
      for (std::size_t j : d.inputs[i])
        if (j == prev || (!scheduled[j] && after_prev[j])) after_prev[i] = 1;
    }
    double total = rolled_over;
    for (std::size_t i : needs)
      if (!after_prev[i]) {
        total += cost[i];
        schedule_node(i);
      }
    const double prev_comm = cost[prev];
    // Step 2: more ready compute to cover the previous collective, soonest-needed first. Ready
    // nodes depending on the previous collective read it (nothing scheduled depends on it),
    // so they are held out of the candidates meanwhile.
    const double step1 = total;
    if (step1 < prev_comm) {
      std::vector<std::size_t> held;
      for (std::size_t u : d.users[prev])
        if (indeg[u] == 0 && !scheduled[u] && !d.nodes[u]->is_collective()) {
          candidates.clear(rank[u]);
          held.push_back(u);
        }
      in_step2 = true;
      // Candidates are visited in order, each once: the next one is the first after the last
      // taken whose half cost is below the time left (a node is skipped when the time left is
      // at most half its cost).
      std::size_t from = 0;
      while (!(total >= prev_comm)) {
        const std::size_t r = candidates.find(from, prev_comm - total);
        if (r == detail::first_below_tree::npos) break;
        schedule_node(by_need[r]);
        total += cost[by_need[r]];
        from = r + 1;
      }
      in_step2 = false;
      for (std::size_t u : held) make_ready(u);
      for (std::size_t u : ready_later) make_ready(u);
      ready_later.clear();
    }
    const double rollable = total - step1;
    // Step 3: the rest of what the next collective needs (exactly the nodes of step 1's set
    // that depend on the previous collective), then the collective.
    bool blocking = false;
    for (std::size_t i : needs)
      if (!scheduled[i]) {
        blocking = true;
        schedule_node(i);
      }
    schedule_node(comms[idx]);
    rolled_over = blocking ? 0 : rollable;
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!scheduled[i]) schedule_node(i);
  detail::apply_order(g, d, order);
  // Step 2 takes a ready wait as a filler (it costs nothing), which puts it before compute that
  // does not read it, and a wait blocks everything after it on the compute stream: in an FSDP
  // block (32 MiB weights, 180 us projections) every weight's wait came before the first
  // projection, which then waited for all the gathers (430 us on 2 x H200). Each wait goes
  // just before its first reader instead (Inductor runs sink_waits after this pass by default).
  sink_waits(g);
}

CCGRAPH_DECL void overlap(graph& g, const runtime_estimator& estimate, const overlap_options& opt) {
  detail::dep_graph d(g);
  const std::size_t n = d.size();
  const std::vector<double> cost = detail::node_costs(d, estimate, "overlap");
  std::vector<std::int64_t> out_bytes(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (auto& m : d.nodes[i]->metas())
      out_bytes[i] += numel_of(m.shape) * static_cast<std::int64_t>(element_size(m.dtype));
  // Longest path (by cost) from each node to the end: the classic list-scheduling priority.
  std::vector<double> level(n, 0);
  for (std::size_t k = n; k-- > 0;) {
    double best = 0;
    for (std::size_t u : d.users[k]) best = std::max(best, level[u]);
    level[k] = cost[k] + best;
  }
  std::vector<std::size_t> comms;
  for (std::size_t i = 0; i < n; ++i)
    if (d.nodes[i]->is_collective()) comms.push_back(i);
  // Collectives go in program order, so an unscheduled node is an ancestor of the next one
  // exactly when that is its first dependent collective.
  const std::vector<std::size_t> first = detail::first_dependent_collective(d, comms);
  std::vector<std::size_t> wait_of_comm(n, n);  // collective position of each wait
  for (std::size_t i = 0; i < n; ++i)
    if (d.nodes[i]->is_wait())
      for (std::size_t j : d.inputs[i])
        if (d.nodes[j]->is_collective()) wait_of_comm[i] = j;

  std::vector<int> indeg(n);
  std::vector<double> done(n, 0);
  std::vector<int> remaining_users(n);
  for (std::size_t i = 0; i < n; ++i) remaining_users[i] = static_cast<int>(d.users[i].size());
  double t_compute = 0, t_comm = 0;
  std::int64_t in_flight = 0, live = 0;
  std::size_t next_comm = 0;
  std::vector<std::size_t> order;
  order.reserve(n);
  const std::size_t output = n - 1;

  // Live memory above the limit switches to the memory order; live never exceeds the largest
  // int64, so without a limit only the level order is kept.
  const bool memory_aware = opt.memory_limit_bytes < std::numeric_limits<std::int64_t>::max();
  std::vector<std::int64_t> frees(n, 0);  // of ready nodes: bytes freed by running it, less its own
  auto compute_frees = [&](std::size_t i) {
    std::int64_t f = 0;
    for (std::size_t j : d.inputs[i])
      if (remaining_users[j] == 1) f += out_bytes[j];
    return f - out_bytes[i];
  };
  // Ready nodes by kind: compute (everything but collectives, waits and the output) and waits,
  // all of them and those the next collective needs (`for_next`); those a later collective
  // needs first wait in `needed_by` until it is next. The independent compute (ready, not
  // needed by the next collective) is also kept as a sum.
  detail::ready_set compute(level, frees, memory_aware), waits(level, frees, memory_aware),
      compute_next(level, frees, memory_aware), waits_next(level, frees, memory_aware);
  std::vector<char> ready(n, 0), for_next(n, 0), scheduled(n, 0);
  std::vector<std::vector<std::size_t>> needed_by(comms.size());
  detail::bounded_sum independent;
  auto is_compute = [&](std::size_t i) { return !d.nodes[i]->is_collective() && !d.nodes[i]->is_wait(); };
  auto add_for_next = [&](std::size_t i) {
    for_next[i] = 1;
    (is_compute(i) ? compute_next : waits_next).insert(i);
  };
  auto make_ready = [&](std::size_t i) {
    ready[i] = 1;
    if (i == output || d.nodes[i]->is_collective()) return;
    if (memory_aware) frees[i] = compute_frees(i);
    (is_compute(i) ? compute : waits).insert(i);
    if (first[i] == next_comm && next_comm < comms.size()) {
      add_for_next(i);
      return;
    }
    if (first[i] < comms.size()) needed_by[first[i]].push_back(i);
    if (is_compute(i)) independent.add(cost[i]);
  };
  auto leave_ready = [&](std::size_t i) {
    ready[i] = 0;
    if (i == output || d.nodes[i]->is_collective()) return;
    (is_compute(i) ? compute : waits).erase(i);
    if (for_next[i]) (is_compute(i) ? compute_next : waits_next).erase(i);
    else if (is_compute(i)) independent.remove(cost[i]);
    for_next[i] = 0;
  };
  // The program-order sum of the independent compute's costs, as the reference computes it.
  auto independent_in_order = [&] {
    std::vector<std::size_t> terms;
    for (std::size_t i : compute.by_level)
      if (!for_next[i]) terms.push_back(i);
    std::sort(terms.begin(), terms.end());
    double s = 0;
    for (std::size_t i : terms) s += cost[i];
    independent.reset(s);
    return s;
  };
  for (std::size_t i = 0; i < n; ++i) {
    indeg[i] = static_cast<int>(d.inputs[i].size());
    if (indeg[i] == 0) make_ready(i);
  }

  auto finish = [&](std::size_t i) {
    leave_ready(i);
    scheduled[i] = 1;
    order.push_back(i);
    double start = t_compute;
    for (std::size_t j : d.inputs[i]) start = std::max(start, done[j]);
    if (d.nodes[i]->is_collective()) {
      start = std::max(start, t_comm);
      done[i] = start + cost[i];
      t_comm = done[i];
      in_flight += out_bytes[i];
      // The next collective's unscheduled ancestors were all scheduled before it was ready, so
      // the `for_next` sets are empty; the ready nodes the new next one needs join them.
      ++next_comm;
      if (next_comm < comms.size()) {
        for (std::size_t u : needed_by[next_comm])
          if (ready[u]) {
            if (is_compute(u)) independent.remove(cost[u]);
            add_for_next(u);
          }
        needed_by[next_comm] = {};
      }
    } else {
      done[i] = start + cost[i];
      t_compute = done[i];
      if (wait_of_comm[i] < n) in_flight -= out_bytes[wait_of_comm[i]];
    }
    live += out_bytes[i];
    for (std::size_t j : d.inputs[i]) {
      if (--remaining_users[j] == 0) {
        live -= out_bytes[j];
      } else if (memory_aware && remaining_users[j] == 1) {
        // j's last reader now frees it: move that reader in the memory order if it is ready.
        for (std::size_t u : d.users[j])
          if (!scheduled[u]) {
            if (ready[u] && u != output && !d.nodes[u]->is_collective()) {
              detail::ready_set& kind = is_compute(u) ? compute : waits;
              detail::ready_set& next = is_compute(u) ? compute_next : waits_next;
              kind.by_frees.erase(u);
              if (for_next[u]) next.by_frees.erase(u);
              frees[u] += out_bytes[j];
              kind.by_frees.insert(u);
              if (for_next[u]) next.by_frees.insert(u);
            }
            break;
          }
      }
    }
    for (std::size_t u : d.users[i])
      if (--indeg[u] == 0) make_ready(u);
  };

  for (std::size_t i = 0; i < n; ++i)  // graph inputs stay first
    if (std::holds_alternative<ops::placeholder>(d.nodes[i]->kind())) finish(i);
  while (order.size() < n) {
    std::size_t choice = n;
    const bool have_next = next_comm < comms.size();
    const std::size_t nc = have_next ? comms[next_comm] : n;
    const bool by_memory = live > opt.memory_limit_bytes;
    auto best = [&](const detail::ready_set& s) { return s.by_level.empty() ? n : *s.in_order(by_memory).begin(); };
    auto finished_at = [&](std::size_t w) { return done[wait_of_comm[w] < n ? wait_of_comm[w] : w]; };
    // 1. The next collective, as soon as it can go.
    if (have_next && ready[nc] && (in_flight == 0 || in_flight + out_bytes[nc] <= opt.max_bytes_in_flight))
      choice = nc;
    // 2. A free wait that the next collective needs.
    if (choice == n && have_next)
      for (std::size_t w : waits_next.in_order(by_memory))
        if (finished_at(w) <= t_compute) {
          choice = w;
          break;
        }
    // 3. Compute the next collective needs.
    if (choice == n && have_next) choice = best(compute_next);
    // 4. Only a stalling wait blocks the next collective: take it if the stall buys more overlap.
    if (choice == n && have_next) {
      const std::size_t w = best(waits_next);
      if (w != n) {
        const double stall = std::max(0.0, finished_at(w) - t_compute);
        // The reference: gain = min(independent, cost[nc]); take w if stall < gain or
        // independent == 0 (a sum of non-negative costs is 0 only when every one is).
        bool take = independent.nonzero == 0;
        if (!take && stall < cost[nc]) {
          bool known = false;
          take = independent.below(stall, known);
          if (!known) take = stall < independent_in_order();
        }
        if (take) choice = w;
      }
    }
    // 5. Other compute.
    if (choice == n) choice = best(compute);
    // 6. The wait whose collective ends first (in issue order on one stream).
    if (choice == n) choice = best(waits);
    // 7. Anything else ready: with no compute or wait ready, a collective held back by the
    // in-flight cap, then the output.
    if (choice == n && have_next && ready[nc]) choice = nc;
    if (choice == n && ready[output]) choice = output;
    CCGRAPH_CHECK(choice != n, "overlap: no schedulable node (the graph has a cycle)");
    finish(choice);
  }
  detail::apply_order(g, d, order);
}

}  // namespace ccgraph
