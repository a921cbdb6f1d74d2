// tests/schedule/test_cost_model.cpp: the cost model (ccgraph/schedule/cost_model.hpp): the NCCL
// tables' dimensions (as torch's test_nccl_heuristics checks Inductor's), the analytical
// collective model's shape (monotone, NCCL's algorithm choices) and its H200 figures against
// PERF.md's measurements, the compute roofline, and the calibration table (CSV, interpolation,
// errors).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <ccgraph/ir/graph.hpp>
#include <ccgraph/schedule/cost_model.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using i64 = std::int64_t;
constexpr i64 KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

/// f32 tensor of `bytes` as one dimension.
cg::tensor_meta f32_bytes(i64 bytes) { return {cg::dtype::f32, {bytes / 4}}; }

/// nccl-tests' all_reduce bus bandwidth in GB/s for `bytes` taking `us` on n ranks.
double all_reduce_busbw(double bytes, double us, int n) { return bytes / (us * 1e3) * 2.0 * (n - 1) / n; }

}  // namespace

// --- the tables: test_nccl_heuristics, in static_asserts ------------------------------------

TEST_CASE("cost_model.nccl_tables.dimensions") {
  // len(baseLat) == len(NCCL_ALGO); every row has len(NCCL_PROTO)
  static_assert(cg::nccl_base_latency.size() == cg::nccl_num_algos);
  static_assert(cg::nccl_base_latency[0].size() == cg::nccl_num_protos);
  static_assert(cg::nccl_base_latency[1].size() == cg::nccl_num_protos);
  // len(hwLat) == len(NCCL_HW); every hwLat[x] has len(NCCL_ALGO) rows of len(NCCL_PROTO)
  static_assert(cg::nccl_hw_latency.size() == cg::nccl_num_hw);
  static_assert(cg::nccl_hw_latency[0].size() == cg::nccl_num_algos);
  static_assert(cg::nccl_hw_latency[0][0].size() == cg::nccl_num_protos);
  // len(llMaxBws) == len(NVIDIA_GPU_TYPE)
  static_assert(cg::ll_max_bandwidth.size() == cg::num_gpu_generations);
  static_assert(cg::ll_max_bandwidth[0].size() == cg::nccl_num_node_classes);
  // The enumerations' sizes are the constants.
  static_assert(static_cast<std::size_t>(cg::nccl_algo::ring) + 1 == cg::nccl_num_algos);
  static_assert(static_cast<std::size_t>(cg::nccl_proto::simple) + 1 == cg::nccl_num_protos);
  static_assert(static_cast<std::size_t>(cg::nccl_hw::net) + 1 == cg::nccl_num_hw);
  static_assert(static_cast<std::size_t>(cg::gpu_generation::blackwell) + 1 == cg::num_gpu_generations);
  static_assert(cg::nccl_tree_correction.size() == cg::nccl_num_protos);
  // Hopper's figures are the current NCCL ones, not the Ampere copy Inductor still carries.
  static_assert(cg::ll_max_bandwidth[static_cast<std::size_t>(cg::gpu_generation::hopper)][0] == 141.0);
  static_assert(cg::nccl_nvlink_bandwidth_per_link[static_cast<std::size_t>(cg::gpu_generation::hopper)] == 20.6);

  for (auto& row : cg::nccl_base_latency)
    for (double v : row) CHECK(v > 0);
  for (auto& hw : cg::nccl_hw_latency)
    for (auto& row : hw)
      for (double v : row) CHECK(v > 0);
  for (auto& row : cg::ll_max_bandwidth)
    for (double v : row) CHECK(v > 0);
}

// --- the analytical collective model --------------------------------------------------------

TEST_CASE("cost_model.nccl.bigger_messages_take_longer") {
  for (const auto& dev : {cg::device_spec::h200(), cg::device_spec::a100(), cg::device_spec::cpu_threads()}) {
    const cg::cost_model m(dev);
    for (auto coll : {cg::nccl_coll::all_reduce, cg::nccl_coll::all_gather, cg::nccl_coll::reduce_scatter,
                      cg::nccl_coll::broadcast, cg::nccl_coll::all_to_all})
      for (int n : {2, 4, 8, 16, 64}) {
        double prev = 0;
        for (i64 b = 64; b <= 4 * GiB; b *= 4) {
          const double t = m.nccl_collective(coll, double(b), n).us;
          INFO(dev.name, " coll ", int(coll), " n=", n, " bytes=", b);
          CHECK(t > prev);
          prev = t;
        }
      }
  }
}

TEST_CASE("cost_model.nccl.all_gather_more_ranks_take_longer") {
  // The same input per rank gathered over more ranks: more data and more steps.
  for (const auto& dev : {cg::device_spec::h200(), cg::device_spec::a100(), cg::device_spec::cpu_threads()}) {
    const cg::cost_model m(dev);
    const cg::ops::collective_op ag = cg::ops::all_gather_into_tensor{0};
    for (i64 b : {4 * KiB, 1 * MiB, 64 * MiB}) {
      double prev = 0;
      for (int n : {2, 4, 8, 16, 32}) {
        const double t = m.collective_us(ag, {f32_bytes(b)}, n);
        INFO(dev.name, " bytes=", b, " n=", n);
        CHECK(t > prev);
        prev = t;
      }
    }
  }
}

TEST_CASE("cost_model.nccl.algorithm_choice") {
  const cg::cost_model m(cg::device_spec::h200());
  // Small messages: a low-latency protocol; large ones: the ring with Simple, as NCCL picks.
  for (int n : {2, 8}) {
    const auto small = m.nccl_collective(cg::nccl_coll::all_reduce, 4 * KiB, n);
    CHECK(small.proto == cg::nccl_proto::ll);
    const auto large = m.nccl_collective(cg::nccl_coll::all_reduce, 1 * GiB, n);
    CHECK(large.algo == cg::nccl_algo::ring);
    CHECK(large.proto == cg::nccl_proto::simple);
  }
  // Across nodes the tree's log-depth latency wins for small all_reduces, the ring for large.
  const auto small = m.nccl_collective(cg::nccl_coll::all_reduce, 4 * KiB, 32);
  CHECK(small.algo == cg::nccl_algo::tree);
  CHECK(small.proto == cg::nccl_proto::ll);
  CHECK(m.nccl_collective(cg::nccl_coll::all_reduce, 1 * GiB, 32).algo == cg::nccl_algo::ring);
  // Only all_reduce has a tree.
  CHECK(m.nccl_collective(cg::nccl_coll::all_gather, 4 * KiB, 32).algo == cg::nccl_algo::ring);
  // Without NVLink (PCI), no LL128.
  cg::device_spec pcie = cg::device_spec::h100();
  pcie.nvlink_links = 0;
  pcie.nvlink_bw = 0;
  const cg::cost_model mp(pcie);
  for (i64 b = 64; b <= GiB; b *= 2)
    CHECK(mp.nccl_collective(cg::nccl_coll::all_reduce, double(b), 8).proto != cg::nccl_proto::ll128);
  // A single rank moves nothing: one launch.
  CHECK(m.nccl_collective(cg::nccl_coll::all_reduce, 1 * GiB, 1).us == doctest::Approx(m.device.launch_us));
}

TEST_CASE("cost_model.h200.all_reduce_matches_perf_md") {
  // PERF.md, raw NCCL all_reduce on 2 H200 (NVLink, NCCL 2.28, NVLS off): busbw 227 GB/s at
  // 16 MiB, 287 at 128 MiB, 331 at 1 GiB; 11.9 us per 4 KiB op, eager.
  const cg::cost_model m(cg::device_spec::h200());
  const cg::ops::collective_op ar = cg::ops::all_reduce{cg::reduce_op::sum};
  struct ref {
    i64 bytes;
    double busbw;
  };
  for (auto r : {ref{16 * MiB, 227}, ref{128 * MiB, 287}, ref{1 * GiB, 331}}) {
    const double us = m.collective_us(ar, {f32_bytes(r.bytes)}, 2);
    const double busbw = all_reduce_busbw(double(r.bytes), us, 2);
    INFO("bytes=", r.bytes, " predicted ", us, " us, busbw ", busbw, " GB/s vs ", r.busbw);
    CHECK(busbw > 0.75 * r.busbw);
    CHECK(busbw < 1.25 * r.busbw);
  }
  const double small = m.collective_us(ar, {f32_bytes(4 * KiB)}, 2);
  CHECK(small == doctest::Approx(11.9).epsilon(0.25));
  // H100 has the same NVLink: same collective figures.
  const cg::cost_model h100(cg::device_spec::h100());
  CHECK(h100.collective_us(ar, {f32_bytes(1 * GiB)}, 2) == doctest::Approx(m.collective_us(ar, {f32_bytes(1 * GiB)}, 2)));
}

TEST_CASE("cost_model.collective_us.every_kind") {
  const cg::cost_model m(cg::device_spec::h200());
  const int n = 4;
  const auto in = f32_bytes(64 * MiB);
  const double ar = m.collective_us(cg::ops::all_reduce{cg::reduce_op::sum}, {in}, n);
  const double ag = m.collective_us(cg::ops::all_gather_into_tensor{n}, {in}, n);
  const double rs = m.collective_us(cg::ops::reduce_scatter_tensor{cg::reduce_op::sum, n}, {in}, n);
  const double bc = m.collective_us(cg::ops::broadcast{0}, {in}, n);
  const double a2a = m.collective_us(cg::ops::all_to_all_single{{16, 16, 16, 16}, {16, 16, 16, 16}}, {in}, n);
  for (double t : {ar, ag, rs, bc, a2a}) CHECK(t > 0);
  // Ring all_reduce = reduce_scatter + all_gather of the same buffer: about twice either.
  CHECK(ar == doctest::Approx(2 * rs).epsilon(0.1));
  // all_gather's output is n x the input: n times the reduce_scatter of the same input.
  CHECK(ag == doctest::Approx(n * rs).epsilon(0.1));
  // all_to_all sends (n-1)/n of its input once: cheaper than an all_reduce of it.
  CHECK(a2a < ar);

  // Coalesced: the sum of the bytes in one launch, so cheaper than separate ops, and the same as
  // one op on the total.
  const auto quarter = f32_bytes(16 * MiB);
  const double one = m.collective_us(cg::ops::all_reduce{cg::reduce_op::sum}, {quarter}, n);
  const double coalesced =
      m.collective_us(cg::ops::all_reduce_coalesced{cg::reduce_op::sum}, {quarter, quarter, quarter, quarter}, n);
  CHECK(coalesced == doctest::Approx(ar));
  CHECK(coalesced < 4 * one);
  const auto small = f32_bytes(4 * KiB);
  const double ags = m.collective_us(cg::ops::all_gather_into_tensor{n}, {small}, n);
  const double agc = m.collective_us(cg::ops::all_gather_into_tensor_coalesced{n}, {small, small, small}, n);
  CHECK(agc < 3 * ags);
  CHECK(m.collective_us(cg::ops::reduce_scatter_tensor_coalesced{cg::reduce_op::sum, n}, {in, in}, n) ==
        doctest::Approx(m.collective_us(cg::ops::reduce_scatter_tensor{cg::reduce_op::sum, n}, {f32_bytes(128 * MiB)}, n)));
}

TEST_CASE("cost_model.collective_us.reduce_and_point_to_point") {
  const cg::cost_model m(cg::device_spec::h200());
  const auto in = f32_bytes(64 * MiB);
  // A ring reduce moves what a broadcast does.
  CHECK(m.collective_us(cg::ops::reduce{cg::reduce_op::sum, 0}, {in}, 4) ==
        doctest::Approx(m.collective_us(cg::ops::broadcast{0}, {in}, 4)));
  // A batch is a two-rank exchange of 2 x its larger direction's bytes, whatever the group.
  const cg::ops::batch_isend_irecv b{{{true, 1, in}, {false, 2, f32_bytes(16 * MiB)}}};
  const double two_rank = m.nccl_collective(cg::nccl_coll::all_to_all, 2.0 * 64 * MiB, 2).us;
  CHECK(m.collective_us(b, {in}, 4) == doctest::Approx(two_rank));
  CHECK(m.collective_us(b, {in}, 8) == doctest::Approx(two_rank));
  CHECK(m.nccl_collective(cg::nccl_coll::send_recv, 2.0 * 64 * MiB, 8).us == doctest::Approx(two_rank));
  CHECK(m.nccl_collective(cg::nccl_coll::reduce, 64.0 * MiB, 4).us ==
        doctest::Approx(m.nccl_collective(cg::nccl_coll::broadcast, 64.0 * MiB, 4).us));
}

TEST_CASE("cost_model.estimate_us.collective_node") {
  cg::graph g;
  auto* x = g.add_placeholder({cg::dtype::bf16, {4096, 4096}});
  auto* ar = g.add(cg::ops::all_reduce{cg::reduce_op::sum}, {{x, 0}}, cg::group_info{"0", {0, 1}});
  auto* w = g.add(cg::ops::wait_tensor{}, {{ar, 0}});
  g.set_output({{w, 0}});
  const cg::cost_model m(cg::device_spec::h200());
  const double expect = m.collective_us(cg::ops::all_reduce{cg::reduce_op::sum}, {x->meta()}, 2);
  CHECK(m.estimate_us(*ar) == doctest::Approx(expect));
  CHECK(m.compute_us(*ar) == 0);
  CHECK(m.estimate_us(*w) == 0);
  CHECK(m.estimate_us(*x) == 0);
  CHECK(m.estimate_us(*g.output_node()) == 0);
}

// --- the compute roofline -------------------------------------------------------------------

TEST_CASE("cost_model.roofline.matmul_bf16_8192_h200") {
  // PERF.md: ~790 TFLOP/s bf16 measured on one H200; 2 x 8192^3 = 1.1e12 FLOPs -> ~1.39 ms.
  cg::graph g;
  auto* a = g.add_placeholder({cg::dtype::bf16, {8192, 8192}});
  auto* b = g.add_placeholder({cg::dtype::bf16, {8192, 8192}});
  auto* mm = g.add(cg::ops::matmul{}, {{a, 0}, {b, 0}});
  const cg::cost_model m(cg::device_spec::h200());
  const double us = m.estimate_us(*mm);
  CHECK(cg::detail::matmul_flops(8192, 8192, 8192) == 2 * i64{8192} * 8192 * 8192);
  CHECK(us == doctest::Approx(1.1e12 / 790e12 * 1e6).epsilon(0.03));
  CHECK(us > 1300);
  CHECK(us < 1500);
  // f32 without TF32 runs on the CUDA cores: much slower; with TF32 in between.
  cg::graph g32;
  auto* a32 = g32.add_placeholder({cg::dtype::f32, {8192, 8192}});
  auto* mm32 = g32.add(cg::ops::matmul{}, {{a32, 0}, {a32, 0}});
  cg::cost_model m32(cg::device_spec::h200());
  const double cuda_cores = m32.compute_us(*mm32);
  m32.allow_tf32 = true;
  const double tf32 = m32.compute_us(*mm32);
  CHECK(cuda_cores > tf32);
  CHECK(tf32 > us);
}

TEST_CASE("cost_model.roofline.pointwise_is_bytes_bound") {
  cg::graph g;
  const i64 n = 8192;
  auto* a = g.add_placeholder({cg::dtype::bf16, {n, n}});
  auto* b = g.add_placeholder({cg::dtype::bf16, {n, n}});
  auto* pw = g.add(cg::ops::pointwise{"fused_relu_mul", "mul(relu(%0), %1)", nullptr}, {{a, 0}, {b, 0}});
  auto* pw1 = g.add(cg::ops::pointwise{"fused_relu", "relu(%0)", nullptr}, {{a, 0}});
  const cg::cost_model m(cg::device_spec::h200());
  const double bytes = 3.0 * n * n * 2;  // two inputs and the output, bf16
  CHECK(m.compute_us(*pw) == doctest::Approx(m.device.launch_us + bytes / m.device.memory_bw * 1e6));
  CHECK(cg::detail::expr_op_count("mul(relu(%0), %1)") == 2);
  CHECK(cg::detail::expr_op_count("add(mul(gelu(%0), 2.), sub(%1, %0))") == 4);
  // Memory-bound: time follows bytes (2 vs 3 tensors), not the op count.
  CHECK((m.compute_us(*pw1) - m.device.launch_us) / (m.compute_us(*pw) - m.device.launch_us) ==
        doctest::Approx(2.0 / 3.0));
  // Bytes-only ops: cat, copy, repeat, contiguous; views cost nothing.
  auto* c = g.add(cg::ops::cat{0}, {{a, 0}, {b, 0}});
  CHECK(m.compute_us(*c) == doctest::Approx(m.device.launch_us + 4.0 * n * n * 2 / m.device.memory_bw * 1e6));
  auto* cp = g.add(cg::ops::copy{}, {{a, 0}, {b, 0}});
  CHECK(m.compute_us(*cp) == doctest::Approx(m.device.launch_us + 2.0 * n * n * 2 / m.device.memory_bw * 1e6));
  auto* rp = g.add(cg::ops::repeat{{2, 1}}, {{a, 0}});
  CHECK(m.compute_us(*rp) == doctest::Approx(m.device.launch_us + 3.0 * n * n * 2 / m.device.memory_bw * 1e6));
  auto* v = g.add(cg::ops::transpose{0, 1}, {{a, 0}});
  CHECK(m.compute_us(*v) == 0);
  auto* r = g.add(cg::ops::reshape{{n * n}}, {{a, 0}});
  CHECK(m.estimate_us(*r) == 0);
  auto* ct = g.add(cg::ops::contiguous{}, {{v, 0}});
  CHECK(m.compute_us(*ct) == doctest::Approx(m.compute_us(*cp)));
}

TEST_CASE("cost_model.roofline.cpu_threads") {
  // A 256^3 f32 matmul on the threads backend: compute-bound at ~20 GFLOP/s, ~1.7 ms (the CI
  // container measures 0.9 ms at 37 GFLOP/s for this size: the same order, as intended).
  cg::graph g;
  auto* a = g.add_placeholder({cg::dtype::f32, {256, 256}});
  auto* mm = g.add(cg::ops::matmul{}, {{a, 0}, {a, 0}});
  const cg::cost_model m(cg::device_spec::cpu_threads());
  CHECK(m.compute_us(*mm) == doctest::Approx(2.0 * 256 * 256 * 256 / 20e9 * 1e6 + 2.0));
  // Collectives: tens of us at small sizes, more with more ranks.
  const cg::ops::collective_op ar = cg::ops::all_reduce{cg::reduce_op::sum};
  const double t2 = m.collective_us(ar, {f32_bytes(4 * KiB)}, 2);
  const double t4 = m.collective_us(ar, {f32_bytes(4 * KiB)}, 4);
  CHECK(t2 > 10);
  CHECK(t2 < 100);
  CHECK(t4 > t2);
}

// --- calibration ----------------------------------------------------------------------------

TEST_CASE("calibration.csv.round_trip") {
  cg::calibration c;
  c.add("all_reduce", 2, 4096, 32.5);
  c.add("all_reduce", 2, 1 << 20, 1937.25);
  c.add("all_gather_into_tensor", 4, 4096, 95.7);
  c.add("all_reduce", 2, 4096, 31.0);  // replaces
  CHECK(c.size() == 3);
  std::ostringstream out;
  c.save(out);
  CHECK(out.str().rfind("op,group_size,bytes,us\n", 0) == 0);
  std::istringstream in(out.str());
  cg::calibration back;
  back.load(in);
  CHECK(back == c);
  CHECK(back.points().size() == 3);
  CHECK(back.has("all_reduce", 2));
  CHECK_FALSE(back.has("all_reduce", 4));
  CHECK(*back.interpolate("all_reduce", 2, 4096) == 31.0);

  // Comments, blank lines, spaces and CRLF are accepted.
  std::istringstream loose("# measured by hand\n\nop,group_size,bytes,us\r\n all_to_all_single , 2 , 1024 , 5.5 \n");
  cg::calibration l;
  l.load(loose);
  CHECK(l.size() == 1);
  CHECK(*l.interpolate("all_to_all_single", 2, 1024) == 5.5);
}

TEST_CASE("calibration.interpolate") {
  cg::calibration c;
  c.add("all_reduce", 2, 1024, 10);
  c.add("all_reduce", 2, 4096, 20);
  c.add("all_reduce", 2, 16384, 60);
  CHECK_FALSE(c.interpolate("all_reduce", 4, 1024).has_value());
  CHECK_FALSE(c.interpolate("all_gather_into_tensor", 2, 1024).has_value());
  // Log-log linear: halfway in log(bytes) is the geometric mean of the times.
  CHECK(*c.interpolate("all_reduce", 2, 2048) == doctest::Approx(std::sqrt(10.0 * 20.0)));
  CHECK(*c.interpolate("all_reduce", 2, 8192) == doctest::Approx(std::sqrt(20.0 * 60.0)));
  // Monotone between the points.
  CHECK(*c.interpolate("all_reduce", 2, 3000) > *c.interpolate("all_reduce", 2, 2000));
  // Below the smallest: clamped (latency-bound).
  CHECK(*c.interpolate("all_reduce", 2, 16) == 10);
  CHECK(*c.interpolate("all_reduce", 2, 0) == 10);
  // Above the largest: the last segment's bandwidth, (16384 - 4096) B per 40 us.
  CHECK(*c.interpolate("all_reduce", 2, 16384 + 12288) == doctest::Approx(100));
  // One point: clamped below, its own bandwidth above.
  cg::calibration one;
  one.add("broadcast", 8, 1000, 10);
  CHECK(*one.interpolate("broadcast", 8, 10) == 10);
  CHECK(*one.interpolate("broadcast", 8, 3000) == doctest::Approx(30));
}

TEST_CASE("calibration.load.errors_name_the_line") {
  auto load = [](const std::string& text) {
    return error_of([&] {
      cg::calibration c;
      std::istringstream in(text);
      c.load(in);
    });
  };
  const std::string header = "op,group_size,bytes,us\n";
  auto e = load(header + "all_reduce,2,4096,30\nall_reduce,2,abc,31\n");
  CHECK(e.find("line 3") != std::string::npos);
  CHECK(e.find("all_reduce,2,abc,31") != std::string::npos);
  CHECK(e.find("bytes") != std::string::npos);
  e = load("all_reduce,2,4096\n");
  CHECK(e.find("line 1") != std::string::npos);
  CHECK(e.find("expected 4 fields") != std::string::npos);
  CHECK(e.find("\"all_reduce,2,4096\"") != std::string::npos);
  CHECK(load(header + "all_reduce,0,4096,30\n").find("line 2: group_size") != std::string::npos);
  CHECK(load(header + "all_reduce,2,-1,30\n").find("line 2: bytes") != std::string::npos);
  CHECK(load(header + "all_reduce,2,4096,-3\n").find("line 2: us") != std::string::npos);
  CHECK(load(header + "all_reduce,2,4096,nan\n").find("line 2: us") != std::string::npos);
  CHECK(load(header + ",2,4096,3\n").find("line 2: empty op") != std::string::npos);
  CHECK(load(header + "all_reduce,2,4096,3x\n").find("line 2: us") != std::string::npos);
  // A failed load adds nothing.
  cg::calibration c;
  c.add("all_reduce", 2, 1, 1);
  std::istringstream bad("all_reduce,2,8,2\nbroken\n");
  CHECK_THROWS_AS(c.load(bad), cg::error);
  CHECK(c.size() == 1);
}

TEST_CASE("calibration.measured_on") {
  cg::calibration c;
  CHECK(c.measured_on().empty());
  c.set_measured_on("device", "NVIDIA H200");
  c.set_measured_on("nccl", " 2.28.3 ");  // trimmed
  c.set_measured_on("driver", "580.159.04");
  c.add("all_reduce", 2, 4096, 30);
  CHECK(c.measured_on().at("nccl") == "2.28.3");
  std::ostringstream out;
  c.save(out);
  // The facts first, as lines other CSV readers skip, in key order.
  CHECK(out.str().rfind("#@ device: NVIDIA H200\n#@ driver: 580.159.04\n#@ nccl: 2.28.3\nop,group_size,bytes,us\n", 0) == 0);
  cg::calibration back;
  std::istringstream in(out.str());
  back.load(in);
  CHECK(back == c);
  CHECK(back.measured_on() == c.measured_on());

  // Bad keys and values are refused by name.
  CHECK(error_of([&] { c.set_measured_on("", "x"); }).find("key ''") != std::string::npos);
  CHECK(error_of([&] { c.set_measured_on("gpu name", "x"); }).find("key 'gpu name'") != std::string::npos);
  CHECK(error_of([&] { c.set_measured_on("device", "a\nb"); }).find("'device' must be one line") != std::string::npos);

  // Points of another machine are not mixed into a table: the load fails, naming both values,
  // and adds nothing (points or facts).
  std::istringstream other("#@ device: NVIDIA H100 80GB HBM3\n#@ nccl: 2.28.3\nall_reduce,2,8192,50\n");
  const auto e = error_of([&] { back.load(other); });
  CHECK(e.find("line 1") != std::string::npos);
  CHECK(e.find("device 'NVIDIA H100 80GB HBM3'") != std::string::npos);
  CHECK(e.find("device 'NVIDIA H200'") != std::string::npos);
  CHECK(back == c);
  // The same machine's points merge; an empty table takes the loaded facts.
  std::istringstream same("#@ device: NVIDIA H200\nall_reduce,2,8192,50\n");
  back.load(same);
  CHECK(back.size() == 2);
  // Another day's table of the same machine merges too: `date` says when, not where.
  back.set_measured_on("date", "2026-11-26T10:00:00Z");
  std::istringstream later("#@ date: 2026-11-27T10:00:00Z\n#@ device: NVIDIA H200\nall_reduce,2,16384,70\n");
  back.load(later);
  CHECK(back.size() == 3);
  CHECK(back.measured_on().at("date") == "2026-11-27T10:00:00Z");
  cg::calibration fresh;
  fresh.set_measured_on("device", "unknown");  // no points yet: the file's facts win
  std::istringstream again(out.str());
  fresh.load(again);
  CHECK(fresh.measured_on().at("device") == "NVIDIA H200");
  // A malformed fact line names its line.
  std::istringstream broken("#@ device NVIDIA\n");
  CHECK(error_of([&] { fresh.load(broken); }).find("line 1: expected '#@ key: value'") != std::string::npos);
  std::istringstream bad_key("#@ gpu name: x\n");
  CHECK(error_of([&] { cg::calibration z; z.load(bad_key); }).find("line 1") != std::string::npos);
}

TEST_CASE("cost_model.calibration_replaces_the_analytic_model") {
  cg::calibration c;
  c.add("all_reduce", 2, 4096, 40);
  c.add("all_reduce", 2, 16384, 80);
  const cg::cost_model m(cg::device_spec::h200(), c);
  const cg::cost_model analytic(cg::device_spec::h200());
  const cg::ops::collective_op ar = cg::ops::all_reduce{cg::reduce_op::sum};
  CHECK(m.collective_us(ar, {f32_bytes(8192)}, 2) == doctest::Approx(std::sqrt(40.0 * 80.0)));
  // Other group sizes and ops: analytic.
  CHECK(m.collective_us(ar, {f32_bytes(8192)}, 4) == analytic.collective_us(ar, {f32_bytes(8192)}, 4));
  const cg::ops::collective_op ag = cg::ops::all_gather_into_tensor{2};
  CHECK(m.collective_us(ag, {f32_bytes(8192)}, 2) == analytic.collective_us(ag, {f32_bytes(8192)}, 2));
  // A coalesced op without its own points uses its single-tensor op's, on the summed bytes.
  const cg::ops::collective_op arc = cg::ops::all_reduce_coalesced{cg::reduce_op::sum};
  CHECK(m.collective_us(arc, {f32_bytes(4096), f32_bytes(4096)}, 2) == doctest::Approx(std::sqrt(40.0 * 80.0)));
  // Nodes go through it too.
  cg::graph g;
  auto* x = g.add_placeholder({cg::dtype::f32, {4096}});
  auto* n = g.add(cg::ops::all_reduce{cg::reduce_op::sum}, {{x, 0}}, cg::group_info{"0", {0, 1}});
  CHECK(m.estimate_us(*n) == doctest::Approx(80));
}
