// The CUDA element-wise kernels (ccgraph/cuda/pointwise.cuh) and the cuBLAS(Lt) GEMM
// (ccgraph/cuda/blas.hpp), on raw device buffers. Each pointwise case runs one kernel tree on
// the device and the very same tree on the host over host copies, and compares every element
// of the output buffer, padding included (it must keep its poison). The GEMM cases compare
// against a double-precision host product. Cases that need a GPU are skipped without one.
#include <ccgraph/cuda/blas.hpp>
#include <ccgraph/cuda/pointwise.cuh>
#include <ccgraph/cuda/graph.hpp>
#include <ccgraph/cuda/stream.hpp>

#include <doctest/doctest.h>

#include "gpu_test.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

// One namespace per file: the GPU test files compile in unity batches (tests/CMakeLists.txt).
namespace gpu_test_kernels {

namespace cg = ccgraph;

namespace {

using ccgraph_test::gpu_available;

// ---- device buffers ------------------------------------------------------------------------

struct cuda_free {
  void operator()(void* p) const noexcept { (void)cudaFree(p); }
};

/// A cudaMalloc'd array owned for the test's scope.
template <class T>
using device_ptr = std::unique_ptr<T[], cuda_free>;

template <class T>
device_ptr<T> device_alloc(std::size_t n) {
  void* p = nullptr;
  CCGRAPH_CHECK_CUDA(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)));
  return device_ptr<T>(static_cast<T*>(p));
}

/// Copies to the device in the current stream's order (the kernels run on that stream).
template <class T>
void upload(T* dst, const std::vector<T>& src) {
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(T),
                                     cudaMemcpyHostToDevice, cg::cuda::current_stream()));
}

template <class T>
std::vector<T> download(const T* src, std::size_t n) {
  std::vector<T> out(n);
  CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(out.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost,
                                     cg::cuda::current_stream()));
  CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(cg::cuda::current_stream()));
  return out;
}

/// Every byte 0xFF: NaN for the float types, -1 for ints; what an unwritten element keeps.
template <class T>
T poison() {
  T v;
  std::memset(static_cast<void*>(&v), 0xFF, sizeof v);
  return v;
}

// ---- values --------------------------------------------------------------------------------

struct value_range {
  double lo, hi;
};

template <class T>
std::vector<T> random_values(std::size_t n, value_range r, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<T> v(n);
  if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<int> dist(static_cast<int>(r.lo), static_cast<int>(r.hi));
    for (auto& x : v) x = static_cast<T>(dist(gen));
  } else {
    std::uniform_real_distribution<float> dist(static_cast<float>(r.lo), static_cast<float>(r.hi));
    for (auto& x : v) x = T(dist(gen));
  }
  return v;
}

/// Bits of a float type as a signed integer ordered like the values (for ulp distances).
template <class T>
std::int64_t ordered_bits(T v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<std::int64_t>(v);
  } else {
    constexpr int bits = 8 * sizeof(T);
    using U = std::conditional_t<bits == 64, std::uint64_t,
                                 std::conditional_t<bits == 32, std::uint32_t, std::uint16_t>>;
    U u;
    std::memcpy(&u, &v, sizeof u);
    const auto mag = static_cast<std::int64_t>(static_cast<std::uint64_t>(u) &
                                               ((std::uint64_t{1} << (bits - 1)) - 1));
    return (static_cast<std::uint64_t>(u) >> (bits - 1)) ? -mag : mag;
  }
}

/// Distance in units in the last place (plain difference for integers); identical bits are 0.
template <class T>
std::int64_t ulp_distance(T a, T b) {
  if (std::memcmp(&a, &b, sizeof(T)) == 0) return 0;
  if constexpr (!std::is_integral_v<T>) {
    if (std::isnan(static_cast<float>(a)) || std::isnan(static_cast<float>(b))) return INT64_MAX;
  }
  return std::llabs(ordered_bits(a) - ordered_bits(b));
}

template <class T>
std::string show(T v) {
  if constexpr (std::is_integral_v<T>)
    return std::to_string(v);
  else
    return std::to_string(static_cast<float>(v));
}

// ---- pointwise cases -----------------------------------------------------------------------

/// One layout to run a tree over: the layout, each operand's storage size, the output's.
template <std::size_t N>
struct pointwise_case {
  const char* name;
  cg::detail::device_layout<N> layout;
  std::array<std::size_t, N - 1> operand_sizes;
  std::size_t out_elems;
  std::size_t out_shift = 0;  // output pointer offset in elements (misaligned output)
  std::size_t in_shift = 0;   // the second operand's pointer offset (misaligned loads)
};

/// The host reference: the definition of a device_layout, one element at a time.
template <class K, class T, std::size_t N>
void host_pointwise(const K& k, T* out, const cg::detail::device_layout<N>& layout) {
  for (std::int64_t i = 0; i < layout.numel; ++i) {
    std::int64_t o[N] = {};
    if (layout.flat) {
      out[i] = k.load(o, i);
      continue;
    }
    std::int64_t rem = i;
    for (int d = layout.ndim - 1; d >= 0; --d) {
      const std::int64_t coord = rem % layout.shape[d];
      rem /= layout.shape[d];
      for (std::size_t a = 0; a < N; ++a) o[a] += coord * layout.strides[a][d];
    }
    out[o[0]] = k.load(o, 0);
  }
}

template <std::size_t N>
pointwise_case<N> flat_case(std::int64_t n, std::size_t out_shift = 0, std::size_t in_shift = 0) {
  pointwise_case<N> c{out_shift ? "flat.misaligned_out" : in_shift ? "flat.misaligned_operand" : "flat",
                      {}, {}, 0, out_shift, in_shift};
  c.layout.ndim = 1;
  c.layout.numel = n;
  c.layout.flat = true;
  c.layout.shape[0] = n;
  for (auto& s : c.layout.strides) s[0] = 1;
  c.operand_sizes.fill(static_cast<std::size_t>(n));
  c.out_elems = static_cast<std::size_t>(n);
  return c;
}

/// [rows, cols]: operand 1 full, operand 2 a row broadcast down, operand 3 a column broadcast
/// across (stride 0 along the broadcast dim).
template <std::size_t N>
pointwise_case<N> broadcast_case(std::int64_t rows, std::int64_t cols) {
  pointwise_case<N> c{"strided.broadcast_row_and_column", {}, {}, 0};
  c.layout.ndim = 2;
  c.layout.numel = rows * cols;
  c.layout.flat = false;
  c.layout.shape[0] = rows;
  c.layout.shape[1] = cols;
  c.layout.strides[0][0] = cols, c.layout.strides[0][1] = 1;
  c.layout.strides[1][0] = cols, c.layout.strides[1][1] = 1;
  c.layout.strides[2][0] = 0, c.layout.strides[2][1] = 1;
  c.operand_sizes[0] = static_cast<std::size_t>(rows * cols);
  c.operand_sizes[1] = static_cast<std::size_t>(cols);
  if constexpr (N > 3) {
    c.layout.strides[3][0] = 1, c.layout.strides[3][1] = 0;
    c.operand_sizes[2] = static_cast<std::size_t>(rows);
  }
  c.out_elems = static_cast<std::size_t>(rows * cols);
  return c;
}

/// [rows, cols] into an output with row pitch `pitch` > cols: operand 1 read transposed (stored
/// [cols, rows]), operand 2 contiguous, operand 3 a single element broadcast everywhere.
template <std::size_t N>
pointwise_case<N> transposed_case(std::int64_t rows, std::int64_t cols, std::int64_t pitch) {
  pointwise_case<N> c{"strided.transposed_operand_padded_out", {}, {}, 0};
  c.layout.ndim = 2;
  c.layout.numel = rows * cols;
  c.layout.flat = false;
  c.layout.shape[0] = rows;
  c.layout.shape[1] = cols;
  c.layout.strides[0][0] = pitch, c.layout.strides[0][1] = 1;
  c.layout.strides[1][0] = 1, c.layout.strides[1][1] = rows;
  c.layout.strides[2][0] = cols, c.layout.strides[2][1] = 1;
  c.operand_sizes[0] = static_cast<std::size_t>(rows * cols);
  c.operand_sizes[1] = static_cast<std::size_t>(rows * cols);
  if constexpr (N > 3) {
    c.layout.strides[3][0] = 0, c.layout.strides[3][1] = 0;
    c.operand_sizes[2] = 1;
  }
  c.out_elems = static_cast<std::size_t>(rows * pitch);
  return c;
}

/// [4, 5, 6]: operand 1 a permutation (stored [6, 4, 5]), operand 2 broadcast along dim 0,
/// operand 3 contiguous.
template <std::size_t N>
pointwise_case<N> permuted_case() {
  pointwise_case<N> c{"strided.permuted_3d", {}, {}, 0};
  c.layout.ndim = 3;
  c.layout.numel = 4 * 5 * 6;
  c.layout.flat = false;
  const std::int64_t shape[3] = {4, 5, 6};
  const std::int64_t strides[4][3] = {{30, 6, 1}, {5, 1, 20}, {0, 6, 1}, {30, 6, 1}};
  for (int d = 0; d < 3; ++d) {
    c.layout.shape[d] = shape[d];
    for (std::size_t a = 0; a < N; ++a) c.layout.strides[a][d] = strides[a][d];
  }
  c.operand_sizes[0] = 120;
  c.operand_sizes[1] = 30;
  if constexpr (N > 3) c.operand_sizes[2] = 120;
  c.out_elems = 120;
  return c;
}

/// [d0, d1, inner] with every innermost dim contiguous (the strided kernel's 16-byte row path
/// when inner and pitch are whole chunks and nothing is misaligned): the output's rows padded
/// to `pitch`, operand 1 stored [d1, d0, inner] (outer dims permuted, as a heads' transpose),
/// operand 2 contiguous, operand 3 with rows padded to `pitch`.
template <std::size_t N>
pointwise_case<N> outer_permuted_case(std::int64_t d0, std::int64_t d1, std::int64_t inner, std::int64_t pitch,
                                      std::size_t in_shift = 0) {
  pointwise_case<N> c{in_shift ? "strided.outer_permuted.misaligned_operand" : "strided.outer_permuted", {}, {}, 0, 0,
                      in_shift};
  c.layout.ndim = 3;
  c.layout.numel = d0 * d1 * inner;
  c.layout.flat = false;
  c.layout.shape[0] = d0;
  c.layout.shape[1] = d1;
  c.layout.shape[2] = inner;
  const std::int64_t strides[4][3] = {
      {d1 * pitch, pitch, 1}, {inner, d0 * inner, 1}, {d1 * inner, inner, 1}, {d1 * pitch, pitch, 1}};
  for (int d = 0; d < 3; ++d)
    for (std::size_t a = 0; a < N; ++a) c.layout.strides[a][d] = strides[a][d];
  c.operand_sizes[0] = static_cast<std::size_t>(d0 * d1 * inner);
  c.operand_sizes[1] = static_cast<std::size_t>(d0 * d1 * inner);
  if constexpr (N > 3) c.operand_sizes[2] = static_cast<std::size_t>(d0 * d1 * pitch);
  c.out_elems = static_cast<std::size_t>(d0 * d1 * pitch);
  return c;
}

/// Runs `make(pointers)` (a kernel tree over N-1 operands) on the device and on the host for
/// case `c`, and checks every element of the output buffer within `max_ulps`.
template <class T, std::size_t N, class Make>
void check_pointwise(const char* tree, Make make, const pointwise_case<N>& c,
                     const std::array<value_range, N - 1>& ranges, std::int64_t max_ulps) {
  CAPTURE(tree);
  CAPTURE(c.name);
  CAPTURE(c.layout.numel);
  constexpr std::size_t operands = N - 1;
  std::array<std::vector<T>, operands> host_in;
  std::array<device_ptr<T>, operands> dev_in;
  std::array<const T*, operands> host_ptrs{}, dev_ptrs{};
  for (std::size_t a = 0; a < operands; ++a) {
    const std::size_t shift = a == 1 ? c.in_shift : 0;
    host_in[a] = random_values<T>(c.operand_sizes[a] + shift, ranges[a], 1234u + 7u * static_cast<unsigned>(a));
    dev_in[a] = device_alloc<T>(c.operand_sizes[a] + shift);
    upload(dev_in[a].get(), host_in[a]);
    host_ptrs[a] = host_in[a].data() + shift;
    dev_ptrs[a] = dev_in[a].get() + shift;
  }
  const std::size_t total = c.out_elems + c.out_shift;
  auto dev_out = device_alloc<T>(total);
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(dev_out.get(), 0xFF, total * sizeof(T), cg::cuda::current_stream()));

  const auto k_dev = make(dev_ptrs);
  cg::detail::device_pointwise<std::remove_cvref_t<decltype(k_dev)>, T, N>::run(
      k_dev, dev_out.get() + c.out_shift, c.layout);
  const std::vector<T> got = download(dev_out.get(), total);

  std::vector<T> want(total, poison<T>());
  host_pointwise(make(host_ptrs), want.data() + c.out_shift, c.layout);

  std::size_t bad = 0;
  for (std::size_t i = 0; i < total; ++i) {
    if (ulp_distance(got[i], want[i]) > max_ulps) {
      if (++bad <= 5)
        FAIL_CHECK("element ", i, ": device ", show(got[i]), ", host ", show(want[i]));
    }
  }
  CHECK(bad == 0);
}

/// Range of operand values: small integers (no overflow in (a + b) * c); floats around 1.
template <class T>
value_range default_range() {
  return std::is_integral_v<T> ? value_range{-1000, 1000} : value_range{-4, 4};
}
/// A range with no zero, for divisors.
template <class T>
value_range positive_range() {
  return std::is_integral_v<T> ? value_range{1, 1000} : value_range{0.5, 4};
}

// The trees. They avoid a multiply feeding an add in float: nvcc contracts that into one FMA
// (one rounding) where the host rounds twice, and the results may differ in the last bit.

/// (a + b) * c
struct tree_add_mul {
  template <class T>
  auto operator()(const std::array<const T*, 3>& p) const {
    using namespace cg::detail;
    using sum = node_kernel<cg::ops::add, tensor_kernel<T, 1>, tensor_kernel<T, 2>>;
    return node_kernel<cg::ops::mul, sum, tensor_kernel<T, 3>>{sum{{p[0]}, {p[1]}}, {p[2]}};
  }
};

/// relu(a - b) / (c + s), s a scalar
struct tree_relu_div {
  template <class T>
  auto operator()(const std::array<const T*, 3>& p) const {
    using namespace cg::detail;
    T s;
    if constexpr (std::is_integral_v<T>)
      s = T(1);
    else
      s = T(0.25f);
    using diff = node_kernel<cg::ops::sub, tensor_kernel<T, 1>, tensor_kernel<T, 2>>;
    using num = node_kernel<cg::ops::relu, diff>;
    using den = node_kernel<cg::ops::add, tensor_kernel<T, 3>, scalar_kernel<T>>;
    return node_kernel<cg::ops::div, num, den>{num{diff{{p[0]}, {p[1]}}}, den{{p[2]}, {s}}};
  }
};

/// silu(a) * b: a transcendental (device expf and host expf may differ by an ulp or two).
struct tree_silu_mul {
  template <class T>
  auto operator()(const std::array<const T*, 2>& p) const {
    using namespace cg::detail;
    using act = node_kernel<cg::ops::silu, tensor_kernel<T, 1>>;
    return node_kernel<cg::ops::mul, act, tensor_kernel<T, 2>>{act{{p[0]}}, {p[1]}};
  }
};

template <class T>
void check_three_operand_trees() {
  const value_range any = default_range<T>(), positive = positive_range<T>();
  const std::vector<pointwise_case<4>> cases = {
      flat_case<4>(7),                 // tail only: fewer elements than one thread's chunk
      flat_case<4>(1000),              // one block
      flat_case<4>(1001, 1),           // output off 16-byte alignment: scalar stores
      flat_case<4>(100'003, 0, 3),     // one operand off 16-byte alignment: element loads
      flat_case<4>(5'000'003),         // several grid-stride iterations, ragged end
      broadcast_case<4>(37, 130),
      broadcast_case<4>(1500, 4099),   // several grid-stride iterations, rows not chunk-aligned
      transposed_case<4>(53, 61, 64),
      permuted_case<4>(),
      outer_permuted_case<4>(37, 29, 64, 72),      // 16-byte rows, one grid-stride pass
      outer_permuted_case<4>(300, 50, 128, 136),   // several grid-stride iterations
      outer_permuted_case<4>(37, 29, 64, 72, 3),   // operand 2 off 16-byte alignment: element path
      outer_permuted_case<4>(37, 29, 60, 68),      // rows whole 4-element chunks only: f32/i32 vectors
  };
  for (const auto& c : cases) {
    check_pointwise<T>("(a + b) * c", tree_add_mul{}, c, {any, any, any}, 0);
    check_pointwise<T>("relu(a - b) / (c + s)", tree_relu_div{}, c, {any, any, positive}, 0);
  }
}

template <class T>
void check_transcendental_tree(std::int64_t max_ulps) {
  const value_range any = default_range<T>();
  const std::vector<pointwise_case<3>> cases = {
      flat_case<3>(1'000'003),
      flat_case<3>(999, 1),
      flat_case<3>(4099, 0, 1),
      broadcast_case<3>(37, 130),
      transposed_case<3>(53, 61, 64),
      outer_permuted_case<3>(37, 29, 64, 72),
  };
  for (const auto& c : cases) check_pointwise<T>("silu(a) * b", tree_silu_mul{}, c, {any, any}, max_ulps);
}

}  // namespace

// ---- pointwise -----------------------------------------------------------------------------

TEST_CASE("pointwise.empty_launches_nothing") {
  // numel 0 returns before any CUDA call: no device needed, and a null output is never touched.
  cg::detail::device_layout<2> layout;
  layout.ndim = 1;
  layout.numel = 0;
  const std::array<const float*, 1> none{nullptr};
  using K = cg::detail::tensor_kernel<float, 1>;
  CHECK_NOTHROW(cg::detail::device_pointwise<K, float, 2>::run(K{none[0]}, nullptr, layout));
  layout.flat = false;
  CHECK_NOTHROW(cg::detail::device_pointwise<K, float, 2>::run(K{none[0]}, nullptr, layout));
  static_assert(cg::detail::has_device_pointwise<K, float, 2>);
}

GPU_TEST_CASE("pointwise.f32") {
  check_three_operand_trees<float>();
  check_transcendental_tree<float>(4);
}

GPU_TEST_CASE("pointwise.bf16") {
  // Both sides compute in float and round once per op: bit-exact, except where the float
  // results of expf differ and straddle a rounding boundary (1 ulp).
  check_three_operand_trees<cg::bf16>();
  check_transcendental_tree<cg::bf16>(1);
}

GPU_TEST_CASE("pointwise.f16") {
  check_three_operand_trees<cg::f16>();
  check_transcendental_tree<cg::f16>(1);
}

GPU_TEST_CASE("pointwise.i32") { check_three_operand_trees<std::int32_t>(); }

GPU_TEST_CASE("pointwise.flat.in_place") {
  // out = (out + b) * c: evaluate_into allows the output to be an operand of the same layout.
  constexpr std::int64_t n = 100'003;
  const auto a = random_values<float>(n, {-4, 4}, 1);
  const auto b = random_values<float>(n, {-4, 4}, 2);
  const auto c = random_values<float>(n, {-4, 4}, 3);
  auto da = device_alloc<float>(n), db = device_alloc<float>(n), dc = device_alloc<float>(n);
  upload(da.get(), a);
  upload(db.get(), b);
  upload(dc.get(), c);
  const auto k = tree_add_mul{}(std::array<const float*, 3>{da.get(), db.get(), dc.get()});
  const auto layout = flat_case<4>(n).layout;
  cg::detail::device_pointwise<std::remove_cvref_t<decltype(k)>, float, 4>::run(k, da.get(), layout);
  const auto got = download(da.get(), n);
  for (std::int64_t i = 0; i < n; ++i) REQUIRE(got[i] == (a[i] + b[i]) * c[i]);
}

GPU_TEST_CASE("pointwise.runs_on_current_stream") {
  // Under a stream_guard the kernel is queued on the guarded stream: its result is there after
  // synchronising that stream alone.
  cg::cuda::stream s;
  const cg::cuda::stream_guard on(s.get());
  constexpr std::int64_t n = 4099;
  const auto a = random_values<float>(n, {-4, 4}, 4);
  auto da = device_alloc<float>(n), dout = device_alloc<float>(n);
  upload(da.get(), a);
  using K = cg::detail::node_kernel<cg::ops::neg, cg::detail::tensor_kernel<float, 1>>;
  cg::detail::device_pointwise<K, float, 2>::run(K{{da.get()}}, dout.get(), flat_case<2>(n).layout);
  const auto got = download(dout.get(), n);
  for (std::int64_t i = 0; i < n; ++i) REQUIRE(got[i] == -a[i]);
}

// ---- GEMM ----------------------------------------------------------------------------------

namespace {

/// The exact value of an element (bf16 and f16 widen exactly through float).
template <class T>
double as_double(T v) {
  if constexpr (std::is_same_v<T, double>)
    return v;
  else
    return static_cast<double>(static_cast<float>(v));
}

/// C = A·B through `backend` with A [m,k] (stored transposed when ta), B [k,n] (transposed
/// when tb), every leading dimension padded, and optionally every pointer one element off its
/// allocation's alignment; checks ‖C - ref‖ / ‖ref‖ < tol against a double-precision product
/// and that C's padding keeps its poison.
template <class T>
void check_gemm(cg::cuda::detail::gemm_backend backend, bool ta, bool tb, std::int64_t m,
                std::int64_t n, std::int64_t k, double tol, bool misaligned = false) {
  CAPTURE(static_cast<int>(backend));
  CAPTURE(ta);
  CAPTURE(tb);
  CAPTURE(misaligned);
  const cg::dtype dt = cg::dtype_v<T>;
  CAPTURE(dt);
  const std::int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
  const std::size_t a_elems = static_cast<std::size_t>((ta ? k : m) * lda);
  const std::size_t b_elems = static_cast<std::size_t>((tb ? n : k) * ldb);
  const std::size_t c_elems = static_cast<std::size_t>(m * ldc);
  const std::vector<T> a = random_values<T>(a_elems, {-1, 1}, 11);
  const std::vector<T> b = random_values<T>(b_elems, {-1, 1}, 12);
  auto at = [&](std::int64_t i, std::int64_t p) {
    return as_double(ta ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)]);
  };
  auto bt = [&](std::int64_t p, std::int64_t j) {
    return as_double(tb ? b[static_cast<std::size_t>(j * ldb + p)] : b[static_cast<std::size_t>(p * ldb + j)]);
  };

  const std::size_t shift = misaligned ? 1 : 0;
  auto da = device_alloc<T>(a_elems + shift), db = device_alloc<T>(b_elems + shift),
       dc = device_alloc<T>(c_elems + shift);
  upload(da.get() + shift, a);
  upload(db.get() + shift, b);
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(dc.get(), 0xFF, (c_elems + shift) * sizeof(T),
                                     cg::cuda::current_stream()));
  cg::cuda::detail::gemm_with(backend, cg::device::cuda(0), dt, m, n, k, da.get() + shift, lda, ta,
                              db.get() + shift, ldb, tb, dc.get() + shift, ldc);
  const std::vector<T> c = download(dc.get() + shift, c_elems);

  double err2 = 0, ref2 = 0;
  std::size_t bad_padding = 0, non_finite = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const T got = c[static_cast<std::size_t>(i * ldc + j)];
      if (j >= n) {
        bad_padding += ulp_distance(got, poison<T>()) != 0 ? 1 : 0;
        continue;
      }
      double ref = 0;
      for (std::int64_t p = 0; p < k; ++p) ref += at(i, p) * bt(p, j);
      const double gv = as_double(got);
      non_finite += std::isfinite(gv) ? 0 : 1;
      err2 += (gv - ref) * (gv - ref);
      ref2 += ref * ref;
    }
  }
  CHECK(non_finite == 0);
  CHECK(bad_padding == 0);
  const double rel = std::sqrt(err2 / ref2);
  CAPTURE(rel);
  CHECK(rel < tol);
}

template <class T>
void check_gemm_all(double tol) {
  using cg::cuda::detail::gemm_backend;
  // Both entry points on their own (`lt` throws rather than fall back, so a plan that never
  // finds an algorithm cannot hide behind cublasGemmEx), then the default.
  for (const auto backend : {gemm_backend::lt, gemm_backend::gemm_ex, gemm_backend::automatic}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) check_gemm<T>(backend, ta, tb, 37, 53, 61, tol);
    }
  }
  // Operands off their 256-byte alignment (views into a buffer): cuBLASLt must be told.
  check_gemm<T>(gemm_backend::lt, false, true, 37, 53, 61, tol, /*misaligned=*/true);
  check_gemm<T>(gemm_backend::lt, true, false, 64, 48, 96, tol, /*misaligned=*/true);
  check_gemm<T>(gemm_backend::gemm_ex, true, true, 64, 48, 96, tol, /*misaligned=*/true);
}

}  // namespace

TEST_CASE("gemm.rejects_bad_arguments") {
  // Checked before any CUDA call, so these run without a GPU too.
  auto call = [](cg::device dev, cg::dtype dt, std::int64_t lda) {
    cg::cuda::detail::gemm(dev, dt, 2, 3, 4, nullptr, lda, false, nullptr, 3, false, nullptr, 3);
  };
  try {
    call(cg::device::cuda(0), cg::dtype::i32, 4);
    FAIL("gemm accepted i32");
  } catch (const cg::error& e) {
    const std::string what = e.what();
    CHECK(what.find("gemm") != std::string::npos);
    CHECK(what.find("i32") != std::string::npos);
  }
  CHECK_THROWS_AS(call(cg::device::cpu(), cg::dtype::f32, 4), cg::error);
  CHECK_THROWS_WITH_AS(call(cg::device::cuda(0), cg::dtype::f32, 3),
                       doctest::Contains("lda 3"), cg::error);
}

GPU_TEST_CASE("gemm.f32.no_tf32") {
  // TF32 would leave ~1e-3 relative error; full fp32 with k = 61 stays near 1e-7.
  check_gemm_all<float>(1e-5);
}

GPU_TEST_CASE("gemm.f64") { check_gemm_all<double>(1e-12); }

GPU_TEST_CASE("gemm.bf16") { check_gemm_all<cg::bf16>(1e-2); }

GPU_TEST_CASE("gemm.f16") { check_gemm_all<cg::f16>(1e-2); }

GPU_TEST_CASE("gemm.degenerate") {
  // k = 0: C is the empty sum, zero, padding untouched; m = 0: nothing happens at all.
  constexpr std::int64_t m = 5, n = 7, ldc = 9;
  auto dc = device_alloc<float>(m * ldc);
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(dc.get(), 0xFF, m * ldc * sizeof(float), cg::cuda::current_stream()));
  cg::cuda::detail::gemm(cg::device::cuda(0), cg::dtype::f32, m, n, 0, nullptr, 0, false, nullptr,
                         n, false, dc.get(), ldc);
  cg::cuda::detail::gemm(cg::device::cuda(0), cg::dtype::f32, 0, n, 3, nullptr, 3, false, nullptr,
                         n, false, dc.get(), ldc);
  const auto c = download(dc.get(), m * ldc);
  for (std::int64_t i = 0; i < m; ++i) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const float v = c[static_cast<std::size_t>(i * ldc + j)];
      if (j < n)
        REQUIRE(v == 0.f);
      else
        REQUIRE(std::isnan(v));  // still the poison
    }
  }
}

GPU_TEST_CASE("gemm.and_pointwise.capture_and_replay") {
  // A GEMM and a pointwise kernel captured into one CUDA Graph on a fresh stream (its cuBLAS
  // workspace is allocated during the capture), then replayed: the result equals the eager one.
  constexpr std::int64_t m = 37, n = 53, k = 61;
  const auto a = random_values<float>(m * k, {-1, 1}, 21);
  const auto b = random_values<float>(k * n, {-1, 1}, 22);
  auto da = device_alloc<float>(m * k), db = device_alloc<float>(k * n);
  auto dc = device_alloc<float>(m * n), dr = device_alloc<float>(m * n);
  upload(da.get(), a);
  upload(db.get(), b);
  using K = cg::detail::node_kernel<cg::ops::relu, cg::detail::tensor_kernel<float, 1>>;
  const auto layout = flat_case<2>(m * n).layout;
  auto step = [&] {
    cg::cuda::detail::gemm(cg::device::cuda(0), cg::dtype::f32, m, n, k, da.get(), k, false,
                           db.get(), n, false, dc.get(), n);
    cg::detail::device_pointwise<K, float, 2>::run(K{{dc.get()}}, dr.get(), layout);
  };
  step();
  const auto eager = download(dr.get(), m * n);

  cg::cuda::stream s;
  CCGRAPH_CHECK_CUDA(cudaStreamSynchronize(cg::cuda::current_stream()));
  CCGRAPH_CHECK_CUDA(cudaMemsetAsync(dr.get(), 0xFF, m * n * sizeof(float), s.get()));
  cg::cuda::graph g = cg::cuda::capture(s, [&] {
    const cg::cuda::stream_guard on(s.get());
    step();
  });
  REQUIRE(g);
  cg::cuda::graph_exec exec(g);
  exec.launch(s);
  s.synchronize();
  std::vector<float> replayed(m * n);
  CCGRAPH_CHECK_CUDA(cudaMemcpy(replayed.data(), dr.get(), m * n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(replayed == eager);
}
}  // namespace gpu_test_kernels
