// ccgraph/schedule/impl/memory_plan.ipp: the non-template functions of
// <ccgraph/schedule/memory_plan.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/memory_plan.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::int64_t value_bytes(const tensor_meta& m) {
  return numel_of(m.shape) * static_cast<std::int64_t>(element_size(m.dtype));
}

CCGRAPH_DECL layout view_layout(const node& n, const layout& in) {
  return visit_op(n.kind(), [&](const auto& o) -> layout {
    using O = std::decay_t<decltype(o)>;
    constexpr alias_kind a = op_traits<O>::aliasing;
    if constexpr (a == alias_kind::view || a == alias_kind::view_or_copy) {
      require_apply_view<O>();
      return op_traits<O>::apply_view(o, in);
    } else {
      CCGRAPH_CHECK(a == alias_kind::identity, "memory_plan: %", n.name(), " (", O::name, ") is not a view");
      return in;
    }
  });
}

CCGRAPH_DECL bool aliases_input(const node& n) {
  const alias_kind a = aliasing_of(n.kind());
  return a == alias_kind::view || a == alias_kind::view_or_copy || a == alias_kind::identity;
}

CCGRAPH_DECL bool copies(const node& n, const layout& in) {
  return aliasing_of(n.kind()) == alias_kind::view_or_copy && !in.is_contiguous();
}

// Out of line: its std::stable_sort is instantiated here once, not in every unit.
CCGRAPH_DECL interval_index::interval_index(const std::vector<pack_item>& items) : first_(items.size()) {
  std::size_t positions = 1;
  for (const pack_item& it : items) positions = std::max(positions, it.last + 1);
  while (leaves_ < positions) leaves_ *= 2;
  std::vector<std::size_t> count(2 * leaves_, 0);
  for (const pack_item& it : items) cover(it, [&](std::size_t k) { ++count[k]; });
  begin_.assign(2 * leaves_ + 1, 0);
  for (std::size_t k = 0; k < 2 * leaves_; ++k) begin_[k + 1] = begin_[k] + count[k];
  listed_.resize(begin_.back());
  std::vector<std::size_t> fill(begin_.begin(), begin_.end() - 1);
  for (std::size_t i = 0; i < items.size(); ++i) cover(items[i], [&](std::size_t k) { listed_[fill[k]++] = i; });
  by_first_.resize(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) by_first_[i] = i;
  std::stable_sort(by_first_.begin(), by_first_.end(),
                   [&](std::size_t a, std::size_t b) { return items[a].first < items[b].first; });
  for (std::size_t r = 0; r < items.size(); ++r) first_[r] = items[by_first_[r]].first;
}

CCGRAPH_DECL std::pair<std::vector<std::int64_t>, std::int64_t> pack(const std::vector<pack_item>& items,
                                                               const interval_index& index,
                                                               const std::vector<std::size_t>& order,
                                                               bool best_fit, std::int64_t alignment) {
  std::vector<std::int64_t> off(items.size(), 0);
  std::vector<char> placed(items.size(), 0);
  std::int64_t arena = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> taken;
  for (std::size_t i : order) {
    const pack_item& it = items[i];
    if (it.bytes == 0) continue;
    taken.clear();
    auto add = [&](std::size_t j) {
      if (placed[j]) taken.emplace_back(off[j], off[j] + items[j].bytes);
    };
    index.live_at(it.first, add);
    index.starting_in(it.first, it.last, add);
    std::sort(taken.begin(), taken.end());
    std::int64_t cur = 0, best = -1, best_gap = std::numeric_limits<std::int64_t>::max();
    for (auto& [lo, hi] : taken) {
      if (lo > cur) {
        const std::int64_t gap = lo - cur;
        if (gap >= it.bytes && gap < best_gap) {
          best = cur;
          best_gap = gap;
          if (!best_fit) break;
        }
      }
      cur = std::max(cur, hi);
    }
    off[i] = best >= 0 ? best : align_up(cur, alignment);
    arena = std::max(arena, off[i] + it.bytes);
    placed[i] = 1;
  }
  return {std::move(off), arena};
}

CCGRAPH_DECL std::vector<std::size_t> breadth_order(const std::vector<pack_item>& items, const interval_index& index,
                                              std::size_t positions) {
  std::vector<std::int64_t> load(positions + 1, 0);
  for (const pack_item& it : items)
    if (it.first < positions) {
      load[it.first] += it.bytes;
      load[std::min(it.last, positions - 1) + 1] -= it.bytes;
    }
  for (std::size_t t = 1; t < positions; ++t) load[t] += load[t - 1];
  std::vector<std::size_t> pos(positions);
  for (std::size_t t = 0; t < positions; ++t) pos[t] = t;
  std::stable_sort(pos.begin(), pos.end(), [&](std::size_t a, std::size_t b) { return load[a] > load[b]; });
  std::vector<std::size_t> order;
  order.reserve(items.size());
  std::vector<char> seen(items.size(), 0), consumed(index.nodes(), 0);
  std::vector<std::size_t> here;
  for (std::size_t t : pos) {
    // Every item a tree node lists is live at each position under it: once a node has been
    // visited, its items are all ordered.
    here.clear();
    index.take_live_at(t, consumed, [&](std::size_t i) {
      if (!seen[i]) {
        seen[i] = 1;
        here.push_back(i);
      }
    });
    std::sort(here.begin(), here.end(), [&](std::size_t a, std::size_t b) {
      return items[a].bytes != items[b].bytes ? items[a].bytes > items[b].bytes : a < b;
    });
    order.insert(order.end(), here.begin(), here.end());
  }
  for (std::size_t i = 0; i < items.size(); ++i)
    if (!seen[i]) order.push_back(i);
  return order;
}

CCGRAPH_DECL std::pair<std::vector<std::int64_t>, std::int64_t> pack_sweep(const std::vector<pack_item>& items,
                                                                     bool backward, std::int64_t alignment) {
  const std::size_t m = items.size();
  std::size_t horizon = 0;
  for (const pack_item& it : items) horizon = std::max(horizon, it.last);
  // Times in the sweep's direction: an item lives over [start, finish].
  auto start = [&](std::size_t i) { return backward ? horizon - items[i].last : items[i].first; };
  auto finish = [&](std::size_t i) { return backward ? horizon - items[i].first : items[i].last; };
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < m; ++i)
    if (items[i].bytes > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (start(a) != start(b)) return start(a) < start(b);
    if (items[a].bytes != items[b].bytes) return items[a].bytes > items[b].bytes;
    return a < b;
  });
  std::vector<std::int64_t> off(m, 0);
  std::int64_t arena = 0;
  std::map<std::int64_t, std::int64_t> live;                  // offset -> end, of the placed live items
  std::set<std::pair<std::int64_t, std::int64_t>> gaps;       // (size, offset) of the holes between them
  using ending = std::pair<std::size_t, std::size_t>;          // (finish, item)
  std::priority_queue<ending, std::vector<ending>, std::greater<>> ends;
  auto release = [&](std::size_t j) {
    const auto it = live.find(off[j]);
    const std::int64_t lo = it == live.begin() ? 0 : std::prev(it)->second;
    const auto next = std::next(it);
    if (it->first > lo) gaps.erase({it->first - lo, lo});
    if (next != live.end()) {
      if (next->first > it->second) gaps.erase({next->first - it->second, it->second});
      gaps.insert({next->first - lo, lo});
    }
    live.erase(it);
  };
  for (std::size_t i : order) {
    while (!ends.empty() && ends.top().first < start(i)) {
      release(ends.top().second);
      ends.pop();
    }
    const std::int64_t bytes = items[i].bytes;
    const auto g = gaps.lower_bound({bytes, std::numeric_limits<std::int64_t>::min()});
    if (g != gaps.end()) {
      const auto [size, at] = *g;
      gaps.erase(g);
      off[i] = at;
      if (size > bytes) gaps.insert({size - bytes, at + bytes});
    } else {
      const std::int64_t top = live.empty() ? 0 : live.rbegin()->second;
      off[i] = align_up(top, alignment);
      if (off[i] > top) gaps.insert({off[i] - top, top});
    }
    live.emplace(off[i], off[i] + bytes);
    ends.push({finish(i), i});
    arena = std::max(arena, off[i] + bytes);
  }
  return {std::move(off), arena};
}

CCGRAPH_DECL std::uint64_t overlapping_pairs(const std::vector<pack_item>& items) {
  std::vector<std::size_t> firsts, lasts;
  for (const pack_item& it : items) {
    firsts.push_back(it.first);
    lasts.push_back(it.last);
  }
  std::sort(firsts.begin(), firsts.end());
  std::sort(lasts.begin(), lasts.end());
  std::uint64_t pairs = 0;
  for (const pack_item& it : items) {
    // Items starting by this one's end, less those ended before it starts.
    const auto started = std::upper_bound(firsts.begin(), firsts.end(), it.last) - firsts.begin();
    const auto ended = std::lower_bound(lasts.begin(), lasts.end(), it.first) - lasts.begin();
    pairs += static_cast<std::uint64_t>(started - ended);
  }
  return pairs;
}

CCGRAPH_DECL std::int64_t peak_load(const std::vector<pack_item>& items, std::size_t positions) {
  std::vector<std::int64_t> delta(positions + 1, 0);
  for (auto& it : items) {
    delta[it.first] += it.bytes;
    delta[it.last + 1] -= it.bytes;
  }
  std::int64_t cur = 0, peak = 0;
  for (std::size_t t = 0; t < positions; ++t) peak = std::max(peak, cur += delta[t]);
  return peak;
}

CCGRAPH_DECL std::vector<std::size_t> in_place_update_sites(const graph& g, const liveness_info& live,
                                                      const std::vector<input_update>& updates) {
  const auto& nodes = g.nodes();
  const std::size_t n = nodes.size();
  std::vector<std::size_t> site(updates.size(), n);
  const node* out = g.output_node();
  if (!out || updates.empty()) return site;
  const std::vector<node*> inputs = g.placeholders();
  // Per position: the input whose memory output 0 is (the placeholder, views and waits of
  // it, transitively), or -1, and the value (position, output) that output 0 is a view or wait
  // of (itself otherwise). A view_or_copy that copies counts as a view (its read is then counted
  // until its readers' ends: later than needed, never earlier).
  using value_at = std::pair<std::size_t, int>;
  std::vector<int> root(n, -1);
  std::vector<value_at> base(n);
  for (std::size_t p = 0; p < n; ++p) {
    const node* nd = nodes[p];
    base[p] = {p, 0};
    if (const auto* ph = std::get_if<ops::placeholder>(&nd->kind())) {
      root[p] = ph->index;
    } else if (aliases_input(*nd) && !nd->args().empty()) {
      const value_ref& a = nd->args()[0];
      const std::size_t q = g.position(a.src);
      if (a.index == 0) {
        root[p] = root[q];
        base[p] = base[q];
      } else {
        base[p] = {q, a.index};  // a view of another output of a node of several
      }
    }
  }
  // Per value: how many results are it or a view or wait of it.
  std::vector<std::vector<int>> returned(n);
  for (const value_ref& x : out->args()) {
    const value_at b = x.index == 0 ? base[g.position(x.src)] : value_at{g.position(x.src), x.index};
    std::vector<int>& r = returned[b.first];
    if (r.size() <= static_cast<std::size_t>(b.second)) r.resize(static_cast<std::size_t>(b.second) + 1, 0);
    ++r[static_cast<std::size_t>(b.second)];
  }
  // Per input: the last position reading its old value other than through a direct read of
  // the placeholder by an elementwise node, and the nodes reading it directly.
  const std::size_t none = n;
  std::vector<std::size_t> last_other(inputs.size(), none);
  auto later = [&](std::size_t& at, std::size_t e) { at = at == none ? e : std::max(at, e); };
  for (std::size_t p = 0; p < n; ++p) {
    const int r = root[p];
    if (r < 0 || static_cast<std::size_t>(r) >= inputs.size()) continue;
    const bool is_placeholder = nodes[p] == inputs[static_cast<std::size_t>(r)];
    for (const node* rd : live.readers(p, 0)) {
      if (is_placeholder && elementwise_of(rd->kind())) continue;  // checked per site
      later(last_other[static_cast<std::size_t>(r)], live.read_end(rd));
    }
  }
  for (std::size_t a = 0; a < updates.size(); ++a) {
    const input_update& u = updates[a];
    if (u.input >= inputs.size() || u.output >= out->args().size()) continue;
    const value_ref res = out->args()[u.output];
    const node* nd = res.src;
    const node* ph = inputs[u.input];
    if (!elementwise_of(nd->kind())) continue;
    if (nd->meta(res.index) != ph->meta()) continue;
    const std::size_t p = g.position(nd);
    // Returned once, and no view of it returned (it would hand out the input's memory).
    const std::vector<int>& r = returned[p];
    if (r.size() <= static_cast<std::size_t>(res.index) || r[static_cast<std::size_t>(res.index)] != 1) continue;
    // Every other read of the old value ends before p.
    if (last_other[u.input] != none && last_other[u.input] >= p) continue;
    // Direct reads of the placeholder by elementwise nodes: each before p, or p itself.
    bool ok = true;
    for (const node* rd : live.readers(g.position(ph), 0))
      if (elementwise_of(rd->kind()) && rd != nd && live.read_end(rd) >= p) ok = false;
    // p reads no view of the input (another element than its own).
    for (const value_ref& x : nd->args())
      if (x.src != ph && root[g.position(x.src)] == static_cast<int>(u.input)) ok = false;
    if (ok) site[a] = p;
  }
  return site;
}

CCGRAPH_DECL void place_in_parents(memory_plan& plan) {
  // A parent comes after its members: from the last buffer down, each parent is placed first.
  for (std::size_t b = plan.buffers.size(); b-- > 0;) {
    planned_buffer& buf = plan.buffers[b];
    if (buf.parent >= 0) buf.offset = plan.buffers[static_cast<std::size_t>(buf.parent)].offset + buf.offset_in_parent;
  }
}

CCGRAPH_DECL value_plan plan_values(const graph& g, const liveness_info& live, const memory_plan_options& opt) {
  const auto& nodes = g.nodes();
  const std::size_t n = nodes.size();
  value_plan vp;
  memory_plan& plan = vp.plan;
  plan.alignment = opt.alignment;
  plan.num_nodes = n;
  plan.buffer_of.resize(n);

  // Per value: its producer (the value that allocated its bytes, -1 external) and its layout
  // in the producer's buffer. Per producer: its aliases; per buffer: its producers.
  std::vector<planned_producer>& producers = vp.producers;
  std::vector<std::vector<int>>& producer_of = vp.producer_of;
  producer_of.resize(n);
  std::vector<std::vector<detail::layout>> layout_of(n);
  std::vector<std::vector<int>> buffer_producers;

  // Per buffer, the two distinct readers (of all its values' aliases so far) that read it
  // longest: what a steal asks ("does any node but this all_reduce still read the buffer
  // then?") in constant time, where listing every alias's readers costs a steal chain's length.
  struct latest_readers {
    std::size_t end1 = 0, end2 = 0;  // read_end + 1 (0: none)
    const node *r1 = nullptr, *r2 = nullptr;
    void add(std::size_t e, const node* r) {
      ++e;
      if (r == r1) {
        end1 = std::max(end1, e);
      } else if (r == r2) {
        end2 = std::max(end2, e);
        if (end2 > end1) std::swap(end1, end2), std::swap(r1, r2);
      } else if (e > end1) {
        end2 = end1, r2 = r1;
        end1 = e, r1 = r;
      } else if (e > end2) {
        end2 = e, r2 = r;
      }
    }
    /// Whether a reader other than `me` reads until `p` or later.
    bool read_at_or_after(std::size_t p, const node* me) const { return (r1 != me ? end1 : end2) > p; }
  };
  std::vector<latest_readers> buffer_readers;
  auto add_alias = [&](int id, value_ref v) {
    planned_producer& pr = producers[static_cast<std::size_t>(id)];
    pr.aliases.push_back(v);
    if (buffer_readers.size() <= static_cast<std::size_t>(pr.buffer)) buffer_readers.resize(static_cast<std::size_t>(pr.buffer) + 1);
    for (const node* r : live.readers(v)) buffer_readers[static_cast<std::size_t>(pr.buffer)].add(live.read_end(r), r);
  };
  auto new_producer = [&](const node* nd, std::size_t p, int k, int buffer) {
    const int id = static_cast<int>(producers.size());
    producers.push_back({{p, k, detail::ref_str({const_cast<node*>(nd), k})}, nd->meta(k), buffer, {}});
    if (buffer < 0) {
      buffer = static_cast<int>(buffer_producers.size());
      buffer_producers.emplace_back();
      producers.back().buffer = buffer;
    }
    buffer_producers[static_cast<std::size_t>(buffer)].push_back(id);
    producer_of[p][static_cast<std::size_t>(k)] = id;
    layout_of[p][static_cast<std::size_t>(k)] = detail::contiguous_layout(nd->shape(k));
    add_alias(id, {const_cast<node*>(nd), k});
    return id;
  };

  // Per buffer: the elided cat's buffer it is laid out in and its byte offset there (-1: none).
  std::vector<std::pair<int, std::int64_t>> parent_of;
  // Whether cat `nd` at p can have its inputs laid out in its output, and where (byte offsets
  // into it, in `slices`; their buffers in `members`). It can when it joins along its outermost
  // dim of more than one element (every input is then one contiguous block of the output), and
  // each input is the whole of a planned buffer of its own (no view of a part, no graph input),
  // of the cat's dtype, in no other cat's output, read by nothing but this cat from here on
  // (so moving it changes no other reader, and no later all_reduce reduces into it), and
  // starting at a multiple of the alignment.
  auto elidable = [&](const node* nd, std::size_t p, std::int64_t dim, std::vector<int>& members,
                      std::vector<std::int64_t>& slices) {
    const shape_t& s = nd->shape();
    const auto rank = static_cast<std::int64_t>(s.size());
    const std::int64_t d = dim < 0 ? dim + rank : dim;
    if (d < 0 || d >= rank || nd->args().size() < 2) return false;
    for (std::int64_t k = 0; k < d; ++k)
      if (s[static_cast<std::size_t>(k)] != 1) return false;
    std::int64_t at = 0;
    for (const value_ref& a : nd->args()) {
      const std::size_t q = g.position(a.src);
      const int src = producer_of[q][static_cast<std::size_t>(a.index)];
      if (src < 0) return false;
      const planned_producer& pr = producers[static_cast<std::size_t>(src)];
      const detail::layout& l = layout_of[q][static_cast<std::size_t>(a.index)];
      if (!l.is_contiguous() || l.storage_offset() != 0 || numel_of(l.shape()) != numel_of(pr.meta.shape) ||
          pr.meta.dtype != nd->dtype())
        return false;
      const int b = pr.buffer;
      if (parent_of.size() > static_cast<std::size_t>(b) && parent_of[static_cast<std::size_t>(b)].first >= 0)
        return false;
      if (std::find(members.begin(), members.end(), b) != members.end()) return false;
      if (buffer_readers[static_cast<std::size_t>(b)].read_at_or_after(p, nd)) return false;
      if (at % opt.alignment != 0) return false;
      members.push_back(b);
      slices.push_back(at);
      at += detail::value_bytes(pr.meta);
    }
    return true;
  };

  // Updated results computed straight into their inputs: the caller's memory, like the
  // inputs themselves (no buffer; views of them are never planned either). Per position, the
  // (output, update) pairs of its outputs written so.
  std::vector<std::vector<std::pair<int, int>>> update_at(n);
  if (const node* out = g.output_node()) {
    const std::vector<std::size_t> sites = in_place_update_sites(g, live, opt.update_inputs);
    for (std::size_t a = 0; a < sites.size(); ++a)
      if (sites[a] < n)
        update_at[sites[a]].push_back({out->args()[opt.update_inputs[a].output].index, static_cast<int>(a)});
  }
  auto update_of = [&](std::size_t p, int k) {
    for (const auto& [out_k, a] : update_at[p])
      if (out_k == k) return a;
    return -1;
  };

  for (std::size_t p = 0; p < n; ++p) {
    const node* nd = nodes[p];
    const auto outs = static_cast<std::size_t>(nd->num_outputs());
    producer_of[p].assign(outs, -1);
    plan.buffer_of[p].assign(outs, -1);
    layout_of[p].assign(outs, detail::layout(nullptr, {0}, {1}, 0));
    if (aliasing_of(nd->kind()) == alias_kind::external || outs == 0) continue;
    for (std::size_t k = 0; k < outs; ++k)
      if (const int a = update_of(p, static_cast<int>(k)); a >= 0)
        plan.updates_in_place.push_back({{p, static_cast<int>(k), detail::ref_str({const_cast<node*>(nd), static_cast<int>(k)})},
                                         opt.update_inputs[static_cast<std::size_t>(a)]});
    if (update_at[p].size() == outs) continue;  // every output written into an input
    if (detail::aliases_input(*nd)) {
      const value_ref in = nd->args().at(0);
      const std::size_t q = g.position(in.src);
      const int src = producer_of[q][static_cast<std::size_t>(in.index)];
      if (src < 0) continue;  // derived from a graph input: the caller's memory, never planned
      const detail::layout& l = layout_of[q][static_cast<std::size_t>(in.index)];
      if (!nd->is_wait() && detail::copies(*nd, l)) {
        new_producer(nd, p, 0, -1);
        continue;
      }
      producer_of[p][0] = src;
      layout_of[p][0] = nd->is_wait() ? l : detail::view_layout(*nd, l);
      add_alias(src, {const_cast<node*>(nd), 0});
      continue;
    }
    if (const auto* c = std::get_if<ops::cat>(&nd->kind()); c && opt.elide_cats && outs == 1) {
      std::vector<int> members;
      std::vector<std::int64_t> slices;
      if (elidable(nd, p, c->dim, members, slices)) {
        const int id = new_producer(nd, p, 0, -1);
        const int buffer = producers[static_cast<std::size_t>(id)].buffer;
        parent_of.resize(buffer_producers.size(), {-1, 0});
        for (std::size_t j = 0; j < members.size(); ++j)
          parent_of[static_cast<std::size_t>(members[j])] = {buffer, slices[j]};
        plan.elided_cats.push_back({p, std::move(slices)});
        continue;
      }
    }
    const bool reduces = in_place_input_of(nd->kind());  // may write output k into input k
    // How many of nd's arguments live in each buffer (a steal needs exactly one).
    std::vector<int> arg_buffers;
    if (opt.steal && reduces) {
      for (auto& a : nd->args()) {
        const int s = producer_of[g.position(a.src)][static_cast<std::size_t>(a.index)];
        if (s >= 0) arg_buffers.push_back(producers[static_cast<std::size_t>(s)].buffer);
      }
      std::sort(arg_buffers.begin(), arg_buffers.end());
    }
    for (std::size_t k = 0; k < outs; ++k) {
      int steal_from = -1;
      if (opt.steal && reduces) {
        const value_ref in = nd->args().at(k);
        const std::size_t q = g.position(in.src);
        const int src = producer_of[q][static_cast<std::size_t>(in.index)];
        const detail::layout& l = layout_of[q][static_cast<std::size_t>(in.index)];
        if (src >= 0 && l.is_contiguous() && l.storage_offset() == 0 &&
            numel_of(l.shape()) == numel_of(producers[static_cast<std::size_t>(src)].meta.shape) &&
            producers[static_cast<std::size_t>(src)].meta.dtype == nd->dtype(static_cast<int>(k))) {
          const int buffer = producers[static_cast<std::size_t>(src)].buffer;
          const auto [lo, hi] = std::equal_range(arg_buffers.begin(), arg_buffers.end(), buffer);
          const bool ok = hi - lo == 1 && !buffer_readers[static_cast<std::size_t>(buffer)].read_at_or_after(p, nd);
          if (ok) steal_from = buffer;
        }
      }
      if (update_of(p, static_cast<int>(k)) < 0) new_producer(nd, p, static_cast<int>(k), steal_from);
    }
  }

  // Lifetimes: of each producer (the unplanned model), and of each buffer (the union of its
  // producers', which a steal makes contiguous in time).
  std::vector<detail::pack_item> naive;
  for (auto& pr : producers) {
    std::size_t last = pr.value.position;
    bool out = false;
    for (const value_ref& v : pr.aliases)
      for (const node* r : live.readers(v)) {
        last = std::max(last, live.read_end(r));
        out = out || std::holds_alternative<ops::output>(r->kind());
      }
    const std::int64_t bytes = detail::align_up(detail::value_bytes(pr.meta), opt.alignment);
    naive.push_back({bytes, pr.value.position, last});
    plan.total_bytes += bytes;
    if (pr.buffer >= static_cast<int>(plan.buffers.size())) plan.buffers.resize(static_cast<std::size_t>(pr.buffer) + 1);
    planned_buffer& b = plan.buffers[static_cast<std::size_t>(pr.buffer)];
    if (b.values.empty()) {
      b.first = pr.value.position;
      b.last = last;
      b.bytes = bytes;
    }
    b.last = std::max(b.last, last);
    b.is_output = b.is_output || out;
    b.values.push_back(pr.value);
    plan.buffer_of[pr.value.position][static_cast<std::size_t>(pr.value.index)] = pr.buffer;
  }

  // A buffer laid out in an elided cat's output: the cat's buffer lives from the first of its
  // slices' writes (a parent comes after its members, so one pass in order reaches nested cats'
  // outermost buffer), and only the parent takes room in the arena.
  parent_of.resize(plan.buffers.size(), {-1, 0});
  for (std::size_t b = 0; b < plan.buffers.size(); ++b) {
    const auto [parent, at] = parent_of[b];
    if (parent < 0) continue;
    planned_buffer& child = plan.buffers[b];
    planned_buffer& outer = plan.buffers[static_cast<std::size_t>(parent)];
    child.parent = parent;
    child.offset_in_parent = at;
    outer.first = std::min(outer.first, child.first);
    outer.last = std::max(outer.last, child.last);
  }
  std::vector<detail::pack_item>& items = vp.items;
  for (auto& b : plan.buffers) items.push_back({b.parent >= 0 ? 0 : b.bytes, b.first, b.last});
  plan.unplanned_peak_bytes = detail::peak_load(naive, n);
  plan.live_peak_bytes = detail::peak_load(items, n);
  return vp;
}

}  // namespace detail

CCGRAPH_DECL memory_plan plan_memory(const graph& g, const memory_plan_options& opt) {
  CCGRAPH_CHECK(opt.alignment >= 8 && (opt.alignment & (opt.alignment - 1)) == 0,
                "plan_memory: alignment must be a power of two of at least 8, got ", opt.alignment);
  const std::size_t n = g.size();
  const detail::liveness_info live(g);
  detail::value_plan vp = detail::plan_values(g, live, opt);
  memory_plan plan = std::move(vp.plan);
  const std::vector<detail::pack_item>& items = vp.items;

  // Pack with several orders; keep the smallest arena (the first on ties: deterministic).
  // Packing is NP-hard (dynamic storage allocation) and live_peak_bytes is only a lower bound,
  // so when no fixed order reaches it, seeded random orders (size times a random power of the
  // lifetime) are tried within a budget. Each packing costs O(m log m + k log k) for m buffers
  // of which k are live at once (the interval index finds a buffer's neighbours in time).
  const std::size_t m = items.size();
  // Packing in an arbitrary order costs O(m + k) per buffer for the k buffers live at some time
  // with it: fine while few are live at once, quadratic when thousands are. Past a budget of
  // O(m log m) such pairs, the plan takes the better of two sweeps over time instead (best fit
  // as buffers start, forward and backward), each O(m log m).
  const double log_m = std::log2(static_cast<double>(m) + 2);
  const double budget = std::max(double(1 << 20), 16.0 * static_cast<double>(m) * log_m);
  if (static_cast<double>(detail::overlapping_pairs(items)) > budget) {
    auto [off, arena] = detail::pack_sweep(items, false, opt.alignment);
    if (arena > plan.live_peak_bytes) {
      auto [off2, arena2] = detail::pack_sweep(items, true, opt.alignment);
      if (arena2 < arena) off = std::move(off2), arena = arena2;
    }
    for (std::size_t i = 0; i < m; ++i) plan.buffers[i].offset = off[i];
    plan.arena_bytes = arena;
    detail::place_in_parents(plan);
    return plan;
  }
  const detail::interval_index index(items);
  auto sorted = [&](auto less) {
    std::vector<std::size_t> o(m);
    for (std::size_t i = 0; i < m; ++i) o[i] = i;
    std::stable_sort(o.begin(), o.end(), less);
    return o;
  };
  auto span = [&](std::size_t i) { return static_cast<double>(items[i].last - items[i].first + 1); };
  // The fixed orders, each built only when the ones before it did not reach the lower bound.
  auto fixed_order = [&](int k) {
    switch (k) {
      case 0:
        return sorted([&](std::size_t a, std::size_t b) {
          if (items[a].bytes != items[b].bytes) return items[a].bytes > items[b].bytes;
          return span(a) > span(b);
        });
      case 1:
        return sorted([&](std::size_t a, std::size_t b) {
          if (items[a].first != items[b].first) return items[a].first < items[b].first;
          return items[a].bytes > items[b].bytes;
        });
      case 2:
        return sorted([&](std::size_t a, std::size_t b) {
          if (span(a) != span(b)) return span(a) > span(b);
          return items[a].bytes > items[b].bytes;
        });
      case 3:
        return sorted([&](std::size_t a, std::size_t b) {
          return static_cast<double>(items[a].bytes) * span(a) > static_cast<double>(items[b].bytes) * span(b);
        });
      default:
        return detail::breadth_order(items, index, n);
    }
  };
  std::int64_t best = -1;
  std::vector<std::int64_t> best_off(m, 0);
  auto attempt = [&](const std::vector<std::size_t>& o, bool best_fit) {
    auto [off, arena] = detail::pack(items, index, o, best_fit, opt.alignment);
    if (best < 0 || arena < best) {
      best = arena;
      best_off = std::move(off);
    }
    return best <= plan.live_peak_bytes;
  };
  [&] {
    for (int k = 0; k < 5; ++k) {
      const std::vector<std::size_t> o = fixed_order(k);
      for (bool best_fit : {true, false})
        if (attempt(o, best_fit)) return;
    }
    // The number of tries is part of what the plan is (more tries, maybe another plan), so it
    // keeps the budget of the first, quadratic, packer: up to 256, fewer above ~280 buffers.
    const double work = static_cast<double>(m) * static_cast<double>(m) + 1.0;
    const int tries = static_cast<int>(std::min(256.0, 2e7 / work));
    std::uint64_t state = 0x9e3779b97f4a7c15ull;  // splitmix64: the same plan everywhere
    auto uniform = [&] {
      std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
    };
    std::vector<double> key(m);
    for (int t = 0; t < tries; ++t) {
      for (std::size_t i = 0; i < m; ++i) {
        const double u = 0.5 + uniform();
        key[i] = static_cast<double>(items[i].bytes) * u * std::pow(span(i), uniform());
      }
      if (attempt(sorted([&](std::size_t a, std::size_t b) { return key[a] > key[b]; }), true)) return;
    }
  }();
  for (std::size_t i = 0; i < m; ++i) plan.buffers[i].offset = best_off[i];
  plan.arena_bytes = std::max<std::int64_t>(best, 0);
  detail::place_in_parents(plan);
  return plan;
}

CCGRAPH_DECL bool memory_plan::check(const graph& g, std::string* why) const {
  std::ostringstream err;
  auto fail = [&]() {
    if (why) *why = err.str();
    return false;
  };
  const auto& nodes = g.nodes();
  const std::size_t n = nodes.size();
  if (n != num_nodes || buffer_of.size() != n) {
    err << "the plan is for a graph of " << num_nodes << " nodes, this one has " << n;
    return fail();
  }
  detail::liveness_info live(g);
  // Which value each value's bytes belong to: (buffer, index in buffer.values), or external.
  struct owner {
    int buffer = -1;
    int value = -1;
  };
  std::vector<std::vector<owner>> own(n);
  std::vector<std::vector<std::vector<value_ref>>> aliases(buffers.size());
  for (std::size_t b = 0; b < buffers.size(); ++b) aliases[b].resize(buffers[b].values.size());
  for (std::size_t p = 0; p < n; ++p) {
    const node* nd = nodes[p];
    own[p].resize(static_cast<std::size_t>(nd->num_outputs()));
    if (buffer_of[p].size() != own[p].size() && !(buffer_of[p].empty())) {
      err << "%" << nd->name() << ": the plan lists " << buffer_of[p].size() << " outputs, the node has "
          << own[p].size();
      return fail();
    }
    for (int k = 0; k < nd->num_outputs(); ++k) {
      const int b = buffer_of[p].empty() ? -1 : buffer_of[p][static_cast<std::size_t>(k)];
      if (b >= 0) {
        if (b >= static_cast<int>(buffers.size())) {
          err << detail::ref_str({const_cast<node*>(nd), k}) << ": buffer " << b << " does not exist";
          return fail();
        }
        const auto& vs = buffers[static_cast<std::size_t>(b)].values;
        int idx = -1;
        for (std::size_t i = 0; i < vs.size(); ++i)
          if (vs[i].position == p && vs[i].index == k) idx = static_cast<int>(i);
        if (idx < 0 || vs[static_cast<std::size_t>(idx)].name != detail::ref_str({const_cast<node*>(nd), k})) {
          err << detail::ref_str({const_cast<node*>(nd), k}) << " is not listed by its buffer " << b
              << " (was the graph reordered after planning?)";
          return fail();
        }
        const std::int64_t need = detail::value_bytes(nd->meta(k));
        if (buffers[static_cast<std::size_t>(b)].bytes < need) {
          err << detail::ref_str({const_cast<node*>(nd), k}) << " needs " << need << " bytes, its buffer " << b
              << " has " << buffers[static_cast<std::size_t>(b)].bytes;
          return fail();
        }
        own[p][static_cast<std::size_t>(k)] = {b, idx};
      } else if (aliasing_of(nd->kind()) == alias_kind::external || input_written_at(p, k)) {
        // the caller's memory (an input, or an updated result written into its input)
      } else if (detail::aliases_input(*nd)) {
        const value_ref in = nd->args().at(0);
        own[p][static_cast<std::size_t>(k)] = own[g.position(in.src)][static_cast<std::size_t>(in.index)];
      } else {
        err << detail::ref_str({const_cast<node*>(nd), k}) << " (" << nd->op() << ") is computed but has no buffer";
        return fail();
      }
      const owner o = own[p][static_cast<std::size_t>(k)];
      if (o.buffer >= 0)
        aliases[static_cast<std::size_t>(o.buffer)][static_cast<std::size_t>(o.value)].push_back({const_cast<node*>(nd), k});
    }
  }
  // Each result written into an input is one the rule allows there (all old reads end before).
  for (const planned_update& u : updates_in_place) {
    const std::vector<std::size_t> site = detail::in_place_update_sites(g, live, {u.update});
    const node* out = g.output_node();
    const bool that_output = out && u.update.output < out->args().size() &&
                             out->args()[u.update.output].index == u.value.index;
    if (u.value.position >= n || site[0] != u.value.position || !that_output) {
      err << u.value.name << " is written into input " << u.update.input << " (result " << u.update.output
          << ") at " << u.value.position << ", but that input's old value is read then or later, or the result is "
          << "not that output of one elementwise node there";
      return fail();
    }
  }
  // Each value's lifetime lies in its buffer's interval; a value handed on to an in-place
  // all_reduce is read by nothing else from that all_reduce on and is not a graph output.
  for (std::size_t b = 0; b < buffers.size(); ++b) {
    const planned_buffer& buf = buffers[b];
    if (buf.offset < 0 || buf.offset % alignment != 0 || buf.offset + buf.bytes > arena_bytes) {
      err << "buffer " << b << " at offset " << buf.offset << " (" << buf.bytes
          << " bytes) is misaligned or outside the arena of " << arena_bytes << " bytes";
      return fail();
    }
    if (buf.values.empty()) {
      err << "buffer " << b << " holds no value";
      return fail();
    }
    for (std::size_t i = 0; i < buf.values.size(); ++i) {
      const planned_value& v = buf.values[i];
      if (v.position >= n) {
        err << v.name << " is written at " << v.position << ", past the graph's " << n << " nodes";
        return fail();
      }
      if (v.position < buf.first || v.position > buf.last) {
        err << v.name << " is written at " << v.position << ", outside its buffer's interval [" << buf.first
            << ", " << buf.last << "]";
        return fail();
      }
      const node* thief = i + 1 < buf.values.size() ? nodes[buf.values[i + 1].position] : nullptr;
      if (thief && !in_place_input_of(thief->kind())) {
        err << buf.values[i + 1].name << " shares " << v.name << "'s buffer but its op (" << thief->op()
            << ") does not write in place";
        return fail();
      }
      int thief_reads = 0;
      for (const value_ref& a : aliases[b][i])
        for (const node* r : live.readers(a)) {
          const std::size_t e = live.read_end(r);
          if (e > buf.last) {
            err << "%" << r->name() << " reads " << v.name << " until " << e << ", after its buffer " << b
                << " is free at " << buf.last;
            return fail();
          }
          if (!thief) continue;
          if (r == thief) {
            for (auto& x : r->args()) thief_reads += x == a;
            continue;
          }
          if (e >= buf.values[i + 1].position) {
            err << v.name << " is read by %" << r->name() << " until " << e << " but " << buf.values[i + 1].name
                << " reduces into its buffer at " << buf.values[i + 1].position;
            return fail();
          }
        }
      if (thief && thief_reads != 1) {
        err << buf.values[i + 1].name << " reduces into " << v.name << "'s buffer but reads it " << thief_reads
            << " times";
        return fail();
      }
    }
  }
  // Each buffer laid out in an elided cat's lies in its slice, within the cat buffer's bytes and
  // lifetime; the cat reads exactly those slices in order, each its buffer's last value
  // (through waits, never a view of part of it), and nothing else reads them from the cat on.
  std::vector<int> child_of_cat(buffers.size(), -1);
  for (std::size_t b = 0; b < buffers.size(); ++b) {
    const planned_buffer& c = buffers[b];
    if (c.parent < 0) continue;
    if (c.parent <= static_cast<int>(b) || c.parent >= static_cast<int>(buffers.size())) {
      err << "buffer " << b << " (" << c.values.front().name << ") lies in buffer " << c.parent
          << ", which is not a later buffer of the plan";
      return fail();
    }
    const planned_buffer& o = buffers[static_cast<std::size_t>(c.parent)];
    const planned_value& last = c.values.back();
    if (c.offset != o.offset + c.offset_in_parent || c.offset_in_parent < 0 ||
        c.offset_in_parent + detail::value_bytes(nodes[last.position]->meta(last.index)) > o.bytes ||
        c.first < o.first || c.last > o.last || c.is_output) {
      err << "buffer " << b << " (" << c.values.front().name << ", bytes [" << c.offset << ", "
          << c.offset + c.bytes << "), live [" << c.first << ", " << c.last << "]) is not inside its parent buffer "
          << c.parent << " (bytes [" << o.offset << ", " << o.offset + o.bytes << "), live [" << o.first << ", "
          << o.last << "]) at +" << c.offset_in_parent;
      return fail();
    }
  }
  for (std::size_t i = 0; i < elided_cats.size(); ++i) {
    const elided_cat& ec = elided_cats[i];
    const node* cat = ec.position < n ? nodes[ec.position] : nullptr;
    if (!cat || !std::holds_alternative<ops::cat>(cat->kind()) || (i > 0 && elided_cats[i - 1].position >= ec.position) ||
        buffer_of[ec.position].size() != 1 || buffer_of[ec.position][0] < 0 || ec.slices.size() != cat->args().size()) {
      err << "elided cat " << i << " at " << ec.position << " is not a cat with a buffer and one slice per input";
      return fail();
    }
    const int outer = buffer_of[ec.position][0];
    for (std::size_t j = 0; j < ec.slices.size(); ++j) {
      // Back through views and waits to the value that owns the bytes, then forward the
      // layout: the whole of that value, contiguous.
      value_ref v = cat->args()[j];
      std::vector<const node*> views;
      auto planned_at = [&](value_ref x) {
        const auto& bs = buffer_of[g.position(x.src)];
        return bs.empty() ? -1 : bs[static_cast<std::size_t>(x.index)];
      };
      while (planned_at(v) < 0 && detail::aliases_input(*v.src) && !v.src->args().empty()) {
        views.push_back(v.src);
        v = v.src->args()[0];
      }
      detail::layout l = detail::contiguous_layout(v.src->shape(v.index));
      for (auto it = views.rbegin(); it != views.rend(); ++it)
        if (!(*it)->is_wait()) l = detail::view_layout(**it, l);
      const bool whole = l.is_contiguous() && l.storage_offset() == 0 && numel_of(l.shape()) == numel_of(v.src->shape(v.index));
      const std::size_t q = g.position(v.src);
      const int b = whole ? planned_at(v) : -1;
      const planned_buffer* c = b >= 0 ? &buffers[static_cast<std::size_t>(b)] : nullptr;
      if (!c || c->parent != outer || c->offset_in_parent != ec.slices[j] || c->values.back().position != q ||
          c->values.back().index != v.index) {
        err << "%" << cat->name() << " is elided but its input " << j << " (" << detail::ref_str(cat->args()[j])
            << ") is not the last value of a buffer at byte " << ec.slices[j] << " of its output's";
        return fail();
      }
      if (child_of_cat[static_cast<std::size_t>(b)] >= 0) {
        err << "%" << cat->name() << " reads buffer " << b << " twice, or another elided cat lays it out too";
        return fail();
      }
      child_of_cat[static_cast<std::size_t>(b)] = static_cast<int>(i);
      for (const auto& vs : aliases[static_cast<std::size_t>(b)])
        for (const value_ref& a : vs)
          for (const node* r : live.readers(a))
            if (r != cat && live.read_end(r) >= ec.position) {
              err << "%" << r->name() << " reads " << detail::ref_str(a) << " until " << live.read_end(r)
                  << ", from the elided %" << cat->name() << " on, which made it part of its output";
              return fail();
            }
    }
  }
  for (std::size_t b = 0; b < buffers.size(); ++b)
    if (buffers[b].parent >= 0 && child_of_cat[b] < 0) {
      err << "buffer " << b << " lies in buffer " << buffers[b].parent << " but no elided cat reads it";
      return fail();
    }
  // No two buffers live at one position share a byte. Every buffer holds a value written at a
  // position of the graph (checked above), so each starts before the end, and cutting what
  // lies past the end off its interval changes no overlap in time. For each buffer, the first
  // later one it overlaps: the first overlapping pair reported is the same as by a pass over
  // all pairs, for the cost of the pairs live at the same time.
  std::vector<detail::pack_item> spans;
  spans.reserve(buffers.size());
  for (const planned_buffer& buf : buffers) spans.push_back({buf.bytes, buf.first, std::min(buf.last, n - 1)});
  const detail::interval_index index(spans);
  for (std::size_t a = 0; a < buffers.size(); ++a) {
    const planned_buffer& x = buffers[a];
    if (x.bytes == 0 || x.parent >= 0) continue;  // inside its parent: checked above
    std::size_t b = buffers.size();
    auto consider = [&](std::size_t c) {
      const planned_buffer& y = buffers[c];
      if (c > a && c < b && y.bytes != 0 && y.parent < 0 && x.offset < y.offset + y.bytes &&
          y.offset < x.offset + x.bytes)
        b = c;
    };
    index.live_at(x.first, consider);
    index.starting_in(x.first, spans[a].last, consider);
    if (b < buffers.size()) {
      const planned_buffer& y = buffers[b];
      err << "buffers " << a << " (" << x.values.front().name << ", bytes [" << x.offset << ", "
          << x.offset + x.bytes << "), live [" << x.first << ", " << x.last << "]) and " << b << " ("
          << y.values.front().name << ", bytes [" << y.offset << ", " << y.offset + y.bytes << "), live ["
          << y.first << ", " << y.last << "]) overlap";
      return fail();
    }
  }
  return true;
}

CCGRAPH_DECL std::string to_string(const memory_plan& p) {
  std::ostringstream os;
  os << "memory plan: " << p.buffers.size() << " buffers in an arena of " << p.arena_bytes
     << " bytes (live peak " << p.live_peak_bytes << ", unplanned peak " << p.unplanned_peak_bytes
     << ", total " << p.total_bytes << "), " << p.num_steals() << " in-place all_reduce"
     << (p.num_steals() == 1 ? "" : "s");
  if (!p.elided_cats.empty())
    os << ", " << p.elided_cats.size() << " elided cat" << (p.elided_cats.size() == 1 ? "" : "s");
  os << '\n';
  for (std::size_t b = 0; b < p.buffers.size(); ++b) {
    const planned_buffer& buf = p.buffers[b];
    os << "  buf" << b << "  " << buf.values.front().name << "  " << buf.bytes << " B @ " << buf.offset
       << "  live [" << buf.first << ", " << buf.last << "]" << (buf.is_output ? "  output" : "");
    if (buf.parent >= 0) os << "  in buf" << buf.parent << " at +" << buf.offset_in_parent;
    os << '\n';
    for (std::size_t i = 1; i < buf.values.size(); ++i)
      os << "  buf" << b << "  " << buf.values[i].name << "  in place, stolen from "
         << buf.values[i - 1].name << '\n';
  }
  for (const planned_update& u : p.updates_in_place)
    os << "  " << u.value.name << "  written into input " << u.update.input << " (result " << u.update.output
       << ")\n";
  return os.str();
}

}  // namespace ccgraph

namespace ccgraph {
namespace detail {

CCGRAPH_DECL liveness_info::liveness_info(const graph& gr) : g(gr), end(gr.size() ? gr.size() - 1 : 0) {
  const auto& nodes = g.nodes();
  const std::size_t n = nodes.size();
  // Values numbered by position, then output: value_begin_[p] + k.
  value_begin_.assign(n + 1, 0);
  for (std::size_t p = 0; p < n; ++p)
    value_begin_[p + 1] = value_begin_[p] + static_cast<std::size_t>(nodes[p]->num_outputs());
  // Readers of each value, by position; a node reading a value twice is listed once (its
  // reads of one value come one after another, as readers are filled by position).
  std::vector<std::size_t> count(value_begin_[n] + 1, 0);
  for (const node* u : nodes)
    for (auto& a : u->args()) ++count[value_id(a) + 1];
  for (std::size_t v = 0; v + 1 < count.size(); ++v) count[v + 1] += count[v];
  reader_begin_ = count;
  readers_.resize(count.back());
  for (const node* u : nodes)
    for (auto& a : u->args()) {
      const std::size_t v = value_id(a);
      if (count[v] == reader_begin_[v] || readers_[count[v] - 1] != u) readers_[count[v]++] = u;
    }
  reader_end_.assign(count.begin(), count.end() - 1);
  // read_end of every node.
  read_end_.assign(n, 0);
  for (std::size_t p = 0; p < n; ++p) {
    const node* r = nodes[p];
    std::size_t e = p;
    if (std::holds_alternative<ops::output>(r->kind())) e = end;
    else if (r->is_collective())
      for (int k = 0; k < r->num_outputs() && e != end; ++k) {
        const auto rs = readers(p, k);
        if (rs.empty()) e = end;
        for (const node* w : rs) {
          if (!w->is_wait()) {
            e = end;
            break;
          }
          e = std::max(e, g.position(w));
        }
      }
    read_end_[p] = e;
  }
}

CCGRAPH_DECL std::span<const node* const> liveness_info::readers(std::size_t p, int k) const {
  const std::size_t v = value_begin_[p] + static_cast<std::size_t>(k);
  return {readers_.data() + reader_begin_[v], reader_end_[v] - reader_begin_[v]};
}

}  // namespace detail
}  // namespace ccgraph
