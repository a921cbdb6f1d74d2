// ccgraph/schedule/impl/timeline.ipp: the non-template functions of
// <ccgraph/schedule/timeline.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/timeline.hpp>

namespace ccgraph {

CCGRAPH_DECL timeline simulate(const graph& g, const runtime_estimator& estimate) {
  timeline tl;
  double t_compute = 0, t_comm = 0;
  std::unordered_map<const node*, double> done;  // completion time of each node's outputs
  for (const node* n : g.nodes()) {
    double ready = 0;
    for (auto& a : n->args()) ready = std::max(ready, done[a.src]);
    timeline_event ev{n, n->is_collective(), 0, 0, 0};
    const double cost =
        n->category() == op_category::input || n->category() == op_category::output ? 0.0 : estimate(*n);
    if (n->is_collective()) {
      // Issued when the compute stream reaches it, once its inputs exist and the stream is free.
      ev.start_us = std::max({t_comm, t_compute, ready});
      ev.end_us = ev.start_us + cost;
      t_comm = ev.end_us;
      tl.comm_us += cost;
    } else {
      const double start = std::max(t_compute, ready);
      if (n->is_wait()) ev.stall_us = start - t_compute;
      ev.start_us = start;
      ev.end_us = start + cost;
      tl.exposed_comm_us += ev.stall_us;
      tl.compute_us += cost;
      t_compute = ev.end_us;
    }
    done[n] = ev.end_us;
    tl.events.push_back(ev);
  }
  tl.total_us = std::max(t_compute, t_comm);
  // A collective returned un-waited still has to finish: its tail after the compute is exposed.
  tl.exposed_comm_us += std::max(0.0, t_comm - t_compute);
  return tl;
}

namespace detail {

CCGRAPH_DECL std::string node_label(const node& n) {
  if (auto* p = std::get_if<ops::pointwise>(&n.kind())) return "%" + n.name() + " " + p->fused;
  return "%" + n.name() + " " + std::string(n.op());
}

CCGRAPH_DECL std::string json_escape(const std::string& s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (u < 0x20) {
          o += "\\u00";
          o += hex[u >> 4];
          o += hex[u & 15];
        } else {
          o += c;
        }
    }
  }
  return o;
}

}  // namespace detail

namespace detail {

/// The events of one timeline as process `pid`, each preceded by ",\n" except the very first of
/// the file (`first`).
CCGRAPH_DECL void write_chrome_process(std::ostream& os, const timeline& tl, int pid, const std::string& process_name,
                                       bool first) {
  os << (first ? "" : ",\n") << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid
     << ",\"args\":{\"name\":\"" << json_escape(process_name) << "\"}},\n";
  os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid
     << ",\"tid\":0,\"args\":{\"name\":\"compute stream\"}},\n";
  os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid
     << ",\"tid\":1,\"args\":{\"name\":\"comm stream\"}}";
  for (const auto& ev : tl.events) {
    if (ev.n->category() == op_category::input || ev.n->category() == op_category::output)
      continue;
    if (ev.stall_us > 0)
      os << ",\n{\"name\":\"exposed wait\",\"cat\":\"stall\",\"ph\":\"X\",\"pid\":" << pid
         << ",\"tid\":0,\"ts\":" << ev.start_us - ev.stall_us << ",\"dur\":" << ev.stall_us << "}";
    os << ",\n{\"name\":\"" << json_escape(node_label(*ev.n)) << "\",\"cat\":\""
       << (ev.on_comm_stream ? "comm" : ev.n->is_wait() ? "wait" : "compute") << "\",\"ph\":\"X\",\"pid\":" << pid
       << ",\"tid\":" << (ev.on_comm_stream ? 1 : 0) << ",\"ts\":" << ev.start_us
       << ",\"dur\":" << (ev.end_us - ev.start_us) << ",\"args\":{\"meta\":\""
       << (ev.n->num_outputs() ? json_escape(metas_str(*ev.n)) : std::string()) << "\"";
    if (known_site(ev.n->source())) os << ",\"source\":\"" << json_escape(site_str(ev.n->source())) << "\"";
    os << "}}";
  }
}

}  // namespace detail

CCGRAPH_DECL std::string to_chrome_trace(const timeline& tl, const std::string& process_name) {
  return to_chrome_trace(std::vector<timeline>{tl}, std::vector<std::string>{process_name});
}

CCGRAPH_DECL std::string to_chrome_trace(const std::vector<timeline>& tls, const std::vector<std::string>& process_names) {
  CCGRAPH_CHECK(tls.size() == process_names.size(), "to_chrome_trace: ", tls.size(), " timelines but ",
                process_names.size(), " process names");
  std::ostringstream os;
  os << std::fixed << std::setprecision(3);
  os << "{\"traceEvents\":[\n";
  for (std::size_t i = 0; i < tls.size(); ++i)
    detail::write_chrome_process(os, tls[i], static_cast<int>(i), process_names[i], i == 0);
  os << "\n],\"displayTimeUnit\":\"ms\"}\n";
  return os.str();
}

CCGRAPH_DECL std::string predicted_vs_measured_trace(const timeline& predicted, const timeline& measured) {
  return to_chrome_trace(std::vector<timeline>{predicted, measured}, std::vector<std::string>{"predicted", "measured"});
}

CCGRAPH_DECL std::string overlap_report(const timeline& tl) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  std::vector<std::pair<double, double>> comm;
  for (auto& ev : tl.events)
    if (ev.on_comm_stream) comm.emplace_back(ev.start_us, ev.end_us);
  for (const auto& ev : tl.events) {
    if (ev.n->category() == op_category::input || ev.n->category() == op_category::output)
      continue;
    bool overlapped = false;
    if (!ev.on_comm_stream)
      for (auto& [s, e] : comm) overlapped = overlapped || (ev.start_us < e && ev.end_us > s && ev.end_us > ev.start_us);
    os << (ev.on_comm_stream ? "  comm    " : overlapped ? "| compute " : "  compute ") << std::setw(10)
       << ev.start_us << " .. " << std::setw(10) << ev.end_us << " us  " << detail::node_label(*ev.n);
    if (ev.stall_us > 0) os << "   (exposed " << ev.stall_us << " us)";
    os << '\n';
  }
  os << "total " << tl.total_us << " us, compute " << tl.compute_us << " us, communication "
     << tl.comm_us << " us, exposed communication " << tl.exposed_comm_us << " us ("
     << std::setprecision(1) << 100.0 * tl.exposed_ratio() << "%)\n";
  return os.str();
}

}  // namespace ccgraph
