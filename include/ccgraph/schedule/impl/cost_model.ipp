// ccgraph/schedule/impl/cost_model.ipp: the non-template functions of
// <ccgraph/schedule/cost_model.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/schedule/cost_model.hpp>

#include <cctype>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL nccl_topology nccl_topology_of(const device_spec& d, int nranks) {
  nccl_topology t;
  t.nranks = nranks;
  const int ppn_max = std::max(1, d.gpus_per_node);
  t.nnodes = (nranks + ppn_max - 1) / ppn_max;
  const auto gen = static_cast<std::size_t>(d.generation);
  if (d.nvlink_links > 0) {
    t.intra_hw = nccl_hw::nvlink;
    double bw = d.nvlink_links * nccl_nvlink_bandwidth_per_link[gen];
    if (d.nvlink_bw > 0) bw = std::min(bw, d.nvlink_bw / 1e9);
    t.intra_bw = bw * d.nccl_efficiency;
    t.channels = d.nvlink_links;
  } else {
    t.intra_hw = nccl_hw::pci;
    t.intra_bw = d.pci_bw / 1e9 * d.nccl_efficiency;
    t.channels = 2;
  }
  t.net_bw = d.net_bw / 1e9 * d.nccl_efficiency;
  // Across nodes every ring crosses each node boundary once per channel; with one NIC per GPU
  // the node's channels share gpus_per_node NICs (Inductor: "bottlenecked by the slowest link").
  const int ppn = std::min(nranks, ppn_max);
  t.bus_bw = t.nnodes == 1 ? t.intra_bw : std::min(t.intra_bw, t.net_bw * ppn);
  return t;
}

CCGRAPH_DECL std::pair<double, double> nccl_lat_bw(const device_spec& d, const nccl_topology& t, nccl_coll coll,
                                             nccl_algo algo, nccl_proto proto) {
  const auto a = static_cast<std::size_t>(algo);
  const auto p = static_cast<std::size_t>(proto);
  const auto gen = static_cast<std::size_t>(d.generation);
  const int n = t.nranks, nodes = t.nnodes;
  const std::size_t node_class = nodes <= 2 ? static_cast<std::size_t>(nodes - 1) : 2;
  // LL's cap: by GPU generation on one node, by CPU vendor across nodes (we assume Intel: row 0).
  const double ll_max = ll_max_bandwidth[nodes == 1 ? gen : 0][node_class];
  const double ppn = double(n) / nodes;

  if (algo == nccl_algo::tree && coll != nccl_coll::all_reduce) return {0, 0};  // ring only
  // LL128: NCCL enables it by default on NVLink (typeIntra <= PATH_NVB) for sm70 and newer.
  if (proto == nccl_proto::ll128 && t.intra_hw != nccl_hw::nvlink) return {0, 0};

  const int nsteps = coll == nccl_coll::all_reduce ? 2 * (n - 1)
                     : (coll == nccl_coll::all_gather || coll == nccl_coll::reduce_scatter) ? n - 1
                                                                                            : n;
  double bus = t.bus_bw;
  const double ch = t.channels;
  if (algo == nccl_algo::ring && proto == nccl_proto::ll) bus = std::min(ll_max, bus * 0.5);
  if (algo == nccl_algo::ring && proto == nccl_proto::ll128)
    bus = std::min(bus * 0.92, ch * per_channel_max_ring_ll128_bandwidth[gen][node_class]);
  if (algo == nccl_algo::tree) bus = std::min(bus * 0.92, ch * per_channel_max_tree_bandwidth[gen][node_class]);
  if (algo == nccl_algo::tree && proto == nccl_proto::ll) bus = std::min(bus / 3.8, ll_max);
  if (algo == nccl_algo::tree && proto == nccl_proto::ll128)
    bus = std::min(bus * (nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0),
                   ch * per_channel_max_tree_ll128_bandwidth[gen][node_class]);
  // Bus bandwidth to algorithm bandwidth.
  const double bw = bus * (algo == nccl_algo::ring ? double(n) / nsteps : 0.5);

  double lat = nccl_base_latency[a][p];
  double intra_lat = nccl_hw_latency[static_cast<std::size_t>(t.intra_hw)][a][p];
  // "With ppn=1 latencies are fully exposed, use the Tree network latency".
  const double inter_lat =
      nccl_hw_latency[static_cast<std::size_t>(nccl_hw::net)][ppn == 1 ? 0 : a][p];
  if (algo == nccl_algo::ring) {
    if (coll == nccl_coll::broadcast) {
      // Broadcast is a pipelined chain: NCCL's per-step latency for rings that do not share
      // channels (Simple takes the tree figure "waiting for proper chunk modeling").
      const nccl_hw hw = nodes == 1 ? t.intra_hw : nccl_hw::net;
      const std::size_t la = proto == nccl_proto::simple ? 0 : a;
      lat += nsteps * nccl_hw_latency[static_cast<std::size_t>(hw)][la][p];
    } else {
      // Inter-node rings pay the network post overhead on every step (getNetOverhead: 1 us on
      // Intel, x3 for Simple).
      const double net_overhead = nodes > 1 ? (proto == nccl_proto::simple ? 3.0 : 1.0) : 0.0;
      intra_lat = std::max(intra_lat, net_overhead);
      const int inter_steps = nodes == 1 ? 0 : coll == nccl_coll::all_reduce ? 2 * (nodes - 1) : nodes - 1;
      lat += (nsteps - inter_steps) * intra_lat + inter_steps * inter_lat;
    }
  } else {
    lat += 2 * ((n / nodes - 1) * intra_lat + log2i(nodes) * inter_lat);
  }
  return {lat, bw};
}

CCGRAPH_DECL double nccl_algo_time(const device_spec& d, const nccl_topology& t, nccl_coll coll, nccl_algo algo,
                             nccl_proto proto, double bytes) {
  auto [lat, bw] = nccl_lat_bw(d, t, coll, algo, proto);
  if (bw <= 0) return -1;
  const int log_size = log2i(static_cast<std::int64_t>(bytes) >> 6);
  if (algo == nccl_algo::tree && coll == nccl_coll::all_reduce && log_size >= 0 &&
      log_size < static_cast<int>(nccl_num_tree_corrections))
    bw *= nccl_tree_correction[static_cast<std::size_t>(proto)][static_cast<std::size_t>(log_size)];
  if (algo == nccl_algo::ring && proto == nccl_proto::simple && t.nnodes > 1 && coll == nccl_coll::all_reduce &&
      bytes / (double(t.channels) * t.nranks) >= 64)
    lat *= d.generation < gpu_generation::ampere ? 1.9 : 1.4;  // "plateau effect of ring"
  return lat + bytes / (1000.0 * bw);
}

CCGRAPH_DECL double bytes_of(const tensor_meta& m) {
  return double(numel_of(m.shape)) * double(element_size(m.dtype));
}

}  // namespace detail

CCGRAPH_DECL void calibration::add(std::string_view op, int group_size, std::int64_t bytes, double us) {
  CCGRAPH_CHECK(!op.empty(), "calibration::add: empty op name");
  CCGRAPH_CHECK(group_size >= 1, "calibration::add: group_size ", group_size, " for ", op, " must be >= 1");
  CCGRAPH_CHECK(bytes >= 0, "calibration::add: negative bytes ", bytes, " for ", op);
  CCGRAPH_CHECK(std::isfinite(us) && us >= 0, "calibration::add: time ", us, " us for ", op,
                " must be finite and >= 0");
  table_[key_t(std::string(op), group_size)][bytes] = us;
}

CCGRAPH_DECL void calibration::set_measured_on(std::string_view key, std::string_view value) {
  const bool word = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
  });
  CCGRAPH_CHECK(word, "calibration::set_measured_on: key '", key,
                "' must be a non-empty word of letters, digits and '_'");
  CCGRAPH_CHECK(value.find_first_of("\r\n") == std::string_view::npos,
                "calibration::set_measured_on: the value of '", key, "' must be one line");
  measured_on_[std::string(key)] = trim(value);
}

CCGRAPH_DECL bool calibration::has(std::string_view op, int group_size) const {
  return table_.find(key_t(std::string(op), group_size)) != table_.end();
}

CCGRAPH_DECL std::size_t calibration::size() const {
  std::size_t n = 0;
  for (auto& [k, v] : table_) n += v.size();
  return n;
}

CCGRAPH_DECL std::vector<calibration::point> calibration::points() const {
  std::vector<point> v;
  for (auto& [k, pts] : table_)
    for (auto& [b, us] : pts) v.push_back({k.first, k.second, b, us});
  return v;
}

CCGRAPH_DECL std::optional<double> calibration::interpolate(std::string_view op, int group_size, std::int64_t bytes) const {
  auto it = table_.find(key_t(std::string(op), group_size));
  if (it == table_.end() || it->second.empty()) return std::nullopt;
  const auto& pts = it->second;  // bytes -> us, ascending
  auto hi = pts.lower_bound(bytes);
  if (hi != pts.end() && hi->first == bytes) return hi->second;
  if (hi == pts.begin()) return hi->second;
  if (hi == pts.end()) {
    auto last = std::prev(pts.end());
    double bw = 0;  // bytes per us
    if (last != pts.begin()) {
      auto prev = std::prev(last);
      if (last->second > prev->second) bw = double(last->first - prev->first) / (last->second - prev->second);
    }
    if (bw <= 0 && last->second > 0) bw = double(last->first) / last->second;
    if (bw <= 0) return last->second;
    return last->second + double(bytes - last->first) / bw;
  }
  auto lo = std::prev(hi);
  const double x0 = double(lo->first), x1 = double(hi->first), x = double(bytes);
  const double y0 = lo->second, y1 = hi->second;
  if (x0 <= 0 || y0 <= 0 || y1 <= 0) return y0 + (y1 - y0) * (x - x0) / (x1 - x0);  // no logs of 0
  const double f = std::log(x / x0) / std::log(x1 / x0);
  return std::exp(std::log(y0) + f * (std::log(y1) - std::log(y0)));
}

CCGRAPH_DECL void calibration::load(std::istream& in) {
  calibration staged = *this;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto first = line.find_first_not_of(" \t");
    auto fail = [&](const std::string& why) {
      CCGRAPH_THROW(error, "calibration: line ", lineno, ": ", why, ": \"", line, "\"");
    };
    if (first != std::string::npos && line.compare(first, 2, "#@") == 0) {  // where it was measured
      const std::string_view rest = std::string_view(line).substr(first + 2);
      const auto colon = rest.find(':');
      if (colon == std::string_view::npos) fail("expected '#@ key: value'");
      const std::string key = trim(rest.substr(0, colon)), value = trim(rest.substr(colon + 1));
      const auto held = staged.measured_on_.find(key);
      // `date` says when, not where: the same machine's tables of two days merge.
      if (held != staged.measured_on_.end() && held->second != value && staged.size() > 0 && key != "date")
        fail(detail::concat("this table was measured with ", key, " '", value, "', but the table it is loaded "
                        "into holds points measured with ", key, " '", held->second,
                        "'; keep the tables of different machines apart"));
      try {
        staged.set_measured_on(key, value);
      } catch (const error& e) {
        fail(e.what());
      }
      continue;
    }
    if (first == std::string::npos || line[first] == '#') continue;
    auto fields = split_csv(line);
    if (fields.size() != 4) fail("expected 4 fields op,group_size,bytes,us, got " + std::to_string(fields.size()));
    if (fields[0] == "op" && fields[1] == "group_size" && fields[2] == "bytes" && fields[3] == "us") continue;
    if (fields[0].empty()) fail("empty op name");
    const auto g = parse_int(fields[1]);
    if (!g || *g < 1 || *g > std::numeric_limits<int>::max()) fail("group_size must be an integer >= 1");
    const auto b = parse_int(fields[2]);
    if (!b || *b < 0) fail("bytes must be an integer >= 0");
    const auto us = parse_double(fields[3]);
    if (!us || !std::isfinite(*us) || *us < 0) fail("us must be a number >= 0");
    staged.add(fields[0], static_cast<int>(*g), *b, *us);
  }
  detail::log(log_level::info, "calibration", "loaded ", staged.size() - size(), " points (", staged.size(),
              " in the table)");
  *this = std::move(staged);
}

CCGRAPH_DECL void calibration::save(std::ostream& out) const {
  std::ostringstream os;
  os.precision(17);
  for (const auto& [key, value] : measured_on_) os << "#@ " << key << ": " << value << '\n';
  os << "op,group_size,bytes,us\n";
  for (auto& p : points()) os << p.op << ',' << p.group_size << ',' << p.bytes << ',' << p.us << '\n';
  out << os.str();
}

CCGRAPH_DECL std::string calibration::trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

CCGRAPH_DECL std::vector<std::string> calibration::split_csv(const std::string& line) {
  std::vector<std::string> f;
  std::size_t start = 0;
  while (true) {
    const auto comma = line.find(',', start);
    f.push_back(trim(std::string_view(line).substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) return f;
    start = comma + 1;
  }
}

CCGRAPH_DECL std::optional<std::int64_t> calibration::parse_int(const std::string& s) {
  if (s.empty()) return std::nullopt;
  std::size_t pos = 0;
  try {
    const long long v = std::stoll(s, &pos);
    if (pos != s.size()) return std::nullopt;
    return static_cast<std::int64_t>(v);
  } catch (...) {
    return std::nullopt;
  }
}

CCGRAPH_DECL std::optional<double> calibration::parse_double(const std::string& s) {
  if (s.empty()) return std::nullopt;
  std::size_t pos = 0;
  try {
    const double v = std::stod(s, &pos);
    if (pos != s.size()) return std::nullopt;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

CCGRAPH_DECL nccl_estimate cost_model::nccl_collective(nccl_coll coll, double bytes, int nranks) const {
  // A ring reduce moves what a broadcast does; send/recv between two ranks is one pairwise
  // step of the all_to_all (its bytes: both directions of the exchange), whatever the group.
  if (coll == nccl_coll::reduce) coll = nccl_coll::broadcast;
  if (coll == nccl_coll::send_recv) {
    coll = nccl_coll::all_to_all;
    nranks = 2;
  }
  nccl_estimate best;
  if (nranks <= 1) {
    best.us = device.launch_us;
    return best;
  }
  if (device.backend == collective_backend::threads) {
    best.us = threads_collective_us(coll, bytes, nranks);
    return best;
  }
  const auto t = detail::nccl_topology_of(device, nranks);
  if (coll == nccl_coll::all_to_all) {
    // Grouped send/recv: one step to every peer at once. Bytes for peers on this node cross
    // NVLink, for the others this GPU's NIC; latency of one Simple ring step.
    const int ppn = std::min(nranks, std::max(1, device.gpus_per_node));
    const double intra_bytes = bytes * (ppn - 1) / nranks;
    const double inter_bytes = bytes * (nranks - ppn) / nranks;
    const nccl_hw hw = t.nnodes == 1 ? t.intra_hw : nccl_hw::net;
    const auto ring = static_cast<std::size_t>(nccl_algo::ring), simple = static_cast<std::size_t>(nccl_proto::simple);
    const double lat = nccl_base_latency[ring][simple] + nccl_hw_latency[static_cast<std::size_t>(hw)][ring][simple];
    double transfer = intra_bytes / (1000.0 * t.intra_bw);
    if (inter_bytes > 0) transfer = std::max(transfer, inter_bytes / (1000.0 * t.net_bw));
    best.us = device.launch_us + lat + transfer;
    return best;
  }
  double best_time = std::numeric_limits<double>::infinity();
  for (auto algo : {nccl_algo::tree, nccl_algo::ring})
    for (auto proto : {nccl_proto::ll, nccl_proto::ll128, nccl_proto::simple}) {
      const double time = detail::nccl_algo_time(device, t, coll, algo, proto, bytes);
      if (time >= 0 && time < best_time) {
        best_time = time;
        best.algo = algo;
        best.proto = proto;
      }
    }
  best.us = device.launch_us + best_time;
  return best;
}

CCGRAPH_DECL double cost_model::collective_us(const ops::collective_op& op, const std::vector<tensor_meta>& inputs, int group_size) const {
  return ::ccgraph::detail::visit(
      [&](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        ::ccgraph::detail::require_cost<O>();
        ::ccgraph::detail::require_bucketing<O>();
        const op_cost c = op_traits<O>::cost(o, cost_args{inputs, {}, group_size});
        CCGRAPH_CHECK(c.k == op_cost::kind::collective, "cost_model: ", O::name, " is not priced as a collective");
        double bytes = 0;
        for (auto& m : inputs) bytes += detail::bytes_of(m);
        if (auto us = measured.interpolate(O::name, group_size, static_cast<std::int64_t>(bytes))) return *us;
        using single = typename op_traits<O>::single_op;
        if constexpr (!std::is_same_v<single, O>)
          if (auto us = measured.interpolate(single::name, group_size, static_cast<std::int64_t>(bytes))) return *us;
        return nccl_collective(c.coll, c.bytes, group_size).us;
      },
      op);
}

CCGRAPH_DECL double cost_model::compute_us(const node& n) const {
  std::vector<tensor_meta> in;
  in.reserve(n.args().size());
  for (std::size_t i = 0; i < n.args().size(); ++i) in.push_back(arg_meta(n, i));
  const op_cost c = cost_of(n.kind(), in, n.metas(), n.group() ? n.group()->size() : 1);
  switch (c.k) {
    case op_cost::kind::free:
    case op_cost::kind::collective: return 0.0;
    case op_cost::kind::compute: break;
  }
  switch (c.peak) {
    case peak_class::matmul: return roofline_us(c.flops, matmul_peak(c.dt), c.bytes);
    case peak_class::vector: return roofline_us(c.flops, device.flops_f32, c.bytes);
    case peak_class::none: break;
  }
  return roofline_us(0, 1, c.bytes);
}

CCGRAPH_DECL double cost_model::estimate_us(const node& n) const {
  if (auto c = n.collective()) {
    CCGRAPH_CHECK(n.group().has_value(), "cost_model: collective node %", n.name(), " has no group");
    std::vector<tensor_meta> in;
    in.reserve(n.args().size());
    for (auto& a : n.args()) in.push_back(a.src->meta(a.index));
    return collective_us(*c, in, n.group()->size());
  }
  return compute_us(n);
}

CCGRAPH_DECL const tensor_meta& cost_model::arg_meta(const node& n, std::size_t i) {
  CCGRAPH_CHECK(i < n.args().size(), "cost_model: node %", n.name(), " (", n.op(), ") has ", n.args().size(),
                " argument(s), not ", i + 1);
  const auto& a = n.args()[i];
  return a.src->meta(a.index);
}

CCGRAPH_DECL double cost_model::matmul_peak(dtype dt) const {
  switch (dt) {
    case dtype::bf16:
    case dtype::f16: return device.flops_bf16;
    case dtype::f32: return allow_tf32 ? device.flops_tf32 : device.flops_f32;
    case dtype::f64: return device.flops_f64;
    default: return device.flops_f32;  // integer matmul runs on the vector units
  }
}

CCGRAPH_DECL double cost_model::roofline_us(double flops, double peak, double bytes) const {
  const double compute_s = peak > 0 ? flops / peak : 0;
  const double memory_s = device.memory_bw > 0 ? bytes / device.memory_bw : 0;
  return device.launch_us + 1e6 * std::max(compute_s, memory_s);
}

CCGRAPH_DECL double cost_model::threads_collective_us(nccl_coll coll, double bytes, int nranks) const {
  const double n = nranks;
  double per_rank = 0;
  switch (coll) {
    case nccl_coll::all_reduce: per_rank = (n + 2) * bytes; break;
    case nccl_coll::reduce_scatter: per_rank = bytes + 2 * bytes / n; break;
    case nccl_coll::all_gather:
    case nccl_coll::broadcast:
    case nccl_coll::all_to_all: per_rank = 3 * bytes; break;
    case nccl_coll::reduce:
    case nccl_coll::send_recv: break;  // priced as broadcast / all_to_all (nccl_collective)
  }
  const double traffic_s = device.memory_bw > 0 ? n * per_rank / device.memory_bw : 0;
  return device.launch_us + (n - 1) * device.rendezvous_us + 1e6 * traffic_s;
}

}  // namespace ccgraph
