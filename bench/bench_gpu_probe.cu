// bench_gpu_probe: where the time of PERF.md's GPU workloads goes, measured with raw CUDA,
// NCCL and cuBLASLt calls (one thread per GPU), so that each cost ccgraph adds or hides can
// be read as a difference between two rows:
//   1. per-collective cost of a 4 KiB all_reduce: one stream; the two cross-stream hops
//      ccgraph's eager path makes; only the join hop; and host-only issue cost;
//   2. a GEMM beside an all_reduce (the seed program's overlap at N=8192): each alone, both at
//      once, with cuBLASLt's SM-count target leaving SMs free and NCCL's CTA cap;
//   3. (`bench_gpu_probe zero_sm`, only this part) the same GEMM beside collectives that take no
//      SMs: NCCL 2.28's zero-CTA all_gather / all_to_all between symmetric windows, an
//      all_reduce made of them, and plain peer copies (what the copy-engine all_reduce uses).
// Prints one table per part.
// This program calls no op with a CUDA kernel of its own (cuda_impl): skip compiling them all
// (the in-tree build passes the macro already: bench/CMakeLists.txt).
#ifndef CCGRAPH_CUDA_NO_OP_KERNELS
#define CCGRAPH_CUDA_NO_OP_KERNELS
#endif
#include <ccgraph/cuda.hpp>

#include "bench_args.hpp"

#include <cuda_bf16.h>

#include "../examples/programs.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <initializer_list>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace cg = ccgraph;
namespace cc = ccgraph::cuda;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Median over 5 repetitions of the GPU time per step of a loop of `iters` steps on `s`.
template <class F>
double per_step_us(cudaStream_t s, int iters, F&& step) {
  for (int i = 0; i < 20; ++i) step(i);
  CCGRAPH_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> reps;
  for (int r = 0; r < 5; ++r) {
    auto a = cc::event::timed(), b = cc::event::timed();
    a.record(s);
    for (int i = 0; i < iters; ++i) step(i);
    b.record(s);
    CCGRAPH_CHECK_CUDA(cudaDeviceSynchronize());
    reps.push_back(cc::elapsed_ms(a, b) * 1e3 / iters);
  }
  return median(reps);
}

/// Host microseconds per step of one loop of `iters` steps (no synchronisation inside it).
double host_us_once(int iters, const std::function<void(int)>& step) {
  CCGRAPH_CHECK_CUDA(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) step(i);
  const auto t1 = std::chrono::steady_clock::now();
  CCGRAPH_CHECK_CUDA(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
}

/// Host microseconds per step of each of `steps`, measured in turns (one loop of each per
/// round, `rounds` rounds, medians): the host's speed drifts by tens of percent within a
/// run, so only variants timed side by side compare.
std::vector<double> host_us_interleaved(int iters, int rounds, const std::vector<std::function<void(int)>>& steps) {
  for (auto& f : steps) (void)host_us_once(iters / 4 + 1, f);
  std::vector<std::vector<double>> reps(steps.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t v = 0; v < steps.size(); ++v) reps[v].push_back(host_us_once(iters, steps[v]));
  std::vector<double> out;
  for (auto& v : reps) out.push_back(median(v));
  return out;
}

/// Host microseconds per step of `step` alone: median of 5 loops after a warm-up loop.
double host_us(int iters, const std::function<void(int)>& step) { return host_us_interleaved(iters, 5, {step})[0]; }

void row(int rank, const char* what, double v, const char* unit) {
  if (rank == 0) std::printf("| %-72s | %10.2f | %s |\n", what, v, unit);
  std::fflush(stdout);
}

/// A rank's communication stream as the nccl backend makes it: the highest priority.
cc::stream high_priority_stream() {
  int lo = 0, hi = 0;
  CCGRAPH_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  return cc::stream(cudaStreamNonBlocking, hi);
}

/// Fills each of `buffers` (`bytes` of bf16) with random-ish values that are not zeros
/// (0x3c00 + low bits), different per rank.
void fill_bf16(std::initializer_list<void*> buffers, std::size_t bytes, int rank) {
  std::vector<std::uint16_t> h(bytes / 2);
  for (std::size_t i = 0; i < h.size(); ++i)
    h[i] = static_cast<std::uint16_t>(0x3c00 + ((i + 977 * static_cast<std::size_t>(rank)) * 2654435761u >> 20) % 512);
  for (void* p : buffers) CCGRAPH_CHECK_CUDA(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice));
}

void per_op(int r, ncclComm_t comm) {
  cc::stream compute(cudaStreamNonBlocking);
  cc::stream comm_s = high_priority_stream();
  cc::event ready, done;
  void *a = nullptr, *b = nullptr;
  CCGRAPH_CHECK_CUDA(cudaMalloc(&a, 4096));
  CCGRAPH_CHECK_CUDA(cudaMalloc(&b, 4096));
  CCGRAPH_CHECK_CUDA(cudaMemset(a, 0, 4096));
  CCGRAPH_CHECK_CUDA(cudaMemset(b, 0, 4096));
  auto ar = [&](int i, cudaStream_t s) {
    CCGRAPH_CHECK_NCCL(ncclAllReduce(i % 2 ? b : a, i % 2 ? a : b, 1024, ncclFloat32, ncclSum, comm, s));
  };
  const int iters = 2000;
  if (r == 0) std::printf("\n| 4 KiB f32 all_reduce, per op | value | unit |\n|---|---:|---|\n");
  row(r, "one stream (raw NCCL)", per_step_us(compute.get(), iters, [&](int i) { ar(i, compute.get()); }), "us");
  row(r, "comm stream, both hops (ready record+wait, done record+wait)",
      per_step_us(compute.get(), iters,
                  [&](int i) {
                    ready.record(compute);
                    comm_s.wait(ready);
                    ar(i, comm_s.get());
                    done.record(comm_s);
                    compute.wait(done);
                  }),
      "us");
  row(r, "comm stream, join hop only (done record+wait)",
      per_step_us(compute.get(), iters,
                  [&](int i) {
                    ar(i, comm_s.get());
                    done.record(comm_s);
                    compute.wait(done);
                  }),
      "us");
  row(r, "comm stream, no hops (timed on the comm stream)",
      per_step_us(comm_s.get(), iters, [&](int i) { ar(i, comm_s.get()); }), "us");
  row(r, "host: ncclAllReduce call alone", host_us(iters, [&](int i) { ar(i, compute.get()); }), "us");
  row(r, "host: event record + stream wait (one hop)", host_us(iters, [&](int) {
        ready.record(compute);
        comm_s.wait(ready);
      }),
      "us");
  // The same, in a CUDA Graph of 64 ops; and what else tells ccgraph's recorded chain from raw
  // NCCL's (two GPUs: 14.6 against 6.0 us per op on 2026-11-24): in place on one buffer, in
  // memory from the stream-ordered pool (where ccgraph's arena comes from), on the high-priority
  // communication stream.
  void *pa = nullptr, *pb = nullptr;
  CCGRAPH_CHECK_CUDA(cudaMallocAsync(&pa, 4096, compute.get()));
  CCGRAPH_CHECK_CUDA(cudaMallocAsync(&pb, 4096, compute.get()));
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(pa, 0, 4096, compute.get()));
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(pb, 0, 4096, compute.get()));
  CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(compute.get()));
  struct graph_variant {
    bool hops = false, in_place = false, pool = false, comm_stream = false;
  };
  auto graph_us = [&](graph_variant v) {
    void* x = v.pool ? pa : a;
    void* y = v.in_place ? x : (v.pool ? pb : b);
    auto op = [&](int i, cudaStream_t s) {
      CCGRAPH_CHECK_NCCL(ncclAllReduce(i % 2 ? y : x, i % 2 ? x : y, 1024, ncclFloat32, ncclSum, comm, s));
    };
    cudaGraph_t graph = nullptr;
    cc::stream& on = v.comm_stream ? comm_s : compute;
    CCGRAPH_CHECK_CUDA(cudaStreamBeginCapture(on.get(), cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 64; ++i) {
      if (v.hops) {
        ready.record(compute);
        comm_s.wait(ready);
        op(i, comm_s.get());
        done.record(comm_s);
        compute.wait(done);
      } else {
        op(i, on.get());
      }
    }
    CCGRAPH_CHECK_CUDA(cudaStreamEndCapture(on.get(), &graph));
    cudaGraphExec_t exec = nullptr;
    CCGRAPH_CHECK_CUDA(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    std::size_t nodes = 0;
    CCGRAPH_CHECK_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
    const double us =
        per_step_us(compute.get(), 50, [&](int) { CCGRAPH_CHECK_CUDA(cudaGraphLaunch(exec, compute.get())); }) / 64;
    if (r == 0) std::printf("|   (graph of %zu nodes) | | |\n", nodes);
    CCGRAPH_CHECK_CUDA(cudaGraphExecDestroy(exec));
    CCGRAPH_CHECK_CUDA(cudaGraphDestroy(graph));
    return us;
  };
  row(r, "CUDA Graph of 64, one stream", graph_us({}), "us");
  row(r, "CUDA Graph of 64, both hops per op", graph_us({.hops = true}), "us");
  row(r, "CUDA Graph of 64, one stream, in place", graph_us({.in_place = true}), "us");
  row(r, "CUDA Graph of 64, one stream, pool memory", graph_us({.pool = true}), "us");
  row(r, "CUDA Graph of 64, one stream, in place, pool memory", graph_us({.in_place = true, .pool = true}), "us");
  row(r, "CUDA Graph of 64, the high-priority stream, in place, pool memory",
      graph_us({.in_place = true, .pool = true, .comm_stream = true}), "us");
  CCGRAPH_CHECK_CUDA(cudaFree(a));
  CCGRAPH_CHECK_CUDA(cudaFree(b));
  CCGRAPH_CHECK_CUDA(cudaFreeAsync(pa, compute.get()));
  CCGRAPH_CHECK_CUDA(cudaFreeAsync(pb, compute.get()));
  CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(compute.get()));
}

/// Milliseconds of one GEMM [n,n]x[n,n] bf16 with `carveout` SMs left free, one all_reduce of
/// `ar_bytes` on `comm_s` (0: none), or both launched together (all_reduce first).
void overlap(int r, ncclComm_t comm, const std::vector<ncclComm_t>& capped, const std::vector<int>& caps) {
  const std::int64_t n = 8192;
  const std::size_t bytes = static_cast<std::size_t>(n * n) * 2;
  cc::stream compute(cudaStreamNonBlocking);
  cc::stream comm_s = high_priority_stream();
  cc::stream_guard on(compute.get());
  void *a = nullptr, *c = nullptr, *x = nullptr, *y = nullptr;
  for (void** p : {&a, &c, &x, &y}) CCGRAPH_CHECK_CUDA(cudaMalloc(p, bytes));
  fill_bf16({a, x}, bytes, r);
  const cg::device dev = cg::device::cuda(r);
  cc::event joined;
  auto gemm = [&](int carveout) {
    cc::detail::gemm_sm_carveout() = carveout;
    cc::detail::gemm(dev, cg::dtype::bf16, n, n, n, a, n, false, a, n, false, c, n);
    cc::detail::gemm_sm_carveout() = 0;
  };
  auto all_reduce = [&](ncclComm_t cm) {
    CCGRAPH_CHECK_NCCL(ncclAllReduce(x, y, bytes / 2, ncclBfloat16, ncclSum, cm, comm_s.get()));
  };
  auto both = [&](int carveout, ncclComm_t cm, bool gemm_first) {
    cc::event start;
    start.record(compute);
    comm_s.wait(start);
    if (gemm_first) gemm(carveout);
    all_reduce(cm);
    if (!gemm_first) gemm(carveout);
    joined.record(comm_s);
    compute.wait(joined);
  };
  auto ms = [&](const std::function<void()>& step) {
    return per_step_us(compute.get(), 10, [&](int) { step(); }) / 1e3;
  };
  if (r == 0) std::printf("\n| GEMM 8192^3 bf16 beside all_reduce 128 MiB bf16 | value | unit |\n|---|---:|---|\n");
  const double g0 = ms([&] { gemm(0); });
  row(r, "GEMM alone", g0, "ms");
  const double a0 = ms([&] {
    cc::event s;
    s.record(compute);
    comm_s.wait(s);
    all_reduce(comm);
    joined.record(comm_s);
    compute.wait(joined);
  });
  row(r, "all_reduce alone", a0, "ms");
  row(r, "sum of the two", g0 + a0, "ms");
  for (int carve : {0, 8, 16, 24, 32, 48}) {
    row(r, ("GEMM alone, " + std::to_string(carve) + " SMs left free").c_str(), ms([&] { gemm(carve); }), "ms");
    row(r, ("both, all_reduce first, " + std::to_string(carve) + " SMs left free").c_str(),
        ms([&] { both(carve, comm, false); }), "ms");
  }
  row(r, "both, GEMM first, 0 SMs left free", ms([&] { both(0, comm, true); }), "ms");
  for (std::size_t i = 0; i < capped.size(); ++i) {
    const int cap = caps[i];
    row(r, ("all_reduce alone, NCCL maxCTAs " + std::to_string(cap)).c_str(), ms([&] {
          cc::event s;
          s.record(compute);
          comm_s.wait(s);
          all_reduce(capped[i]);
          joined.record(comm_s);
          compute.wait(joined);
        }),
        "ms");
    for (int carve : {0, cap})
      row(r, ("both, maxCTAs " + std::to_string(cap) + ", " + std::to_string(carve) + " SMs left free").c_str(),
          ms([&] { both(carve, capped[i], false); }), "ms");
  }
  for (void* p : {a, c, x, y}) CCGRAPH_CHECK_CUDA(cudaFree(p));
}

/// Sum of the `parts` bf16 slices of `in` (each `n8` groups of 8), in slice order with fp32
/// accumulation: the local half of an all_reduce made of an all_gather.
__global__ void sum_slices_bf16(const uint4* in, uint4* out, std::size_t n8, int parts) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n8; i += std::size_t{gridDim.x} * blockDim.x) {
    float acc[8] = {};
    for (int p = 0; p < parts; ++p) {
      const uint4 v = in[p * n8 + i];
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        acc[2 * k] += f.x;
        acc[2 * k + 1] += f.y;
      }
    }
    uint4 o;
    auto* h = reinterpret_cast<__nv_bfloat162*>(&o);
    for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
    out[i] = o;
  }
}

/// The same GEMM beside collectives that take no SMs: NCCL 2.28's copy-engine all_gather and
/// all_to_all on a zero-CTA communicator, between symmetric windows; an all_reduce made of
/// a copy into the window, the all_gather and a local sum of the slices.
void overlap_zero_sm(int r, int world, ncclComm_t comm, ncclComm_t ce) {
  const std::int64_t n = 8192;
  const std::size_t bytes = static_cast<std::size_t>(n * n) * 2;
  cc::stream compute(cudaStreamNonBlocking);
  cc::stream comm_s = high_priority_stream();
  cc::stream_guard on(compute.get());
  void *a = nullptr, *c = nullptr, *x = nullptr, *y = nullptr, *y2 = nullptr;
  for (void** p : {&a, &c, &x, &y, &y2}) CCGRAPH_CHECK_CUDA(cudaMalloc(p, bytes));
  fill_bf16({a, x}, bytes, r);
  void *sbuf = nullptr, *rbuf = nullptr;
  CCGRAPH_CHECK_NCCL(ncclMemAlloc(&sbuf, bytes));
  CCGRAPH_CHECK_NCCL(ncclMemAlloc(&rbuf, bytes * world));
  ncclWindow_t sw{}, rw{};
  CCGRAPH_CHECK_NCCL(ncclCommWindowRegister(ce, sbuf, bytes, &sw, NCCL_WIN_COLL_SYMMETRIC));
  CCGRAPH_CHECK_NCCL(ncclCommWindowRegister(ce, rbuf, bytes * world, &rw, NCCL_WIN_COLL_SYMMETRIC));
  CCGRAPH_CHECK_CUDA(cudaMemcpy(sbuf, x, bytes, cudaMemcpyDeviceToDevice));
  // The other rank's x, for plain peer copies (threads of one process share pointers).
  static std::atomic<void*> xs[2];
  void* peer_src = nullptr;
  if (world == 2) {
    xs[r].store(x);
    while (!(peer_src = xs[1 - r].load())) std::this_thread::yield();
    const cudaError_t pe = cudaDeviceEnablePeerAccess(1 - r, 0);
    if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) CCGRAPH_CHECK_CUDA(pe);
    (void)cudaGetLastError();
  }
  const cg::device dev = cg::device::cuda(r);
  cc::event joined;
  int carve = 0;
  auto gemm = [&] {
    cc::detail::gemm_sm_carveout() = carve;
    cc::detail::gemm(dev, cg::dtype::bf16, n, n, n, a, n, false, a, n, false, c, n);
    cc::detail::gemm_sm_carveout() = 0;
  };
  auto nccl_ar = [&] { CCGRAPH_CHECK_NCCL(ncclAllReduce(x, y2, bytes / 2, ncclBfloat16, ncclSum, comm, comm_s.get())); };
  auto ce_ag = [&] { CCGRAPH_CHECK_NCCL(ncclAllGather(sbuf, rbuf, bytes / 2, ncclBfloat16, ce, comm_s.get())); };
  auto ce_a2a = [&] {
    CCGRAPH_CHECK_NCCL(ncclAlltoAll(sbuf, rbuf, bytes / 2 / static_cast<std::size_t>(world), ncclBfloat16, ce, comm_s.get()));
  };
  auto ce_ar = [&] {
    CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(sbuf, x, bytes, cudaMemcpyDeviceToDevice, comm_s.get()));
    ce_ag();
    const std::size_t n8 = bytes / 16;
    sum_slices_bf16<<<264, 512, 0, comm_s.get()>>>(static_cast<const uint4*>(rbuf), static_cast<uint4*>(y), n8, world);
    CCGRAPH_CHECK_CUDA(cudaGetLastError());
  };
  auto alone = [&](const std::function<void()>& f) {
    return per_step_us(compute.get(), 10, [&](int) {
             cc::event s;
             s.record(compute);
             comm_s.wait(s);
             f();
             joined.record(comm_s);
             compute.wait(joined);
           }) / 1e3;
  };
  auto beside_gemm = [&](const std::function<void()>& f) {
    return per_step_us(compute.get(), 10, [&](int) {
             cc::event s;
             s.record(compute);
             comm_s.wait(s);
             f();
             gemm();
             joined.record(comm_s);
             compute.wait(joined);
           }) / 1e3;
  };
  if (r == 0) std::printf("\n| GEMM 8192^3 bf16 beside zero-SM collectives of 128 MiB bf16 | value | unit |\n|---|---:|---|\n");
  const double g0 = per_step_us(compute.get(), 10, [&](int) { gemm(); }) / 1e3;
  row(r, "GEMM alone", g0, "ms");
  row(r, "NCCL all_reduce alone (default communicator)", alone(nccl_ar), "ms");
  row(r, "zero-CTA all_gather alone (windows)", alone(ce_ag), "ms");
  row(r, "zero-CTA all_to_all alone (windows)", alone(ce_a2a), "ms");
  row(r, "all_reduce = copy in + zero-CTA all_gather + sum, alone", alone(ce_ar), "ms");
  row(r, "  of which the sum kernel alone", alone([&] {
        sum_slices_bf16<<<264, 512, 0, comm_s.get()>>>(static_cast<const uint4*>(rbuf), static_cast<uint4*>(y), bytes / 16, world);
      }), "ms");
  row(r, "  of which the copy in alone", alone([&] {
        CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(sbuf, x, bytes, cudaMemcpyDeviceToDevice, comm_s.get()));
      }), "ms");
  row(r, "GEMM + NCCL all_reduce (all_reduce first)", beside_gemm(nccl_ar), "ms");
  row(r, "GEMM + zero-CTA all_gather", beside_gemm(ce_ag), "ms");
  row(r, "GEMM + zero-CTA all_to_all", beside_gemm(ce_a2a), "ms");
  row(r, "GEMM + all_reduce by all_gather + sum", beside_gemm(ce_ar), "ms");
  for (int cv : {1, 4, 16}) {
    carve = cv;
    const std::string k = ", GEMM leaves " + std::to_string(cv) + " SMs free";
    row(r, ("GEMM alone" + k).c_str(), per_step_us(compute.get(), 10, [&](int) { gemm(); }) / 1e3, "ms");
    row(r, ("GEMM + zero-CTA all_gather" + k).c_str(), beside_gemm(ce_ag), "ms");
    row(r, ("GEMM + zero-CTA all_to_all" + k).c_str(), beside_gemm(ce_a2a), "ms");
    row(r, ("GEMM + all_reduce by all_gather + sum" + k).c_str(), beside_gemm(ce_ar), "ms");
    row(r, ("GEMM + NCCL all_reduce" + k).c_str(), beside_gemm(nccl_ar), "ms");
  }
  carve = 0;
  // A copy of the GEMM's size on the copy engine beside it: does copy-engine traffic alone slow it?
  row(r, "GEMM + local device copy 128 MiB", beside_gemm([&] {
        CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(sbuf, x, bytes, cudaMemcpyDeviceToDevice, comm_s.get()));
      }), "ms");
  if (world == 2) row(r, "GEMM + peer copy 128 MiB (cudaMemcpyPeerAsync from the other GPU)", beside_gemm([&] {
        CCGRAPH_CHECK_CUDA(cudaMemcpyPeerAsync(y, r, peer_src, 1 - r, bytes, comm_s.get()));
      }), "ms");
  if (world == 2) row(r, "peer copy 128 MiB alone", alone([&] {
        CCGRAPH_CHECK_CUDA(cudaMemcpyPeerAsync(y, r, peer_src, 1 - r, bytes, comm_s.get()));
      }), "ms");
  // Same values as NCCL's all_reduce?
  nccl_ar();
  ce_ar();
  CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(comm_s.get()));
  std::vector<std::uint16_t> h1(static_cast<std::size_t>(n * n)), h2(h1.size());
  CCGRAPH_CHECK_CUDA(cudaMemcpy(h1.data(), y, bytes, cudaMemcpyDeviceToHost));
  CCGRAPH_CHECK_CUDA(cudaMemcpy(h2.data(), y2, bytes, cudaMemcpyDeviceToHost));
  std::size_t diff = 0;
  for (std::size_t i = 0; i < h1.size(); ++i) diff += h1[i] != h2[i];
  row(r, "elements that differ from NCCL's all_reduce", static_cast<double>(diff), "count");
  CCGRAPH_CHECK_NCCL(ncclCommWindowDeregister(ce, sw));
  CCGRAPH_CHECK_NCCL(ncclCommWindowDeregister(ce, rw));
  CCGRAPH_CHECK_NCCL(ncclMemFree(sbuf));
  CCGRAPH_CHECK_NCCL(ncclMemFree(rbuf));
  for (void* p : {a, c, x, y, y2}) CCGRAPH_CHECK_CUDA(cudaFree(p));
}

/// Host cost of the pieces of one eager ccgraph all_reduce (what the raw rows above lack), with
/// collectives placed by `placement`; `all_rows` adds the rows that do not depend on it.
void ccgraph_pieces(int world, cc::collective_stream placement, bool all_rows, const ncclUniqueId& raw_id) {
  std::vector<int> all;
  for (int i = 0; i < world; ++i) all.push_back(i);
  const cg::group g = all;
  cc::nccl_options opt;
  opt.placement = placement;
  cc::run_gpus(world, [&](cg::rank_context& ctx) {
    const int r = ctx.rank();
    const int iters = 2000;
    if (r == 0)
      std::printf("\n| ccgraph eager all_reduce 4 KiB f32, host cost of its pieces (collectives on the %s stream) "
                  "| value | unit |\n|---|---:|---|\n",
                  placement == cc::collective_stream::caller ? "caller's" : "communication");
    auto x = cg::uniform<float>({1024}, -1, 1, 5);
    cudaStream_t s = cc::current_stream();
    row(r, "tensor::empty + free (the rank's block cache)", host_us(iters, [&](int) { (void)cg::tensor<float>::empty({1024}); }), "us");
    row(r, "group resolve", host_us(iters, [&](int) { (void)ctx.resolve(g, "probe"); }), "us");
    {
      const auto gi = ctx.resolve(g, "probe");
      const std::vector<cg::tensor_meta> metas{{cg::dtype::f32, {1024}}};
      row(r, "ops::infer(all_reduce)", host_us(iters, [&](int) {
            (void)cg::ops::infer(cg::ops::collective_op{cg::ops::all_reduce{cg::reduce_op::sum}}, metas, gi);
          }), "us");
      cc::event e;
      row(r, "host: cudaEventRecord on the rank's stream", host_us(iters, [&](int) { e.record(s); }), "us");
    }
    row(r, "reduce_op parse \"sum\"", host_us(iters, [&](int) { (void)cg::parse_reduce_op("sum"); }), "us");
    row(r, "all_reduce launch only (result dropped: destructor joins)",
        host_us(iters, [&](int) { (void)cg::all_reduce(x, "sum", g); }), "us");
    row(r, "all_reduce + wait, host", host_us(iters, [&](int) { cg::all_reduce(x, "sum", g).wait(); }), "us");
    row(r, "all_reduce + wait, GPU per op", per_step_us(s, iters, [&](int) { cg::all_reduce(x, "sum", g).wait(); }), "us");
    // The same NCCL call on the communicator and stream ccgraph launches on: tells the cost of
    // the communicator (a blocking child split from a non-blocking one) from ccgraph's own.
    if (auto* nr = dynamic_cast<cc::detail::nccl_rank*>(&ctx.comm())) {
      const ncclComm_t c = nr->comm_for(all);
      const cudaStream_t cs = nr->comm_stream();
      auto y = cg::tensor<float>::empty({1024});
      row(r, "host: ncclAllReduce on ccgraph's communicator and stream",
          host_us(iters, [&](int) { CCGRAPH_CHECK_NCCL(ncclAllReduce(x.data(), y.data(), 1024, ncclFloat32, ncclSum, c, cs)); }), "us");
      row(r, "host: the same inside ncclGroupStart/End",
          host_us(iters, [&](int) {
            CCGRAPH_CHECK_NCCL(ncclGroupStart());
            CCGRAPH_CHECK_NCCL(ncclAllReduce(x.data(), y.data(), 1024, ncclFloat32, ncclSum, c, cs));
            CCGRAPH_CHECK_NCCL(ncclGroupEnd());
          }), "us");
      CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(cs));
      cc::event done;
      done.record(cs);
      CCGRAPH_CHECK_CUDA(cudaEventSynchronize(done.get()));
      row(r, "host: cudaEventQuery (completed event)", host_us(iters, [&](int) { (void)cudaEventQuery(done.get()); }), "us");
      row(r, "host: cudaStreamIsCapturing", host_us(iters, [&](int) {
            cudaStreamCaptureStatus st{};
            (void)cudaStreamIsCapturing(s, &st);
          }), "us");
      // The eager call taken apart, cumulatively: the request with its output, then the
      // backend's launch, then the wait.
      auto request = [&] {
        auto req = std::make_shared<cg::detail::collective_request>();
        req->group = ctx.resolve(g, "probe");
        req->op = cg::ops::all_reduce{cg::reduce_op::sum};
        req->inputs.push_back(cg::detail::to_buffer(x));
        auto out = cg::tensor<float>::empty({1024});
        req->outputs.push_back(cg::detail::to_buffer(out));
        return req;
      };
      row(r, "pieces: request + output", host_us(iters, [&](int) { (void)request(); }), "us");
      row(r, "pieces: + backend launch (work dropped)", host_us(iters, [&](int) { (void)nr->launch(request()); }), "us");
      row(r, "pieces: + wait", host_us(iters, [&](int) { nr->launch(request())->wait(); }), "us");
      row(r, "pieces: join hop alone (record + wait)", host_us(iters, [&](int) { nr->join(); }), "us");

      // The eager all_reduce against raw NCCL, timed in turns (see host_us_interleaved). A
      // request marked overlap_hint::none runs on the caller's stream under the default
      // placement, so both placements are measured in one run.
      cc::nccl_comm raw = cc::nccl_comm::init_rank(world, raw_id, r);
      cc::event ev;
      const auto gi = ctx.resolve(g, "probe");
      using hint = cg::detail::overlap_hint;
      auto request_on = [&](hint h) {
        auto req = request();
        req->overlap = h;
        return req;
      };
      const std::vector<std::pair<const char*, std::function<void(int)>>> variants = {
          {"raw NCCL: ncclAllReduce, own communicator, the rank's stream",
           [&](int) { CCGRAPH_CHECK_NCCL(ncclAllReduce(x.data(), y.data(), 1024, ncclFloat32, ncclSum, raw.get(), s)); }},
          {"raw NCCL on ccgraph's communicator, the rank's stream",
           [&](int) { CCGRAPH_CHECK_NCCL(ncclAllReduce(x.data(), y.data(), 1024, ncclFloat32, ncclSum, c, s)); }},
          {"raw NCCL on ccgraph's communicator + cudaEventRecord",
           [&](int) {
             CCGRAPH_CHECK_NCCL(ncclAllReduce(x.data(), y.data(), 1024, ncclFloat32, ncclSum, c, s));
             CCGRAPH_CHECK_CUDA(cudaEventRecord(ev.get(), s));
           }},
          {"raw NCCL on ccgraph's communicator + the request built and dropped",
           [&](int) {
             auto req = request_on(hint::none);
             CCGRAPH_CHECK_NCCL(ncclAllReduce(req->inputs[0].data<float>(), req->outputs[0].data<float>(), 1024,
                                              ncclFloat32, ncclSum, c, s));
           }},
          {"backend launch + wait, caller's stream (request built)",
           [&](int) { nr->launch(request_on(hint::none))->wait(); }},
          {"launch_collective + wait, caller's stream",
           [&](int) {
             cg::detail::launch_collective<float>(ctx, "all_reduce", cg::ops::all_reduce{cg::reduce_op::sum}, gi, {x},
                                                  nullptr, hint::none)
                 .front()
                 .wait();
           }},
          {"cg::all_reduce + wait (communication stream)", [&](int) { cg::all_reduce(x, "sum", g).wait(); }},
      };
      std::vector<std::function<void(int)>> steps;
      for (auto& v : variants) steps.push_back(v.second);
      const auto us = host_us_interleaved(1000, 9, steps);
      if (r == 0) std::printf("| side by side (medians of 9 rounds of 1000 in turns): | | |\n");
      for (std::size_t v = 0; v < variants.size(); ++v) {
        row(r, variants[v].first, us[v], "us");
        if (v > 0) row(r, "  ratio to raw NCCL", us[v] / us[0], "x");
      }
    }
    if (!all_rows) return;
    // The seed program's pointwise kernels at N = 8192 bf16, against a device-to-device copy:
    // bytes read and written per microsecond.
    {
      const std::int64_t n = 8192;
      const auto a = cg::uniform<cg::bf16>({n, n}, -1, 1, 11), b = cg::uniform<cg::bf16>({n, n}, -1, 1, 12),
                 c = cg::uniform<cg::bf16>({n, n}, -1, 1, 13);
      auto out = cg::tensor<cg::bf16>::empty({n, n});
      const double mb = static_cast<double>(n * n * 2) / 1e6;
      auto gbs = [&](double operands, double us) { return operands * mb / us * 1e3; };
      const double copy_us = per_step_us(s, 20, [&](int) {
        CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(out.data(), a.data(), static_cast<std::size_t>(n * n * 2),
                                           cudaMemcpyDeviceToDevice, s));
      });
      row(r, "device copy 128 MiB bf16, GB/s (read + write)", gbs(2, copy_us), "GB/s");
      row(r, "relu(a) 8192^2 bf16, GB/s", gbs(2, per_step_us(s, 20, [&](int) { (void)cg::relu(a).eval(); })), "GB/s");
      row(r, "a * b * c 8192^2 bf16, GB/s", gbs(4, per_step_us(s, 20, [&](int) { (void)cg::eval(a * b * c); })), "GB/s");
      row(r, "a + b + c 8192^2 bf16, GB/s", gbs(4, per_step_us(s, 20, [&](int) { (void)cg::eval(a + b + c); })), "GB/s");
    }
    // A traced chain of 64 in a CUDA Graph, out of place (no memory plan, so no in-place
    // all_reduce: a 1-rank all_reduce in place would be no work at all): compare with the raw
    // rows "CUDA Graph of 64".
    auto chain = cg::trace(ccgraph::examples::all_reduce_chain(g, 64), cg::input<float>({1024}));
    for (bool plan : {false, true}) {
      auto exe = cg::compile(chain, ctx, {.cuda_graph = true, .memory_plan = plan, .static_outputs = true});
      (void)exe(x);
      auto bound = cg::get_tensor<float>(exe.exec().static_inputs().at(0), "probe");
      row(r, plan ? "ccgraph CUDA Graph of 64, memory plan (in place)" : "ccgraph CUDA Graph of 64, out of place",
          per_step_us(s, 50, [&](int) { (void)exe(bound); }) / 64, "us");
    }
  }, opt);
}

void rank_main(int r, int world, const std::array<ncclUniqueId, 5>& ids, const std::vector<int>& caps, bool zero_sm_only) {
  try {
    CCGRAPH_CHECK_CUDA(cudaSetDevice(r));
    cc::nccl_comm comm = cc::nccl_comm::init_rank(world, ids[0], r);
    if (zero_sm_only) {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.CTAPolicy = NCCL_CTA_POLICY_ZERO;
      ncclComm_t c = nullptr;
      CCGRAPH_CHECK_NCCL(ncclCommInitRankConfig(&c, world, ids[4], r, &cfg));
      cc::nccl_comm ce(c);
      overlap_zero_sm(r, world, comm.get(), ce.get());
      return;
    }
    std::vector<cc::nccl_comm> capped_comms;
    std::vector<ncclComm_t> capped;
    for (std::size_t i = 0; i < caps.size(); ++i) {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.maxCTAs = caps[i];
      ncclComm_t c = nullptr;
      CCGRAPH_CHECK_NCCL(ncclCommInitRankConfig(&c, world, ids[i + 1], r, &cfg));
      capped_comms.push_back(cc::nccl_comm(c));
      capped.push_back(c);
    }
    per_op(r, comm.get());
    overlap(r, comm.get(), capped, caps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpu_probe rank %d: %s\n", r, e.what());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // `bench_gpu_probe zero_sm`: only the zero-SM collectives beside a GEMM.
  const bench::args args(argc, argv, "[zero_sm]", {}, {}, 1);
  if (!args.positional().empty() && args.positional()[0] != "zero_sm")
    args.fail("unknown mode '" + args.positional()[0] + "'");
  const bool zero_sm_only = !args.positional().empty();
  const int n = cc::device_count();
  if (n < 1) {
    std::printf("bench_gpu_probe: no CUDA device; nothing to measure\n");
    return 0;
  }
  const int world = n < 2 ? 1 : 2;  // one GPU: per-op costs over a 1-rank communicator
  cudaDeviceProp prop{};
  CCGRAPH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("# bench_gpu_probe on %d x %s (%d SMs), NCCL %d.%d.%d\n", world, prop.name, prop.multiProcessorCount,
              NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  const std::vector<int> caps = {8, 16, 32};
  // (a std::vector<ncclUniqueId> trips an internal error of nvcc 13's front end)
  std::array<ncclUniqueId, 5> ids{};
  for (auto& id : ids) CCGRAPH_CHECK_NCCL(ncclGetUniqueId(&id));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&ids, &caps, r, world, zero_sm_only] { rank_main(r, world, ids, caps, zero_sm_only); });
  for (auto& t : threads) t.join();
  if (zero_sm_only) return 0;
  std::array<ncclUniqueId, 2> raw_ids{};
  for (auto& id : raw_ids) CCGRAPH_CHECK_NCCL(ncclGetUniqueId(&id));
  ccgraph_pieces(world, cc::collective_stream::automatic, true, raw_ids[0]);
  ccgraph_pieces(world, cc::collective_stream::caller, false, raw_ids[1]);
  return 0;
}
