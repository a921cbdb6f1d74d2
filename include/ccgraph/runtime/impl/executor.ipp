// ccgraph/runtime/impl/executor.ipp: the non-template functions of
// <ccgraph/runtime/executor.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/runtime/executor.hpp>

namespace ccgraph {

CCGRAPH_DECL std::vector<input_update> update_inputs_range(std::size_t first_input, std::size_t first_output,
                                                     std::size_t count) {
  std::vector<input_update> out;
  for (std::size_t j = 0; j < count; ++j) out.push_back({first_input + j, first_output + j});
  return out;
}

namespace detail {

CCGRAPH_DECL any_tensor empty_like(const any_tensor& t, device dev) {
  return ::ccgraph::detail::visit([&](const auto& x) -> any_tensor {
    using T = typename std::decay_t<decltype(x)>::value_type;
    return tensor<T>::empty(x.shape(), dev);
  }, t);
}

CCGRAPH_DECL void copy_any(const any_tensor& dst, const any_tensor& src) {
  ::ccgraph::detail::visit([&](const auto& d) {
    using X = std::decay_t<decltype(d)>;
    X(d).copy_(std::get<X>(src));
  }, dst);
}

CCGRAPH_DECL memory_span span_of(const any_tensor& t) {
  return ::ccgraph::detail::visit([](const auto& x) {
    memory_span s;
    using T = typename std::decay_t<decltype(x)>::value_type;
    if (x.numel() == 0 || !x.storage()) return s;
    std::int64_t lo = x.storage_offset(), hi = x.storage_offset();
    for (std::size_t d = 0; d < x.shape().size(); ++d) {
      const std::int64_t step = (x.shape()[d] - 1) * x.strides()[d];
      (step < 0 ? lo : hi) += step;
      s.self_overlapping = s.self_overlapping || (x.shape()[d] > 1 && x.strides()[d] == 0);
    }
    s.storage = x.storage().get();
    s.begin = lo * static_cast<std::int64_t>(sizeof(T));
    s.end = (hi + 1) * static_cast<std::int64_t>(sizeof(T));
    return s;
  }, t);
}

CCGRAPH_DECL bool laid_out_in(const any_tensor& out, const std::vector<any_tensor>& in,
                              const std::vector<std::int64_t>& slices) {
  if (in.size() != slices.size()) return false;
  const memory_span whole = span_of(out);
  for (std::size_t i = 0; i < in.size(); ++i) {
    const bool dense = ::ccgraph::detail::visit([](const auto& x) { return x.is_contiguous() && !x.pending_work(); }, in[i]);
    const memory_span s = span_of(in[i]);
    if (!dense || !s.storage || s.storage != whole.storage || s.begin != whole.begin + slices[i]) return false;
  }
  return true;
}

CCGRAPH_DECL any_tensor arena_tensor(const std::shared_ptr<storage>& arena, const tensor_meta& m, std::int64_t offset) {
  return visit_any_dtype(m.dtype, [&](auto tag) -> any_tensor {
    using T = decltype(tag);
    return tensor<T>(arena, m.shape, contiguous_strides(m.shape), offset / static_cast<std::int64_t>(sizeof(T)));
  });
}

CCGRAPH_DECL void return_pending(graph& g) {
  node* out = g.output_node();
  if (!out) return;
  std::vector<value_ref> results = out->args();
  std::vector<node*> dropped;
  for (auto& r : results) {
    node* w = r.src;
    if (!w->is_wait() || w->users().size() != 1) continue;  // users are distinct: the output alone
    r = w->args().front();
    if (std::find(dropped.begin(), dropped.end(), w) == dropped.end()) dropped.push_back(w);
  }
  if (dropped.empty()) return;
  g.set_args(out, std::move(results));
  for (node* w : dropped) g.erase(w);
}

CCGRAPH_DECL std::vector<overlap_hint> collective_overlaps(const graph& g) {
  const auto& nodes = g.nodes();
  std::vector<overlap_hint> out(nodes.size(), overlap_hint::unknown);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (!nodes[i]->is_collective()) continue;
    std::size_t first_wait = nodes.size();
    for (const node* u : nodes[i]->users())
      if (u->is_wait()) first_wait = std::min(first_wait, g.position(u));
    overlap_hint h = overlap_hint::none;
    for (std::size_t p = i + 1; p < first_wait && h != overlap_hint::matmul; ++p) {
      const node& n = *nodes[p];
      if (n.is_impure()) continue;
      // What the op's cost says it launches: a matmul-class kernel, another kernel, or nothing.
      std::vector<tensor_meta> ins;
      for (const auto& a : n.args()) ins.push_back(a.src->meta(a.index));
      const op_cost c = cost_of(n.kind(), ins, n.metas());
      if (c.k == op_cost::kind::compute) h = c.peak == peak_class::matmul ? overlap_hint::matmul : overlap_hint::compute;
    }
    out[i] = h;
  }
  return out;
}

}  // namespace detail

namespace detail {

CCGRAPH_DECL run_profiler::run_profiler(const graph& g, device dev)
    : g_(&g), dev_(dev), marks_(g.nodes().size()) {
  if (dev.is_cuda()) {
    rt_ = &require_device_runtime("compiled graph: profile", dev);
    base_ = rt_->record_event(dev);
  }
  t0_ = std::chrono::steady_clock::now();
}

CCGRAPH_DECL run_profiler::~run_profiler() {
  if (!rt_) return;
  for (mark& m : marks_)
    for (void* e : m.event)
      if (e) rt_->destroy_event(e);
  if (base_) rt_->destroy_event(base_);
}

CCGRAPH_DECL void run_profiler::before(std::size_t i) {
  mark& m = marks_.at(i);
  if (rt_) m.event[0] = rt_->record_event(dev_);
  else m.host[0] = std::chrono::steady_clock::now();
}

CCGRAPH_DECL void run_profiler::after(std::size_t i, work_ptr launched) {
  mark& m = marks_.at(i);
  if (rt_) m.event[1] = rt_->record_event(dev_);
  else m.host[1] = std::chrono::steady_clock::now();
  m.launched = std::move(launched);
  m.ran = true;
}

CCGRAPH_DECL timeline run_profiler::finish() {
  timeline tl;
  const auto& nodes = g_->nodes();
  double comm_free = 0, compute_end = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const node* n = nodes[i];
    const mark& m = marks_[i];
    if (!m.ran) continue;  // nothing after the output node runs
    timeline_event ev{n, n->is_collective(), 0, 0, 0};
    double start = 0, end = 0;
    if (rt_) {
      start = rt_->elapsed_us(dev_, base_, m.event[0]);
      end = rt_->elapsed_us(dev_, base_, m.event[1]);
    } else {
      start = host_us(m.host[0]);
      end = host_us(m.host[1]);
    }
    if (n->is_collective()) {
      // Its own interval, not the launch's: a batch of sends only (no output) is waited in
      // the node, every other collective runs past it.
      CCGRAPH_CHECK(m.launched != nullptr, "compiled graph: profile: collective %", n->name(), " (", n->op(),
                    ") launched no work to time");
      if (rt_) {
        const auto [from, to] = m.launched->device_events();
        CCGRAPH_CHECK(from && to, "compiled graph: profile: the backend of ", dev_, " did not time collective %",
                      n->name(), " (", n->op(), ")");
        start = rt_->elapsed_us(dev_, base_, from);
        end = rt_->elapsed_us(dev_, base_, to);
      } else {
        m.launched->wait();  // its error, if it failed, is the profile's too
        std::chrono::steady_clock::time_point s, e;
        CCGRAPH_CHECK(m.launched->host_interval(s, e), "compiled graph: profile: the backend of ", dev_,
                      " did not time collective %", n->name(), " (", n->op(), ")");
        start = host_us(s);
        end = host_us(e);
      }
      // One collective at a time on the track (see basic_executor::run_profiled).
      ev.start_us = std::min(std::max(start, comm_free), end);
      ev.end_us = end;
      comm_free = std::max(comm_free, end);
      tl.comm_us += ev.end_us - ev.start_us;
    } else if (n->is_wait()) {
      // All of a wait's time is compute standing still; shown before it, as simulate does.
      ev.stall_us = std::max(0.0, end - start);
      ev.start_us = ev.end_us = std::max(start, end);
      tl.exposed_comm_us += ev.stall_us;
      compute_end = std::max(compute_end, ev.end_us);
    } else {
      ev.start_us = start;
      ev.end_us = std::max(start, end);
      tl.compute_us += ev.end_us - ev.start_us;
      compute_end = std::max(compute_end, ev.end_us);
    }
    tl.total_us = std::max(tl.total_us, ev.end_us);
    tl.events.push_back(ev);
  }
  // A collective still running when the compute finished (returned pending) is exposed too.
  tl.exposed_comm_us += std::max(0.0, comm_free - compute_end);
  return tl;
}

CCGRAPH_DECL std::vector<void*> nvtx_names(const graph& g, device dev) {
  std::vector<void*> out;
  const device_runtime* rt = dev.is_cuda() ? device_runtime_slot() : nullptr;
  if (!rt || !rt->nvtx_register || g.nodes().empty()) return out;
  for (const node* n : g.nodes()) {
    void* h = rt->nvtx_register(node_label(*n).c_str());
    if (!h) return {};  // no tool listens: no ranges at all
    out.push_back(h);
  }
  return out;
}

}  // namespace detail

}  // namespace ccgraph
