// cuda::adopt: a rank on the caller's own NCCL communicator and CUDA stream (issue 18 item 1).
// The test makes the communicators itself (one thread per GPU, ncclCommInitRank), as a
// training loop or PyTorch's ProcessGroupNCCL would, and checks that ccgraph's collectives,
// compute and compiled graphs (CUDA Graph mode too) are ordered on the caller's stream with
// the caller's own work before and after, that the communicator stays the caller's and usable,
// and that bad input and a missing peer end in errors, not hangs.
#include <ccgraph/cuda.hpp>
#include <ccgraph/schedule/schedule.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_adopt {

namespace cg = ccgraph;

namespace {

/// Sleeps `ms` milliseconds on the GPU, then sets p[0, n) to v: the caller's work, queued on
/// its stream, that runs late, so that anything not ordered after it reads the old values.
__global__ void late_fill(float* p, float v, int n, int ms) {
  if (threadIdx.x == 0)
    for (int i = 0; i < ms; ++i) __nanosleep(1000000);
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) p[i] = v;
}

void fill_late(float* p, float v, int n, int ms, cudaStream_t s) {
  late_fill<<<1, 256, 0, s>>>(p, v, n, ms);
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

/// What a caller's raw copy on its own stream reads from `t` (no ccgraph call in between).
std::vector<float> read_on(cudaStream_t s, const cg::tensor<float>& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  REQUIRE(cudaMemcpyAsync(out.data(), t.data_unsynced(), out.size() * sizeof(float), cudaMemcpyDeviceToHost, s) ==
          cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  return out;
}

/// Runs `fn(comm, rank)` on `n` GPUs, one thread each, with communicators the test makes
/// itself (ncclCommInitRank, blocking, as most callers make theirs). `fn` returns whether the
/// communicator is still alive (false: ccgraph aborted it); the thread then destroys it.
/// Rethrows the first rank's exception.
void with_caller_comms(int n, const std::function<bool(ncclComm_t, int)>& fn) {
  ncclUniqueId id{};
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        CCGRAPH_CHECK_CUDA(cudaSetDevice(r));
        ncclComm_t c = nullptr;
        CCGRAPH_CHECK_NCCL(ncclCommInitRank(&c, n, id, r));
        if (fn(c, r)) CCGRAPH_CHECK_NCCL(ncclCommDestroy(c));
      } catch (...) {
        std::lock_guard lk(mu);
        if (!first) first = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  if (first) std::rethrow_exception(first);
}

/// A fresh file store path for `n` ranks (one file_store per rank opens it).
std::string store_path(const char* name) {
  return (std::filesystem::temp_directory_path() /
          ("ccgraph_adopt_" + std::string(name) + "_" + std::to_string(::getpid())))
      .string();
}

/// Everything one rank checks on an adopted communicator and stream (see the file's comment).
/// `st`: the store for groups that are not mesh dimensions (null: they are errors).
void adopted_suite(ncclComm_t comm, int r, int n, cg::cuda::collective_stream placement,
                   std::shared_ptr<cg::store> st, const std::string& prefix) {
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  constexpr int N = 1024;
  float* buf = nullptr;
  float* in = nullptr;
  REQUIRE(cudaMalloc(&buf, N * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&in, 256 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemset(buf, 0, N * sizeof(float)) == cudaSuccess);
  const float sum = static_cast<float>(n * (n + 1) / 2);
  {
    cg::cuda::adopt_options opt;
    opt.nccl.placement = placement;
    opt.store = st;
    opt.store_prefix = prefix;
    // Queued by the caller before adopting: ccgraph's first reads come after it.
    fill_late(buf, static_cast<float>(r + 1), N, 20, s);
    auto me = cg::cuda::adopt(comm, s, opt);
    cg::rank_context& ctx = me->context();
    CHECK(ctx.rank() == r);
    CHECK(ctx.world_size() == n);
    CHECK(ctx.device() == cg::device::cuda(r));
    CHECK(cg::cuda::current_stream() == s);
    CHECK(me->stream() == s);
    CHECK(me->communicator() == comm);
    const cg::group world = ctx.world();
    const auto x = cg::from_blob(buf, {N}, [](float*) {});  // the caller's memory

    // Eager collectives, after the caller's fill.
    CHECK(cg::all_reduce(x, "sum", world).to_vector() == std::vector<float>(N, sum));
    {
      std::vector<float> want;
      for (int j = 0; j < n; ++j) want.insert(want.end(), N, static_cast<float>(j + 1));
      CHECK(cg::all_gather_tensor(x, 0, world).to_vector() == want);
    }
    // The caller's work before and after, with no synchronisation between: its fill, then an
    // all_reduce and a kernel of ccgraph's, then its own copy of the results.
    fill_late(buf, static_cast<float>(2 * (r + 1)), N, 20, s);
    auto y = cg::all_reduce(x, "sum", world);
    cg::tensor<float> z = y * 2.f;
    CHECK(read_on(s, z) == std::vector<float>(N, 4.f * sum));
    fill_late(buf, static_cast<float>(3 * (r + 1)), N, 20, s);
    auto y2 = cg::all_reduce(x, "sum", world);
    cg::wait_tensor(y2);  // joins the collective back into the caller's stream
    CHECK(read_on(s, y2) == std::vector<float>(N, 3.f * sum));

    // Compiled graphs, scheduled or not, run by the interpreter and as CUDA Graphs, on an
    // input the caller rewrites on its stream just before each call.
    auto program = [world](auto a) {
      auto ar = cg::all_reduce(a, "sum", world);
      auto m = cg::matmul(a, a);
      return cg::eval(cg::wait_tensor(ar) * 0.5f + m);
    };
    const auto traced = cg::trace(program, cg::input<float>({16, 16}));
    const auto scheduled = cg::schedule(traced, {"sink_waits", "raise_comms"});
    const auto a = cg::from_blob(in, {16, 16}, [](float*) {});
    for (bool replay : {false, true})
      for (bool sched : {false, true}) {
        CAPTURE(replay);
        CAPTURE(sched);
        auto run = cg::compile(sched ? scheduled : traced, ctx, {.cuda_graph = replay});
        for (int call = 0; call < 3; ++call) {
          CAPTURE(call);
          const float v = static_cast<float>((r + 1) * (call + 1));
          fill_late(in, v, 256, 5, s);
          auto res = run(a);
          cg::wait_tensor(res);
          const float want = 0.5f * sum * static_cast<float>(call + 1) + 16.f * v * v;
          CHECK(read_on(s, cg::tensor<float>(res.contiguous())) == std::vector<float>(256, want));
        }
      }

    if (n == 2) {
      // Mesh dimensions: split from the adopted communicator.
      cg::device_mesh mesh({1, 2});
      const auto x4 = cg::full<float>({4}, static_cast<float>(r + 1));
      CHECK(cg::all_reduce(x4, "sum", cg::group{mesh, 1}).to_vector() == std::vector<float>(4, 3.f));
      CHECK(cg::all_reduce(x4, "sum", cg::group{mesh, 0}).to_vector() == std::vector<float>(4, static_cast<float>(r + 1)));
      // A group that is not a mesh dimension: an id exchanged through the store, else an error
      // naming the group (on both ranks, before NCCL sees anything). A tagged group over the
      // world's ranks has a communicator of its own, as a c10d group does (groups are sorted
      // rank lists: {1, 0} would be the world itself).
      const cg::group pair{std::vector<int>{0, 1}, "adopt_pair"};
      if (st) {
        CHECK(cg::all_gather_tensor(x4, 0, pair).to_vector() == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2});
      } else {
        CHECK_THROWS_WITH_AS((void)cg::all_gather_tensor(x4, 0, pair).to_vector(),
                             doctest::Contains("adopt: group [0, 1] tagged 'adopt_pair' needs an NCCL communicator of its own"),
                             cg::error);
        CHECK_THROWS_WITH_AS((void)cg::all_gather_tensor(x4, 0, pair), doctest::Contains("adopt_options::store"),
                             cg::error);
      }
      // The world still works after the error.
      CHECK(cg::all_reduce(x4, "max", world).to_vector() == std::vector<float>(4, 2.f));
    }
    CHECK_FALSE(me->communicator_aborted());
  }
  // The adopted rank ended: the thread's stream is its own again, and the communicator is
  // still the caller's, usable by its own calls.
  CHECK(cg::cuda::current_stream() != s);
  fill_late(buf, static_cast<float>(r + 1), N, 1, s);
  REQUIRE(ncclAllReduce(buf, buf, N, ncclFloat32, ncclSum, comm, s) == ncclSuccess);
  std::vector<float> host(N);
  REQUIRE(cudaMemcpyAsync(host.data(), buf, N * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(host == std::vector<float>(N, sum));
  REQUIRE(cudaFree(buf) == cudaSuccess);
  REQUIRE(cudaFree(in) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

void adopted_case(int n) {
  using cs = cg::cuda::collective_stream;
  with_caller_comms(n, [&](ncclComm_t c, int r) {
    // Twice on the same communicator and stream: an adoption ends cleanly, and another follows.
    adopted_suite(c, r, n, cs::automatic, nullptr, "ccgraph/adopt/");
    adopted_suite(c, r, n, cs::separate, nullptr, "ccgraph/adopt/");
    adopted_suite(c, r, n, cs::caller, nullptr, "ccgraph/adopt/");
    return true;
  });
}

}  // namespace

TEST_CASE("adopt.null_communicator_is_an_error") {
  // No GPU needed: checked before anything touches CUDA or NCCL.
  CHECK_THROWS_WITH_AS((void)cg::cuda::adopt(nullptr, nullptr),
                       "adopt: the communicator is null (pass the caller's ncclComm_t, made by ncclCommInitRank, "
                       "ncclCommInitAll or ncclCommSplit)",
                       cg::error);
  cg::cuda::adopt_options opt;
  opt.nccl.timeout = std::chrono::milliseconds(-1);
  CHECK_THROWS_WITH_AS((void)cg::cuda::adopt(nullptr, nullptr, opt),
                       doctest::Contains("nccl_options::timeout: the timeout must be positive, got -1 ms"), cg::error);
}

TEST_CASE("adopt.group_without_a_store_is_named") {
  // What an adopted rank without adopt_options::store says for a group that needs an id.
  cg::cuda::detail::no_id_exchange none;
  CHECK_THROWS_WITH_AS((void)none.get("nccl/1,0", true, std::chrono::seconds(1)),
                       "adopt: group [1, 0] needs an NCCL communicator of its own, and it is not one part of a "
                       "partition of the world that every rank sets up at once (a mesh dimension, split from the "
                       "adopted communicator): its members must exchange an NCCL id, so pass a store in "
                       "adopt_options::store",
                       cg::error);
  CHECK_THROWS_WITH_AS((void)none.get("nccl/0,2,3#fsdp", false, std::chrono::seconds(1)),
                       doctest::Contains("adopt: group [0, 2, 3] tagged 'fsdp' needs"), cg::error);
}

TEST_CASE("adopt.process_barrier") {
  // The host-only barrier of an adopted rank's end: n threads meet; keys do not mix; a missing
  // thread is a false after the timeout, and the meeting is forgotten (no state leaks).
  namespace d = cg::cuda::detail;
  CHECK(d::process_token() == d::process_token());
  CHECK(d::fresh_token() != d::fresh_token());
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::atomic<int> arrived{0}, early{0};
    const std::uint64_t key = d::fresh_token();
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i)
      ts.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5 * i));
        ++arrived;
        if (!d::process_barrier(key, n, std::chrono::seconds(30)) || arrived.load() != n) ++early;
      });
    for (auto& t : ts) t.join();
    CHECK(early.load() == 0);
  }
  const std::uint64_t key = d::fresh_token();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(d::process_barrier(key, 2, std::chrono::milliseconds(50)));
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(50));
  // The timed-out arrival was withdrawn: two new arrivals under the same key meet.
  std::thread other([&] { CHECK(d::process_barrier(key, 2, std::chrono::seconds(30))); });
  CHECK(d::process_barrier(key, 2, std::chrono::seconds(30)));
  other.join();
}

TEST_CASE("adopt.store_ids_under_a_prefix") {
  // Ids go under the adoption's prefix, so two adoptions over one store do not share them.
  const std::string path = store_path("prefix");
  std::filesystem::remove(path);
  auto st = std::make_shared<cg::file_store>(path, 1, std::chrono::seconds(5));
  cg::cuda::detail::store_id_exchange first(st, "p1/"), second(st, "p2/");
  const ncclUniqueId a = first.get("nccl/0,1", true, std::chrono::seconds(5));
  const ncclUniqueId b = second.get("nccl/0,1", true, std::chrono::seconds(5));
  CHECK(std::memcmp(&a, &b, sizeof a) != 0);
  const ncclUniqueId a2 = first.get("nccl/0,1", false, std::chrono::seconds(5));
  CHECK(std::memcmp(&a, &a2, sizeof a) == 0);
  CHECK(st->check({"p1/nccl/0,1", "p2/nccl/0,1"}));
  CHECK_FALSE(st->check({"ccgraph/nccl_id/nccl/0,1"}));
}

GPU_TEST_CASE("adopt.caller_comm_and_stream.1_gpu") { adopted_case(1); }

GPUS_TEST_CASE("adopt.caller_comm_and_stream.2_gpus", 2) { adopted_case(2); }

// Also the end of an adopted rank whose peer in this process destroys the same two-rank
// communicators: NCCL frees both ranks' when the second destroys its own, waiting for both GPUs
// to be idle, while the first rank, once out of its adopted rank, queues an all_reduce of the
// caller's on its GPU (adopted_suite's last check). Before the barrier after the destroys
// (adopted_rank's end), that hung here.
GPUS_TEST_CASE("adopt.groups_through_a_store.2_gpus", 2) {
  const std::string path = store_path("groups");
  std::filesystem::remove(path);
  with_caller_comms(2, [&](ncclComm_t c, int r) {
    auto st = std::make_shared<cg::file_store>(path, 2, std::chrono::seconds(60));
    // Two adoptions over one store: each with its own key prefix.
    adopted_suite(c, r, 2, cg::cuda::collective_stream::automatic, st, "ccgraph/adopt/1/");
    adopted_suite(c, r, 2, cg::cuda::collective_stream::automatic, st, "ccgraph/adopt/2/");
    return true;
  });
}

GPU_TEST_CASE("adopt.bad_input_is_an_error.1_gpu") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  std::vector<cg::cuda::nccl_comm> comms = cg::cuda::nccl_comm::init_all({0});
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CHECK_THROWS_WITH_AS((void)cg::cuda::adopt(nullptr, s), doctest::Contains("adopt: the communicator is null"),
                       cg::error);
  {
    cg::cuda::adopt_options opt;
    opt.nccl.timeout = std::chrono::milliseconds(0);
    CHECK_THROWS_WITH_AS((void)cg::cuda::adopt(comms[0].get(), s, opt),
                         doctest::Contains("nccl_options::timeout: the timeout must be positive"), cg::error);
  }
  // A stream that is recording a CUDA Graph.
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  std::string recording;
  try {
    (void)cg::cuda::adopt(comms[0].get(), s);
  } catch (const cg::error& e) {
    recording = e.what();
  }
  cudaGraph_t g = nullptr;
  if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) (void)cudaGraphDestroy(g);
  (void)cudaGetLastError();
  CHECK(recording.find("is recording a CUDA Graph") != std::string::npos);
  // Nothing was taken: the communicator and the stream still work, adopted or not.
  {
    auto me = cg::cuda::adopt(comms[0].get(), s);
    CHECK(cg::all_reduce(cg::full<float>({4}, 2.f), "sum", me->context().world()).to_vector() ==
          std::vector<float>(4, 2.f));
  }
  CHECK(cg::cuda::current_stream() == cudaStreamPerThread);
  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
}

GPUS_TEST_CASE("adopt.stream_or_device_of_another_gpu_is_an_error.2_gpus", 2) {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  std::vector<cg::cuda::nccl_comm> comms = cg::cuda::nccl_comm::init_all({0});  // on cuda:0
  cudaStream_t s0 = nullptr, s1 = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
  // Current device 1, communicator on 0.
  CHECK_THROWS_WITH_AS((void)cg::cuda::adopt(comms[0].get(), s0),
                       doctest::Contains("adopt: the communicator (rank 0 of 1) is on cuda:0 but the calling "
                                         "thread's current device is cuda:1 (call cudaSetDevice(0) first)"),
                       cg::error);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  // A stream of device 1 for a communicator on device 0.
  std::string msg;
  try {
    (void)cg::cuda::adopt(comms[0].get(), s1);
  } catch (const cg::error& e) {
    msg = e.what();
  }
  CHECK(msg.find("adopt: stream ") != std::string::npos);
  CHECK(msg.find(" is on cuda:1 but the communicator (rank 0 of 1) is on cuda:0") != std::string::npos);
  REQUIRE(cudaStreamDestroy(s0) == cudaSuccess);
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  REQUIRE(cudaStreamDestroy(s1) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

GPUS_TEST_CASE("adopt.missing_peer_times_out_and_aborts_the_communicator.2_gpus", 2) {
  // Rank 1 adopts but never calls the all_reduce: rank 0's wait ends in a timeout_error, and
  // ccgraph ends the hung kernel by aborting the adopted communicator through the caller's
  // function (adopt_options::abort), which then owns what is left of it.
  std::atomic<bool> rank0_done{false};
  std::atomic<int> aborted_by_callback{0};
  std::string error0;
  bool flagged = false;
  const auto start = std::chrono::steady_clock::now();
  with_caller_comms(2, [&](ncclComm_t c, int r) {
    cudaStream_t s = nullptr;
    CCGRAPH_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cg::cuda::adopt_options opt;
    opt.nccl.timeout = std::chrono::milliseconds(3000);
    opt.abort = [&](ncclComm_t x) {
      ++aborted_by_callback;
      (void)ncclCommAbort(x);
    };
    bool alive = true;
    {
      auto me = cg::cuda::adopt(c, s, opt);
      if (r == 0) {
        try {
          (void)cg::all_reduce(cg::ones<float>({1024}), "sum", me->context().world()).to_vector();
        } catch (const cg::timeout_error& e) {
          error0 = e.what();
        }
        flagged = me->communicator_aborted();
        alive = !flagged;
        rank0_done = true;
      } else {
        while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    if (r == 1) {
      (void)ncclCommAbort(c);  // its peer is gone: end it without waiting for it
      alive = false;
    }
    CCGRAPH_CHECK_CUDA(cudaStreamDestroy(s));
    return alive;
  });
  CHECK(error0.find("all_reduce") != std::string::npos);
  CHECK(flagged);
  CHECK(aborted_by_callback == 1);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
}

GPU_TEST_CASE("adopt.stream_guard_runs_a_rank_on_the_callers_stream.1_gpu") {
  // Just a stream, on an existing rank (docs/cuda_graphs.md): under cuda::stream_guard, eager
  // collectives, compute and compiled graphs (CUDA Graph mode included) run on the caller's
  // stream, ordered after its work and before its next, with the cross-stream waits the guard
  // leaves to the caller at its two ends.
  cg::cuda::run_gpus(1, [&](cg::rank_context& ctx) {
    const cudaStream_t rank_stream = cg::cuda::current_stream();
    const cg::group world = ctx.world();
    auto program = [world](auto a) {
      auto ar = cg::all_reduce(a, "sum", world);
      auto m = cg::matmul(a, a);
      return cg::eval(cg::wait_tensor(ar) * 0.5f + m);
    };
    const auto scheduled = cg::schedule(cg::trace(program, cg::input<float>({16, 16})), {"sink_waits", "raise_comms"});
    const auto w = cg::full<float>({16, 16}, 1.f);  // made on the rank's stream
    cg::cuda::stream mine(cudaStreamNonBlocking);
    cg::cuda::event made;
    REQUIRE(cudaEventRecord(made.get(), rank_stream) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(mine.get(), made.get(), 0) == cudaSuccess);  // w is ready on `mine`
    float* in = nullptr;
    REQUIRE(cudaMalloc(&in, 256 * sizeof(float)) == cudaSuccess);
    {
      cg::cuda::stream_guard on(mine.get());
      CHECK(cg::cuda::current_stream() == mine.get());
      const auto a = cg::from_blob(in, {16, 16}, [](float*) {});
      for (bool replay : {false, true}) {
        CAPTURE(replay);
        auto run = cg::compile(scheduled, ctx, {.cuda_graph = replay});
        for (int call = 0; call < 3; ++call) {
          const float v = static_cast<float>(call + 2);
          fill_late(in, v, 256, 5, mine.get());
          auto res = run(a);
          cg::tensor<float> plus = cg::all_reduce(res, "sum", world) + w;  // eager, on `mine`
          CHECK(read_on(mine.get(), plus) == std::vector<float>(256, 0.5f * v + 16.f * v * v + 1.f));
        }
      }
    }
    CHECK(cg::cuda::current_stream() == rank_stream);
    REQUIRE(cudaStreamSynchronize(mine.get()) == cudaSuccess);  // before `in` and `mine` go
    REQUIRE(cudaFree(in) == cudaSuccess);
  });
}

}  // namespace gpu_test_adopt
