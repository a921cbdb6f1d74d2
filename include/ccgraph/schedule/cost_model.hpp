// ccgraph/schedule/cost_model.hpp: how long a node takes, for the schedulers. Three parts:
//
//  - collectives: an analytical model of NCCL (ring and tree; the LL, LL128 and Simple
//    protocols; NVLink, PCI and network latencies; per-GPU-generation bandwidth caps), built the
//    way NCCL's own tuner (src/graph/tuning.cc, ncclTopoTuneModel / ncclTopoGetAlgoTime) and
//    PyTorch Inductor's torch/_inductor/comm_analysis.py build theirs; a simpler direct model
//    for the CPU threads backend;
//  - compute: a roofline, max(FLOPs / peak, bytes / memory bandwidth) plus a launch overhead,
//    against a device description;
//  - calibration: a table of measured (op, group size, bytes) -> microseconds points, loaded
//    from CSV (bench/bench_calibrate.cpp writes one) and interpolated log-log; measured points
//    win over the analytical model.
//
// Units: times in microseconds; device_spec rates in bytes/s and FLOP/s; the NCCL tables keep
// NCCL's own units (latencies in us, bandwidths in GB/s = 1e9 B/s), so they read like the source.
#pragma once

#include <ccgraph/core/log.hpp>
#include <ccgraph/core/config.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ir/node_op.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/ops/matmul.hpp>

namespace ccgraph {

// ---------------------------------------------------------------------------------------------
// NCCL's enumerations and tables
//
// Source of every number in this section, unless a comment says otherwise: NCCL
// src/graph/tuning.cc, the version with Blackwell rows and PAT (NCCL 2.23 to 2.28; PERF.md's
// machine runs 2.28). We model NCCL's two general algorithms (tree, ring) and its three
// protocols; CollNet, NVLS and PAT need hardware or settings we do not assume (PERF.md runs
// with NCCL_NVLS_ENABLE=0). Inductor's comm_analysis.py keeps the same tables with the LL
// column only; torch's test_nccl_heuristics checks their dimensions, which the static_asserts
// below and tests/schedule/test_cost_model.cpp check here.
// ---------------------------------------------------------------------------------------------

/// NCCL's collective algorithms that the model considers (NCCL_ALGO_TREE, NCCL_ALGO_RING; same
/// indices as NCCL).
enum class nccl_algo : std::uint8_t { tree, ring };
/// NCCL's protocols (NCCL_PROTO_LL, _LL128, _SIMPLE; same indices as NCCL): LL has the lowest
/// latency and the lowest bandwidth (8-byte stores with a flag), Simple the opposite.
enum class nccl_proto : std::uint8_t { ll, ll128, simple };
/// The link a step crosses (NCCL_HW_NVLINK, _PCI, _NET).
enum class nccl_hw : std::uint8_t { nvlink, pci, net };
/// GPU generations NCCL tunes for (VOLTA/AMPERE/HOPPER/BLACKWELL_COMPCAP_IDX: sm70, sm80,
/// sm90, sm100).
enum class gpu_generation : std::uint8_t { volta, ampere, hopper, blackwell };
// nccl_coll, the collectives the model knows, is ops/op_traits.hpp's: each collective's
// op_traits<O>::cost names the one that prices it.

/// Number of nccl_algo values (len(NCCL_ALGO)).
inline constexpr std::size_t nccl_num_algos = 2;
/// Number of nccl_proto values (len(NCCL_PROTO)).
inline constexpr std::size_t nccl_num_protos = 3;
/// Number of nccl_hw values (len(NCCL_HW)).
inline constexpr std::size_t nccl_num_hw = 3;
/// Number of gpu_generation values (len(NVIDIA_GPU_TYPE)).
inline constexpr std::size_t num_gpu_generations = 4;
/// Columns of NCCL's per-generation bandwidth tables: 1 node, 2 nodes, more than 2 nodes.
inline constexpr std::size_t nccl_num_node_classes = 3;
/// Entries of NCCL's tree correction table: powers of two from 64 B to 256 MiB.
inline constexpr std::size_t nccl_num_tree_corrections = 23;

/// Base latency of a collective in us, [algo][proto] (tuning.cc `baseLat`).
inline constexpr std::array<std::array<double, nccl_num_protos>, nccl_num_algos> nccl_base_latency = {{
    /* tree: LL, LL128, Simple */ {6.8, 14.0, 8.4},
    /* ring: LL, LL128, Simple */ {6.6, 14.0, 8.4},
}};

/// Latency per step in us, [hw][algo][proto] (tuning.cc `hwLat`).
inline constexpr std::array<std::array<std::array<double, nccl_num_protos>, nccl_num_algos>, nccl_num_hw>
    nccl_hw_latency = {{
        /* nvlink */ {{/* tree */ {0.6, 1.25, 4.0}, /* ring */ {0.6, 1.9, 3.4}}},
        /* pci    */ {{/* tree */ {1.0, 1.9, 4.0}, /* ring */ {1.0, 2.5, 5.7}}},
        /* net    */ {{/* tree */ {5.0, 8.5, 14.0}, /* ring */ {2.7, 4.0, 14.0}}},
    }};

/// LL protocol bandwidth cap in GB/s, [generation][node class] (tuning.cc `llMaxBws`). NCCL
/// indexes the row by GPU generation on one node and by CPU vendor (Intel row 0, AMD row 1)
/// across nodes; like Inductor we take row 0 (Intel) across nodes. Hopper's row is NCCL's
/// current one (141/45/35; the comm_analysis.py we read repeats Ampere's 87.7/22.5/19.0 for
/// Hopper, as older NCCL did); Blackwell's is 2x Hopper.
inline constexpr std::array<std::array<double, nccl_num_node_classes>, num_gpu_generations> ll_max_bandwidth = {{
    /* volta     */ {39.0, 39.0, 20.4},
    /* ampere    */ {87.7, 22.5, 19.0},
    /* hopper    */ {141.0, 45.0, 35.0},
    /* blackwell */ {2 * 141.0, 2 * 45.0, 2 * 35.0},
}};

/// Ring LL128 bandwidth cap per channel in GB/s, [generation][node class]
/// (tuning.cc `perChMaxRingLL128Bws`).
inline constexpr std::array<std::array<double, nccl_num_node_classes>, num_gpu_generations>
    per_channel_max_ring_ll128_bandwidth = {{
        {20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 36.7}, {2 * 36.7, 2 * 36.7, 2 * 36.7}}};

/// Tree LL128 bandwidth cap per channel in GB/s, [generation][node class]
/// (tuning.cc `perChMaxTreeLL128Bws`).
inline constexpr std::array<std::array<double, nccl_num_node_classes>, num_gpu_generations>
    per_channel_max_tree_ll128_bandwidth = {{
        {20.0, 20.0, 20.0}, {20.0, 20.0, 20.0}, {36.7, 36.7, 29.0}, {2 * 36.7, 2 * 36.7, 2 * 29.0}}};

/// Tree bandwidth cap per channel in GB/s, [generation][node class] (tuning.cc `perChMaxTreeBws`).
inline constexpr std::array<std::array<double, nccl_num_node_classes>, num_gpu_generations>
    per_channel_max_tree_bandwidth = {{
        {26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {2 * 38.7, 2 * 41.4, 2 * 36.0}}};

/// NCCL's bandwidth of one NVLink in GB/s by generation (src/graph/topo.h SM70_NVLINK_BW 20.0,
/// SM80 20.0, SM90 20.6, SM100 40.1): what its topology search sums over a GPU's links.
inline constexpr std::array<double, num_gpu_generations> nccl_nvlink_bandwidth_per_link = {20.0, 20.0, 20.6, 40.1};

/// Tree all-reduce bandwidth correction, [proto][log2(bytes / 64)] (tuning.cc
/// `treeCorrectionFactor`: "trees are not perfectly sticking to the model for medium sizes").
inline constexpr std::array<std::array<double, nccl_num_tree_corrections>, nccl_num_protos> nccl_tree_correction = {{
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9},
}};

static_assert(nccl_base_latency.size() == nccl_num_algos && nccl_base_latency[0].size() == nccl_num_protos);
static_assert(nccl_hw_latency.size() == nccl_num_hw && nccl_hw_latency[0].size() == nccl_num_algos &&
              nccl_hw_latency[0][0].size() == nccl_num_protos);
static_assert(ll_max_bandwidth.size() == num_gpu_generations);

/// "tree", "ring".
constexpr std::string_view to_string(nccl_algo a) { return a == nccl_algo::tree ? "tree" : "ring"; }
/// "LL", "LL128", "Simple" (NCCL's spelling).
constexpr std::string_view to_string(nccl_proto p) {
  return p == nccl_proto::ll ? "LL" : p == nccl_proto::ll128 ? "LL128" : "Simple";
}

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

/// How a device runs collectives: NCCL on GPUs, or the threads backend's direct shared-memory
/// algorithm (every member reads every other member's buffer).
enum class collective_backend : std::uint8_t { nccl, threads };

/// What the cost model knows of one rank's device and its links. Rates are what kernels reach
/// (not datasheet peaks) wherever a measurement is known; each preset says where its numbers
/// come from.
struct device_spec {
  /// Printed name ("H200 SXM").
  std::string name;
  /// NCCL's generation index (selects rows of the NCCL tables).
  gpu_generation generation = gpu_generation::hopper;
  /// NCCL, or the CPU threads backend.
  collective_backend backend = collective_backend::nccl;
  /// FLOP/s of f32 on the vector units (CUDA cores): f32 matmul without TF32, and every
  /// pointwise op.
  double flops_f32 = 0;
  /// FLOP/s of f32 matmul on TF32 tensor cores (used when cost_model::allow_tf32).
  double flops_tf32 = 0;
  /// FLOP/s of bf16 and f16 matmul (dense, tensor cores).
  double flops_bf16 = 0;
  /// FLOP/s of f64 matmul.
  double flops_f64 = 0;
  /// Device memory bandwidth reached by streaming kernels, B/s.
  double memory_bw = 0;
  /// NVLink bandwidth per GPU and direction (datasheet), B/s; 0 without NVLink.
  double nvlink_bw = 0;
  /// Number of NVLinks per GPU (NCCL's bandwidth is links x its per-link figure; we also take
  /// it as the channel count for NCCL's per-channel caps).
  int nvlink_links = 0;
  /// Fraction of NCCL's topology bandwidth that large Simple-protocol rings reach (fit to
  /// measurements; 1 = NCCL's own model).
  double nccl_efficiency = 1.0;
  /// PCIe bandwidth per GPU and direction, B/s (GPU-to-GPU path when there is no NVLink).
  double pci_bw = 0;
  /// Network bandwidth per GPU (one NIC per GPU, rail-optimised, as DGX/HGX nodes), B/s.
  double net_bw = 0;
  /// GPUs (ranks) per node: groups larger than this span nodes.
  int gpus_per_node = 8;
  /// Overhead per kernel or collective launch, us.
  double launch_us = 0;
  /// threads backend only: hand-off to the communication workers and rendezvous of the members,
  /// us per peer (a collective on n ranks adds launch_us + (n - 1) x rendezvous_us).
  double rendezvous_us = 0;

  /// H100 SXM5 (80 GB HBM3, NVLink 4).
  ///  - Tensor-core peaks (NVIDIA H100 datasheet, dense): bf16 989 TFLOP/s, tf32 495, f32 (CUDA
  ///    cores) 67, f64 67. H100 SXM and H200 are the same GH100 chip at the same clocks and
  ///    power, so we use H200's measured 790 TFLOP/s bf16 (PERF.md; 80% of peak) and assume
  ///    80% of the other peaks.
  ///  - HBM3 3.35 TB/s (datasheet); we assume streaming kernels reach 85%.
  ///  - NVLink 4: 18 links, 900 GB/s bidirectional = 450 GB/s per direction (datasheet); NCCL
  ///    counts 18 x 20.6 = 370.8 GB/s, of which rings reach 89% (PERF.md: 331 GB/s all_reduce
  ///    busbw at 1 GiB on 2 H200, same NVLink).
  ///  - PCIe Gen5 x16 64 GB/s per direction; ConnectX-7 400 Gb/s = 50 GB/s per GPU.
  ///  - launch 4 us: PERF.md's eager 4 KiB all_reduce takes 11.9 us, NCCL's model 7.8 us of it.
  static device_spec h100() {
    device_spec d;
    d.name = "H100 SXM";
    d.generation = gpu_generation::hopper;
    d.flops_bf16 = 790e12;
    d.flops_tf32 = 0.8 * 494.7e12;
    d.flops_f32 = 0.8 * 66.9e12;
    d.flops_f64 = 0.8 * 66.9e12;
    d.memory_bw = 0.85 * 3.35e12;
    d.nvlink_bw = 450e9;
    d.nvlink_links = 18;
    d.nccl_efficiency = 331.0 / 370.8;
    d.pci_bw = 64e9;
    d.net_bw = 50e9;
    d.gpus_per_node = 8;
    d.launch_us = 4.0;
    return d;
  }
  /// H200 SXM (141 GB HBM3e): H100's compute and NVLink (same chip), HBM3e 4.8 TB/s
  /// (datasheet), 85% assumed reached. bf16 790 TFLOP/s and the NCCL efficiency are PERF.md's
  /// measurements on this part.
  static device_spec h200() {
    device_spec d = h100();
    d.name = "H200 SXM";
    d.memory_bw = 0.85 * 4.8e12;
    return d;
  }
  /// A100 SXM4 80 GB (NVLink 3).
  ///  - Datasheet peaks, dense: bf16 312 TFLOP/s, tf32 156, f32 19.5, f64 (tensor) 19.5; large
  ///    cuBLAS GEMMs reach about 85% (assumed, not measured here).
  ///  - HBM2e 2.04 TB/s (datasheet), 85% assumed reached.
  ///  - NVLink 3: 12 links, 600 GB/s bidirectional = 300 GB/s per direction; NCCL counts
  ///    12 x 20 = 240 GB/s; nccl-tests all_reduce busbw on DGX A100 is commonly reported near
  ///    230 GB/s, so 95%.
  ///  - PCIe Gen4 x16 32 GB/s; HDR InfiniBand 200 Gb/s = 25 GB/s per GPU.
  static device_spec a100() {
    device_spec d;
    d.name = "A100 SXM";
    d.generation = gpu_generation::ampere;
    d.flops_bf16 = 0.85 * 312e12;
    d.flops_tf32 = 0.85 * 156e12;
    d.flops_f32 = 0.85 * 19.5e12;
    d.flops_f64 = 0.85 * 19.5e12;
    d.memory_bw = 0.85 * 2.039e12;
    d.nvlink_bw = 300e9;
    d.nvlink_links = 12;
    d.nccl_efficiency = 0.95;
    d.pci_bw = 32e9;
    d.net_bw = 25e9;
    d.gpus_per_node = 8;
    d.launch_us = 4.0;
    return d;
  }
  /// The CPU threads backend (every rank a thread of one process), roughly, so predictions on
  /// CI mean something. Measured on the 2-core CI container (bench/bench_compute.cpp,
  /// bench/bench_calibrate.cpp): matmul 20 to 37 GFLOP/s f32 on one core, 27 bf16, 13 f64;
  /// large memcpy 2.4 to 3.3 GB/s, fused pointwise loops about 4 GB/s, collectives about 2 GB/s
  /// of member traffic; a collective's round trip at 4 KiB is 21 to 37 us on 2 ranks and 90 to
  /// 130 us on 4 (ranks and their workers share the cores). Calibrate (bench_calibrate) for
  /// real numbers on another machine.
  static device_spec cpu_threads() {
    device_spec d;
    d.name = "CPU threads";
    d.generation = gpu_generation::volta;  // unused: the threads backend has no NCCL tables
    d.backend = collective_backend::threads;
    d.flops_bf16 = 20e9;
    d.flops_tf32 = 20e9;
    d.flops_f32 = 20e9;
    d.flops_f64 = 10e9;
    d.memory_bw = 2.5e9;
    d.gpus_per_node = 1 << 20;
    d.launch_us = 2.0;
    d.rendezvous_us = 30.0;
    return d;
  }
};

// ---------------------------------------------------------------------------------------------
// Calibration
// ---------------------------------------------------------------------------------------------

/// Measured collective times: (op name, group size, bytes) -> us, with log-log interpolation
/// between measured sizes. `bytes` is the op's input bytes on one rank (summed over a
/// coalesced op's inputs), the same quantity cost_model::collective_us reads from the inputs.
/// CSV form, one point a line, an optional header, `#` comments: `op,group_size,bytes,us`.
/// A table also records where it was measured (measured_on(): the GPU, driver, CUDA and NCCL
/// versions, or the CPU for the threads backend), saved as `#@ key: value` lines, which other
/// CSV readers take for comments.
class calibration {
 public:
  /// One measured point.
  struct point {
    std::string op;
    int group_size = 0;
    std::int64_t bytes = 0;
    double us = 0;
    friend bool operator==(const point&, const point&) = default;
  };

  /// Records a point; a later point for the same op, group size and bytes replaces the earlier.
  CCGRAPH_DECL void add(std::string_view op, int group_size, std::int64_t bytes, double us);

  /// True when there are points for `op` at `group_size`.
  CCGRAPH_DECL bool has(std::string_view op, int group_size) const;
  /// Number of points.
  CCGRAPH_DECL std::size_t size() const;
  /// True without points.
  bool empty() const { return table_.empty(); }
  /// Every point, ordered by op, group size and bytes.
  CCGRAPH_DECL std::vector<point> points() const;

  /// The time of `op` on `group_size` ranks for `bytes`: log-log linear between the two
  /// nearest measured sizes; below the smallest, the smallest's time (latency-bound); above the
  /// largest, the largest's time plus the extra bytes at the bandwidth of the last segment. No
  /// value without points for (op, group_size).
  CCGRAPH_DECL std::optional<double> interpolate(std::string_view op, int group_size, std::int64_t bytes) const;

  /// Where the points were measured: key -> value, e.g. `device` ("NVIDIA H200"), `driver`,
  /// `cuda_runtime`, `nccl`, `gpus`, `backend`, `cpu`, `date`. Empty when nobody said.
  const std::map<std::string, std::string>& measured_on() const { return measured_on_; }
  /// Records one fact of where the points were measured (a later value for `key` replaces the
  /// earlier). The key is a word of letters, digits and `_`; the value one line of text.
  CCGRAPH_DECL void set_measured_on(std::string_view key, std::string_view value);

  /// Adds the points of a CSV table (`op,group_size,bytes,us` lines; a header line with those
  /// names, blank lines and lines starting with `#` are skipped) and its `#@ key: value` lines
  /// (measured_on()). A malformed line throws an error naming its line number and content, and
  /// so does a table measured elsewhere than the points this one already holds (a `#@` value
  /// other than `date` that differs from this table's for the same key): one table's
  /// interpolation must not mix two machines' times. Nothing is added on an error.
  CCGRAPH_DECL void load(std::istream& in);
  /// Writes the table as CSV: the measured_on() lines, a header line, then the points ordered
  /// by op, group size and bytes; load() reads it back to an equal table.
  CCGRAPH_DECL void save(std::ostream& out) const;

  friend bool operator==(const calibration&, const calibration&) = default;

 private:
  using key_t = std::pair<std::string, int>;
  std::map<key_t, std::map<std::int64_t, double>> table_;
  std::map<std::string, std::string> measured_on_;

  CCGRAPH_DECL static std::string trim(std::string_view s);
  CCGRAPH_DECL static std::vector<std::string> split_csv(const std::string& line);
  CCGRAPH_DECL static std::optional<std::int64_t> parse_int(const std::string& s);
  CCGRAPH_DECL static std::optional<double> parse_double(const std::string& s);
};

// ---------------------------------------------------------------------------------------------
// The analytical models
// ---------------------------------------------------------------------------------------------

/// NCCL's choice for one collective, and its predicted time (launch overhead included).
struct nccl_estimate {
  nccl_algo algo = nccl_algo::ring;
  nccl_proto proto = nccl_proto::simple;
  double us = 0;
};

namespace detail {

/// floor(log2(v)) for v >= 1, as NCCL's log2i; -1 for v <= 0.
constexpr int log2i(std::int64_t v) {
  int r = -1;
  while (v > 0) {
    v >>= 1;
    ++r;
  }
  return r;
}

/// The links NCCL would see for a group of `nranks` on device `d`: bus bandwidths in GB/s (what
/// NCCL calls nChannels x bw), the channel count, nodes, and the intra-node link kind.
struct nccl_topology {
  int nranks = 1;
  int nnodes = 1;
  int channels = 1;
  nccl_hw intra_hw = nccl_hw::nvlink;
  double bus_bw = 0;    // GB/s the algorithm runs at: intra-node on one node, else inter-node
  double intra_bw = 0;  // GB/s between GPUs of one node
  double net_bw = 0;    // GB/s of one GPU's NIC
};

CCGRAPH_DECL nccl_topology nccl_topology_of(const device_spec& d, int nranks);

/// NCCL's (latency us, algorithm bandwidth GB/s) of `coll` with `algo`/`proto` on topology `t`
/// (ncclTopoTuneModel); bandwidth 0 when NCCL would not use the pair.
CCGRAPH_DECL std::pair<double, double> nccl_lat_bw(const device_spec& d, const nccl_topology& t, nccl_coll coll,
                                             nccl_algo algo, nccl_proto proto);

/// NCCL's time for one (algo, proto) pair (ncclTopoGetAlgoTime), us without launch; negative
/// when the pair is not used.
CCGRAPH_DECL double nccl_algo_time(const device_spec& d, const nccl_topology& t, nccl_coll coll, nccl_algo algo,
                             nccl_proto proto, double bytes);

/// Bytes of one tensor.
CCGRAPH_DECL double bytes_of(const tensor_meta& m);


}  // namespace detail

/// Predicts node run times in microseconds for a scheduler: NCCL's analytical model for
/// collectives (or the threads backend's), a roofline for compute, and measured points from a
/// calibration table wherever it has them.
struct cost_model {
  /// The device every rank runs on.
  device_spec device = device_spec::h100();
  /// Measured collective times; they replace the analytical model for the ops and group sizes
  /// they cover.
  ccgraph::calibration measured;
  /// f32 matmuls run on TF32 tensor cores (PyTorch's allow_tf32); off by default, as in PyTorch.
  bool allow_tf32 = false;

  cost_model() = default;
  /// A model of `d`, with measured points `c`.
  explicit cost_model(device_spec d, ccgraph::calibration c = {}) : device(std::move(d)), measured(std::move(c)) {}

  /// NCCL's choice of algorithm and protocol for `coll` moving `bytes` on `nranks`, and its
  /// time: `bytes` as NCCL counts them (all_reduce, broadcast: the buffer; all_gather: the
  /// output; reduce_scatter: the input; all_to_all: one rank's send buffer). Tree only for
  /// all_reduce, as NCCL. For the threads backend, the direct model (algo ring, proto simple).
  CCGRAPH_DECL nccl_estimate nccl_collective(nccl_coll coll, double bytes, int nranks) const;

  /// Time of collective `op` on `inputs` (one rank's input metas) over `group_size` ranks: the
  /// calibration's interpolation when it has points for the op (for a coalesced op, else for
  /// its single-tensor op, op_traits<O>::single_op) at that group size, else the analytical
  /// model of the NCCL collective op_traits<O>::cost names. Coalesced ops are one launch moving
  /// the sum of their tensors. A collective's cost reads its inputs and the group size only.
  CCGRAPH_DECL double collective_us(const ops::collective_op& op, const std::vector<tensor_meta>& inputs, int group_size) const;

  /// Roofline time of a compute node, from what op_traits<O>::cost describes: max(FLOPs / peak,
  /// bytes / memory bandwidth) + launch. matmul: 2MNK FLOPs at the dtype's matmul peak,
  /// operands and result as bytes; pointwise: (output elements x ops in the fused expression)
  /// FLOPs at the f32 vector rate, inputs and output as bytes; cat, repeat, copy, contiguous:
  /// bytes only (contiguous is costed as the copy it is after a transpose: metas carry no
  /// strides). Ops that launch nothing (views, waits, placeholders, output): 0; collectives: 0
  /// (collective_us prices them).
  CCGRAPH_DECL double compute_us(const node& n) const;

  /// Time of any node: collective_us over the node's group size and argument metas for
  /// collectives, compute_us for the rest.
  CCGRAPH_DECL double estimate_us(const node& n) const;

 private:
  CCGRAPH_DECL static const tensor_meta& arg_meta(const node& n, std::size_t i);


  CCGRAPH_DECL double matmul_peak(dtype dt) const;

  CCGRAPH_DECL double roofline_us(double flops, double peak, double bytes) const;

  /// The threads backend (runtime/cpu_collectives.hpp): each member's worker reads every
  /// member's buffer and writes its own, freshly allocated, output (the kernel zero-fills its
  /// pages on first touch: one more write), all members at once through one memory system.
  /// Bytes moved per member, S as nccl_collective counts them: all_reduce n reads + 2 writes of
  /// S; all_gather (S = output), broadcast, all_to_all: 1 read + 2 writes of S; reduce_scatter
  /// (S = input): S read, 2 writes of S / n.
  CCGRAPH_DECL double threads_collective_us(nccl_coll coll, double bytes, int nranks) const;
};

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/schedule/impl/cost_model.ipp>
#endif
