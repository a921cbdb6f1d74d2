// ccgraph/schedule/impl/decompose.ipp: the non-template functions of
// <ccgraph/schedule/decompose.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/decompose.hpp>
#include <ccgraph/ir/analysis.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL row_ranges chunk_rows(std::int64_t rows, int chunks) {
  row_ranges out;
  const std::int64_t step = std::max<std::int64_t>(1, (rows + chunks - 1) / chunks);
  for (std::int64_t s = 0; s < rows; s += step) out.emplace_back(s, std::min(step, rows - s));
  return out;
}

CCGRAPH_DECL bucket_family collective_family(const node& c) {
  return visit_op(c.kind(), [](const auto& o) {
    using O = std::decay_t<decltype(o)>;
    if constexpr (op_traits<O>::category == op_category::collective) {
      require_bucketing<O>();
      return std::is_same_v<typename op_traits<O>::single_op, O> ? op_traits<O>::family : bucket_family::none;
    } else {
      return bucket_family::none;
    }
  });
}

CCGRAPH_DECL std::optional<std::vector<bool>> row_args(const node& v) {
  if (v.num_outputs() != 1 || v.shape().size() != 2 || v.shape()[0] < 2) return std::nullopt;
  // A node that draws random numbers (dropout) stays whole: chunks would draw apart.
  if (draws_random(v.kind())) return std::nullopt;
  const std::int64_t rows = v.shape()[0];
  if (std::holds_alternative<ops::matmul>(v.kind())) {
    if (v.args().size() != 2) return std::nullopt;
    for (auto& a : v.args())
      if (a.src->shape(a.index).size() != 2) return std::nullopt;
    return std::vector<bool>{true, false};
  }
  if (std::holds_alternative<ops::pointwise>(v.kind())) {
    std::vector<bool> r;
    for (auto& a : v.args()) {
      const shape_t& s = a.src->shape(a.index);
      r.push_back(s.size() == 2 && s[0] == rows);
    }
    return r;
  }
  return std::nullopt;
}

CCGRAPH_DECL std::vector<node*> row_region(const graph& g, node* top) {
  std::vector<node*> region;
  if (!row_args(*top)) return region;
  std::unordered_set<const node*> in, whole;
  std::priority_queue<std::pair<std::size_t, node*>> candidates;  // latest first
  auto take = [&](node* u) {
    region.push_back(u);
    in.insert(u);
    const std::vector<bool> rows = *row_args(*u);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      node* a = u->args()[k].src;
      if (rows[k]) candidates.emplace(g.position(a), a);
      else whole.insert(a);
    }
  };
  take(top);
  const node* last = nullptr;
  while (!candidates.empty()) {
    node* v = candidates.top().second;
    candidates.pop();
    if (v == last) continue;
    last = v;
    // Every reader of v sits later, so it has been decided by now.
    if (whole.count(v) || !row_args(*v) || v->shape()[0] != top->shape()[0]) continue;
    bool only_region_reads = true;
    for (const node* u : v->users())  // stops at the first outside reader: O(region), not O(users)
      if (!in.count(u)) {
        only_region_reads = false;
        break;
      }
    if (only_region_reads) take(v);
  }
  return region;
}

CCGRAPH_DECL std::optional<decomposition> match_rows_then_collective(const graph& g, node* c, int chunks) {
  if (c->args().size() != 1 || c->users().size() != 1 || !c->users().front()->is_wait()) return std::nullopt;
  node* y = c->args().front().src;
  if (y->users().size() != 1 || !row_args(*y)) return std::nullopt;
  const std::int64_t blocks = collective_family(*c) == bucket_family::reduce_scatter ? c->group()->size() : 1;
  if (y->shape()[0] / blocks < chunks) return std::nullopt;
  std::vector<node*> region = row_region(g, y);
  bool has_matmul = false;
  for (node* v : region) has_matmul = has_matmul || std::holds_alternative<ops::matmul>(v->kind());
  if (!has_matmul) return std::nullopt;
  return decomposition{c, c->users().front(), false, std::move(region)};
}

CCGRAPH_DECL std::optional<decomposition> match_gather_then_rows(node* ag, int chunks) {
  if (ag->args().size() != 1 || ag->users().size() != 1 || !ag->users().front()->is_wait()) return std::nullopt;
  node* w = ag->users().front();
  if (w->users().size() != 1) return std::nullopt;
  node* mm = w->users().front();
  if (!std::holds_alternative<ops::matmul>(mm->kind()) || !row_args(*mm) ||
      !(mm->args()[0] == value_ref{w, 0}) || mm->args()[1].src == w)
    return std::nullopt;
  const value_ref x = ag->args().front();
  if (x.src->shape(x.index)[0] < chunks) return std::nullopt;
  // Extend the chain through row-wise nodes that only the chain reads.
  std::vector<node*> chain{mm};
  for (node* tail = mm; tail->users().size() == 1;) {
    node* u = tail->users().front();
    const auto r = row_args(*u);
    if (!r || u->shape()[0] != mm->shape()[0]) break;
    bool ok = true;
    for (std::size_t k = 0; k < r->size(); ++k) ok = ok && ((*r)[k] == (u->args()[k].src == tail));
    if (!ok) break;
    chain.push_back(u);
    tail = u;
  }
  return decomposition{ag, w, true, std::move(chain)};
}

/// Builds one row chunk of a region: new nodes are added to the graph (at its end) and listed,
/// one after another, in `*into`, the run of nodes the pass places where the old ones were.
struct row_chunk_builder {
  graph& g;
  std::vector<node*>* into;
  std::unordered_set<const node*> region;
  row_ranges ranges;
  std::string suffix;
  std::unordered_map<const node*, value_ref> memo;

  /// Adds a node after the previous one.
  node* emit(node_op op, std::vector<value_ref> args, std::optional<group_info> grp, const std::string& hint) {
    node* v = g.add(std::move(op), std::move(args), std::move(grp), hint);
    into->push_back(v);
    return v;
  }

  /// Starts the next chunk: its rows and the suffix of its node names.
  void start(row_ranges r, int chunk) {
    ranges = std::move(r);
    suffix = "_c" + std::to_string(chunk);
    memo.clear();
  }

  /// The chunk's rows of `a`: recomputed when `a` is in the region, else narrowed (and the
  /// pieces concatenated when the chunk's rows are not contiguous).
  value_ref rows_of(value_ref a) {
    if (auto it = memo.find(a.src); it != memo.end()) return it->second;
    value_ref out;
    if (region.count(a.src)) {
      const node* v = a.src;
      const std::vector<bool> rows = *row_args(*v);
      std::vector<value_ref> args;
      for (std::size_t k = 0; k < rows.size(); ++k)
        args.push_back(rows[k] ? rows_of(v->args()[k]) : v->args()[k]);
      out = {emit(v->kind(), std::move(args), std::nullopt, v->name() + suffix), 0};
    } else {
      std::vector<value_ref> parts;
      for (auto [s, l] : ranges)
        parts.push_back({emit(ops::narrow{0, s, l}, {a}, std::nullopt, a.src->name() + suffix), 0});
      out = parts.size() == 1 ? parts[0] : value_ref{emit(ops::cat{0}, parts, std::nullopt, "cat" + suffix), 0};
    }
    memo.emplace(a.src, out);
    return out;
  }
};

CCGRAPH_DECL void decompose_rows_then_collective(graph& g, const decomposition& d, int chunks, placements& at) {
  node* c = d.collective;
  node* y = c->args().front().src;
  const std::int64_t blocks = collective_family(*c) == bucket_family::reduce_scatter ? c->group()->size() : 1;
  const std::int64_t rows = y->shape()[0] / blocks;
  row_chunk_builder b{g, &at.after[c], {d.nodes.begin(), d.nodes.end()}, {}, {}, {}};
  std::vector<node*> pieces;
  const row_ranges split = chunk_rows(rows, chunks);
  for (std::size_t i = 0; i < split.size(); ++i) {
    row_ranges r;
    for (std::int64_t blk = 0; blk < blocks; ++blk) r.emplace_back(blk * rows + split[i].first, split[i].second);
    b.start(std::move(r), static_cast<int>(i));
    const value_ref yi = b.rows_of({y, 0});
    pieces.push_back(b.emit(c->kind(), {yi}, c->group(), std::string(c->op())));
    b.g.set_source(pieces.back(), c->source());
  }
  b.into = &at.after[d.wait];
  std::vector<value_ref> waited;
  for (node* p : pieces) waited.push_back({b.emit(ops::wait_tensor{}, {{p, 0}}, std::nullopt, "wait_tensor"), 0});
  node* joined = b.emit(ops::cat{0}, std::move(waited), std::nullopt, "cat");
  g.replace_all_uses({d.wait, 0}, {joined, 0});
}

CCGRAPH_DECL void decompose_gather_then_rows(graph& g, const decomposition& d, int chunks, placements& at) {
  node* ag = d.collective;
  const value_ref x = ag->args().front();
  const std::int64_t ranks = ag->group()->size();
  const std::int64_t rows = x.src->shape(x.index)[0];
  const std::vector<node*>& chain = d.nodes;
  node* tail = chain.back();

  row_chunk_builder b{g, &at.after[ag], {}, {}, {}, {}};
  const row_ranges split = chunk_rows(rows, chunks);
  std::vector<node*> gathers;
  for (std::size_t i = 0; i < split.size(); ++i) {
    b.start({split[i]}, static_cast<int>(i));
    const value_ref xi = b.rows_of(x);
    gathers.push_back(b.emit(ag->kind(), {xi}, ag->group(), std::string(ag->op())));
    b.g.set_source(gathers.back(), ag->source());
  }
  b.into = &at.after[tail];
  std::vector<node*> results;
  for (std::size_t i = 0; i < split.size(); ++i) {
    const std::string suffix = "_c" + std::to_string(i);
    node* prev_old = d.wait;
    node* prev_new = b.emit(ops::wait_tensor{}, {{gathers[i], 0}}, std::nullopt, "wait_tensor");
    for (node* v : chain) {
      std::vector<value_ref> args = v->args();
      for (auto& a : args)
        if (a.src == prev_old) a = {prev_new, 0};
      prev_new = b.emit(v->kind(), std::move(args), std::nullopt, v->name() + suffix);
      prev_old = v;
    }
    results.push_back(prev_new);
  }
  std::vector<value_ref> parts;
  for (std::int64_t r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < split.size(); ++i) {
      const std::int64_t len = split[i].second;
      parts.push_back({b.emit(ops::narrow{0, r * len, len}, {{results[i], 0}}, std::nullopt,
                              results[i]->name() + "_r" + std::to_string(r)),
                       0});
    }
  node* joined = b.emit(ops::cat{0}, std::move(parts), std::nullopt, "cat");
  g.replace_all_uses({tail, 0}, {joined, 0});
}

CCGRAPH_DECL std::vector<double> compute_before(const graph& g, const runtime_estimator& estimate) {
  const auto& nodes = g.nodes();
  std::vector<double> sum(nodes.size() + 1, 0.0);
  for (std::size_t p = 0; p < nodes.size(); ++p) {
    const node* v = nodes[p];
    const bool compute = !v->is_collective() && !v->is_wait() && !std::holds_alternative<ops::output>(v->kind());
    sum[p + 1] = sum[p] + (compute ? estimate(*v) : 0.0);
  }
  return sum;
}

CCGRAPH_DECL bool hidden_by_compute_beside(const graph& g, const node& c, const std::vector<double>& before,
                                           const runtime_estimator& estimate) {
  // The first reader of the collective's result: of its waits' results (or its own outputs).
  std::size_t first = g.size();
  for (const node* u : c.users()) {
    if (!u->is_wait()) {
      first = std::min(first, g.position(u));
      continue;
    }
    for (const node* r : u->users()) first = std::min(first, g.position(r));
  }
  // From its latest input's producer on: where raise_comms can issue it (order is program
  // order here: the passes that move collectives run after this one).
  std::size_t from = 0;
  for (const value_ref& a : c.args()) from = std::max(from, g.position(a.src) + 1);
  const double beside = first > from ? before[first] - before[from] : 0.0;
  return beside >= estimate(c);
}

CCGRAPH_DECL bool decomposable(const node& c) {
  const bool kind = c.is_collective() && c.args().size() == 1 && collective_family(c) != bucket_family::none;
  return kind && c.args().size() == 1 && c.args().front().src->shape(c.args().front().index).size() == 2;
}

}  // namespace detail

CCGRAPH_DECL void decompose_matmul_collectives(graph& g, int chunks, rank_context* ctx) {
  decompose_matmul_collectives(g, decompose_options{.chunks = chunks}, ctx);
}

CCGRAPH_DECL void decompose_matmul_collectives(graph& g, const decompose_options& opt, rank_context* ctx) {
  const int chunks = opt.chunks;
  // A value nothing reads (a view tracing left behind) would count as a second reader of the
  // matmul it views and keep that matmul whole. (Collectives are never removed: every member
  // still sees the same ones.)
  eliminate_dead_code(g);
  const std::vector<node*> nodes = g.nodes();
  const std::size_t n = nodes.size();
  std::vector<node*> comms;
  for (node* v : nodes)
    if (v->is_collective()) comms.push_back(v);
  std::vector<detail::group_facts> groups = detail::groups_of(comms);

  // This rank's matches, in program order; a match sharing a node with an earlier one is left
  // out (the earlier rewrite replaces that node).
  std::vector<std::optional<detail::decomposition>> found(comms.size());
  std::vector<char> claimed(n, 0);  // by position
  const std::vector<double> before = opt.only_exposed ? detail::compute_before(g, opt.only_exposed) : std::vector<double>{};
  for (std::size_t i = 0; i < comms.size() && chunks >= 2; ++i) {
    node* c = comms[i];
    if (!detail::decomposable(*c)) continue;
    if (opt.only_exposed && detail::hidden_by_compute_beside(g, *c, before, opt.only_exposed)) continue;
    found[i] = detail::collective_family(*c) == bucket_family::all_gather
                   ? detail::match_gather_then_rows(c, chunks)
                   : detail::match_rows_then_collective(g, c, chunks);
    if (!found[i]) continue;
    bool shared = false;
    found[i]->for_each_replaced([&](node* v) { shared = shared || claimed[g.position(v)]; });
    if (shared) found[i].reset();
    else found[i]->for_each_replaced([&](node* v) { claimed[g.position(v)] = 1; });
  }
  // Per group: for each member, 1 where this rank cannot split it (agreed: where some member cannot).
  for (detail::group_facts& gf : groups) {
    for (std::size_t i : gf.members) gf.proposes = gf.proposes || detail::decomposable(*comms[i]);
    if (!gf.proposes) continue;
    for (std::size_t i : gf.members) gf.facts.push_back(found[i] ? 0 : 1);
    if (ctx) gf.hash = detail::collectives_hash(comms, gf.members, "decompose_matmul_collectives", {chunks, opt.only_exposed ? 1 : 0});
  }
  detail::agree_on_groups(ctx, "decompose_matmul_collectives", groups);

  detail::placements at;
  std::vector<node*> replaced;
  for (const detail::group_facts& gf : groups)
    for (std::size_t j = 0; j < gf.members.size(); ++j)
      if (!gf.proposes || !gf.agreed || gf.facts[j] != 0) found[gf.members[j]].reset();
  for (std::size_t i = 0; i < comms.size(); ++i) {
    if (!found[i]) continue;
    const detail::decomposition& d = *found[i];
    if (d.gather) detail::decompose_gather_then_rows(g, d, chunks, at);
    else detail::decompose_rows_then_collective(g, d, chunks, at);
    d.for_each_replaced([&](node* v) { replaced.push_back(v); });
  }
  if (replaced.empty()) return;
  // New nodes where the nodes they replace were (a rewrite's nodes read only nodes before
  // them), then the replaced nodes go.
  std::vector<char> gone(n, 0);
  for (node* v : replaced) gone[g.position(v)] = 1;
  std::vector<node*> preferred;
  preferred.reserve(g.size() - replaced.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (!gone[i]) preferred.push_back(nodes[i]);
    if (auto it = at.after.find(nodes[i]); it != at.after.end())
      preferred.insert(preferred.end(), it->second.begin(), it->second.end());
  }
  g.erase(replaced);
  detail::restore_topological_order(g, preferred);
}

}  // namespace ccgraph
