// ccgraph/nccl/ops.hpp: each collective's NCCL calls, the CUDA side of its op_traits
// (ops/collective_ops.hpp): one nccl_impl<O> per collective of the closed set, checked complete
// below, so a collective without NCCL calls fails to compile wherever <ccgraph/cuda.hpp> is
// included. Reached only from <ccgraph/cuda.hpp> (through cuda/nccl_backend.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <variant>
#include <vector>

#include <ccgraph/core/visit.hpp>
#include <ccgraph/core/dtype.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/cuda/error.hpp>
#include <ccgraph/cuda/nccl_comm.hpp>
#include <ccgraph/ops/collective_ops.hpp>
#include <ccgraph/comm/communicator.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

namespace ccgraph::cuda::detail {

/// The NCCL element type of `dt` (bool travels as bytes, complex as pairs of its real type:
/// c10d's view_as_real, so a count of complex elements doubles: nccl_count).
inline ncclDataType_t nccl_dtype(dtype dt) {
  switch (real_dtype(dt)) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
    case dtype::u8: return ncclUint8;
    case dtype::boolean: return ncclUint8;
    case dtype::bf16: return ncclBfloat16;
    case dtype::f16: return ncclFloat16;
    default: break;
  }
  CCGRAPH_THROW(::ccgraph::error, "nccl: unsupported dtype ", dt);
}

/// NCCL elements of nccl_dtype(dt) in `n` elements of `dt`: 2n for complex, n otherwise.
inline std::size_t nccl_count(std::int64_t n, dtype dt) {
  return static_cast<std::size_t>(n) * (is_complex(dt) ? 2 : 1);
}

/// An NCCL reduction for one call: a built-in one, or a premul_sum made for it by
/// ncclRedOpCreatePreMulSum on its communicator and destroyed with this handle, once the call
/// it was passed to has returned (NCCL allows that, and c10d's ncclRedOpRAII does the same).
class nccl_redop_handle {
 public:
  explicit nccl_redop_handle(ncclRedOp_t op) : op_(op) {}
  nccl_redop_handle(ncclRedOp_t op, ncclComm_t comm) : op_(op), comm_(comm) {}
  nccl_redop_handle(const nccl_redop_handle&) = delete;
  nccl_redop_handle& operator=(const nccl_redop_handle&) = delete;
  ~nccl_redop_handle() {
    if (comm_) (void)ncclRedOpDestroy(op_, comm_);  // a destructor cannot throw; NCCL reports misuse on its next call
  }
  operator ncclRedOp_t() const { return op_; }  // NOLINT: implicit, to pass it to an NCCL call
 private:
  ncclRedOp_t op_;
  ncclComm_t comm_ = nullptr;
};

/// premul_sum `op` on elements of `dt` as an NCCL reduction of `comm`: the factor cast to the
/// element type (a complex tensor's real type), held by NCCL as a host immediate.
template <class T>
nccl_redop_handle nccl_premul_sum(reduce_op op, ncclDataType_t ndt, ncclComm_t comm) {
  const T factor = [&] {
    if constexpr (std::is_same_v<T, double>) return op.factor();
    else return T(static_cast<float>(op.factor()));  // as c10d's T(double_factor)
  }();
  ncclRedOp_t r{};
  CCGRAPH_CHECK_NCCL(ncclRedOpCreatePreMulSum(&r, const_cast<T*>(&factor), ndt, ncclScalarHostImmediate, comm));
  return nccl_redop_handle(r, comm);
}

/// The NCCL reduction of `op` on elements of type `dt`. bool travels as bytes (nccl_dtype), so
/// its reductions become the byte ones that give bool results (bool_reduce_as_bytes: sum is
/// max, product min, as c10d does for sum; a byte sum would wrap to false at 256 trues). NCCL
/// has no bitwise reductions: band, bor and bxor are errors, except band and bor on bool.
inline nccl_redop_handle nccl_redop(reduce_op op, dtype dt, ncclComm_t comm, const char* what) {
  if (dt == dtype::boolean) {
    const std::optional<reduce_op> bytes = bool_reduce_as_bytes(op);
    CCGRAPH_CHECK(bytes.has_value(), what, ": reduce op ", op,
                  " on bool tensors is not supported by NCCL (it has sum, product, min, max, band, bor for bool)");
    op = *bytes;
  }
  switch (op.kind()) {
    case reduce_kind::sum: return nccl_redop_handle(ncclSum);
    case reduce_kind::avg: return nccl_redop_handle(ncclAvg);
    case reduce_kind::product: return nccl_redop_handle(ncclProd);
    case reduce_kind::min: return nccl_redop_handle(ncclMin);
    case reduce_kind::max: return nccl_redop_handle(ncclMax);
    case reduce_kind::premul_sum:
      switch (real_dtype(dt)) {  // ops::infer admits floating and complex tensors only
        case dtype::f32: return nccl_premul_sum<float>(op, ncclFloat32, comm);
        case dtype::f64: return nccl_premul_sum<double>(op, ncclFloat64, comm);
        case dtype::bf16: return nccl_premul_sum<bf16>(op, ncclBfloat16, comm);
        case dtype::f16: return nccl_premul_sum<f16>(op, ncclFloat16, comm);
        default: break;
      }
      CCGRAPH_THROW(::ccgraph::error, what, ": reduce op ", op, " on ", dt,
                    " tensors is not supported by NCCL (PreMulSum takes half, float, bfloat16, double)");
    default: break;
  }
  CCGRAPH_THROW(::ccgraph::error, what, ": reduce op ", op,
                " is not supported by NCCL (it has sum, avg, product, min, max, premul_sum)");
}

/// The device address of a buffer's first element.
inline void* buffer_address(const ::ccgraph::detail::buffer& b) {
  return static_cast<char*>(b.st ? b.st->data() : nullptr) +
         b.offset * static_cast<std::int64_t>(element_size(b.meta.dtype));
}

/// A whole collective request, as the NCCL calls of an op whose inputs and outputs do not pair
/// up tensor by tensor need it (batch_isend_irecv).
struct nccl_request {
  const ::ccgraph::detail::collective_request& req;
  ncclComm_t comm;
  cudaStream_t stream;
  const char* what;
};

/// One tensor of a collective request, as an NCCL call needs it.
struct nccl_call {
  const ::ccgraph::detail::collective_request& req;
  const ::ccgraph::detail::buffer& in;   // this tensor's input
  const ::ccgraph::detail::buffer& out;  // and output
  void* in_ptr;
  void* out_ptr;
  ncclComm_t comm;
  cudaStream_t stream;
  const char* what;

  /// Counts in NCCL elements of dt() (complex: twice the complex count).
  std::size_t in_count() const { return nccl_count(numel_of(in.meta.shape), in.meta.dtype); }
  std::size_t out_count() const { return nccl_count(numel_of(out.meta.shape), out.meta.dtype); }
  ncclDataType_t dt() const { return nccl_dtype(in.meta.dtype); }
  /// The reduction for one NCCL call on this communicator: keep the handle alive until the call
  /// returns (pass `c.redop(op)` straight into it).
  nccl_redop_handle redop(reduce_op op) const { return nccl_redop(op, in.meta.dtype, comm, what); }
};

/// The NCCL calls of collective `O`: one tensor at a time, `issue(o, nccl_call)`, or, for an op
/// whose inputs and outputs do not pair up, the whole request, `issue_request(o, nccl_request)`;
/// and `grouped` when even one tensor (or the request) takes several NCCL calls (then the
/// backend wraps them in a group).
template <class O>
struct nccl_impl;

template <>
struct nccl_impl<ops::all_reduce> {
  static constexpr bool grouped = false;
  static void issue(const ops::all_reduce& o, const nccl_call& c) {
    CCGRAPH_CHECK_NCCL(ncclAllReduce(c.in_ptr, c.out_ptr, c.in_count(), c.dt(), c.redop(o.op), c.comm, c.stream));
  }
};
template <>
struct nccl_impl<ops::all_reduce_coalesced> {
  static constexpr bool grouped = false;
  static void issue(const ops::all_reduce_coalesced& o, const nccl_call& c) {
    nccl_impl<ops::all_reduce>::issue(ops::all_reduce{o.op}, c);
  }
};
template <>
struct nccl_impl<ops::all_gather_into_tensor> {
  static constexpr bool grouped = false;
  static void issue(const ops::all_gather_into_tensor&, const nccl_call& c) {
    CCGRAPH_CHECK_NCCL(ncclAllGather(c.in_ptr, c.out_ptr, c.in_count(), c.dt(), c.comm, c.stream));
  }
};
template <>
struct nccl_impl<ops::all_gather_into_tensor_coalesced> {
  static constexpr bool grouped = false;
  static void issue(const ops::all_gather_into_tensor_coalesced& o, const nccl_call& c) {
    nccl_impl<ops::all_gather_into_tensor>::issue(ops::all_gather_into_tensor{o.group_size}, c);
  }
};
template <>
struct nccl_impl<ops::reduce_scatter_tensor> {
  static constexpr bool grouped = false;
  static void issue(const ops::reduce_scatter_tensor& o, const nccl_call& c) {
    CCGRAPH_CHECK_NCCL(ncclReduceScatter(c.in_ptr, c.out_ptr, c.out_count(), c.dt(), c.redop(o.op), c.comm, c.stream));
  }
};
template <>
struct nccl_impl<ops::reduce_scatter_tensor_coalesced> {
  static constexpr bool grouped = false;
  static void issue(const ops::reduce_scatter_tensor_coalesced& o, const nccl_call& c) {
    nccl_impl<ops::reduce_scatter_tensor>::issue(ops::reduce_scatter_tensor{o.op, o.group_size}, c);
  }
};
template <>
struct nccl_impl<ops::broadcast> {
  static constexpr bool grouped = false;
  static void issue(const ops::broadcast& o, const nccl_call& c) {
    CCGRAPH_CHECK_NCCL(
        ncclBroadcast(c.in_ptr, c.out_ptr, c.in_count(), c.dt(), c.req.group.index_of(o.src), c.comm, c.stream));
  }
};
template <>
struct nccl_impl<ops::all_to_all_single> {
  static constexpr bool grouped = true;  // a send and a recv per peer
  /// Grouped send/recv: rows of dim 0, split per peer in group order.
  static void issue(const ops::all_to_all_single& o, const nccl_call& c) {
    const int n = c.req.group.size();
    const auto& in = c.in;
    const auto& out = c.out;
    const std::int64_t rows_in = in.meta.shape.empty() ? 1 : in.meta.shape[0];
    // A row in NCCL elements of c.dt() (a complex element is two).
    const std::int64_t row = rows_in ? static_cast<std::int64_t>(c.in_count()) / rows_in : 0;
    auto splits = [&](const std::vector<std::int64_t>& v, std::int64_t total) {
      return v.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(n), total / n) : v;
    };
    const std::int64_t rows_out = out.meta.shape.empty() ? 1 : out.meta.shape[0];
    const auto ins = splits(o.input_split_sizes, rows_in);
    const auto outs = splits(o.output_split_sizes, rows_out);
    const auto esz = static_cast<std::int64_t>(element_size(real_dtype(in.meta.dtype)));
    std::int64_t so = 0, ro = 0;
    for (int j = 0; j < n; ++j) {
      const auto sj = static_cast<std::size_t>(j);
      if (ins[sj] * row > 0)
        CCGRAPH_CHECK_NCCL(ncclSend(static_cast<char*>(c.in_ptr) + so * row * esz,
                                    static_cast<std::size_t>(ins[sj] * row), c.dt(), j, c.comm, c.stream));
      if (outs[sj] * row > 0)
        CCGRAPH_CHECK_NCCL(ncclRecv(static_cast<char*>(c.out_ptr) + ro * row * esz,
                                    static_cast<std::size_t>(outs[sj] * row), c.dt(), j, c.comm, c.stream));
      so += ins[sj];
      ro += outs[sj];
    }
  }
};

template <>
struct nccl_impl<ops::reduce> {
  static constexpr bool grouped = false;
  /// NCCL writes the root's output only; the others return their input, as c10d's.
  static void issue(const ops::reduce& o, const nccl_call& c) {
    if (c.req.rank != o.dst && c.out_ptr != c.in_ptr)
      CCGRAPH_CHECK_CUDA(cudaMemcpyAsync(c.out_ptr, c.in_ptr,
                                         static_cast<std::size_t>(numel_of(c.in.meta.shape)) * element_size(c.in.meta.dtype),
                                         cudaMemcpyDeviceToDevice, c.stream));
    CCGRAPH_CHECK_NCCL(ncclReduce(c.in_ptr, c.out_ptr, c.in_count(), c.dt(), c.redop(o.op),
                                  c.req.group.index_of(o.dst), c.comm, c.stream));
  }
};
template <>
struct nccl_impl<ops::batch_isend_irecv> {
  static constexpr bool grouped = true;  // NCCL pairs a group's sends and receives whatever their order
  /// Sends read the inputs in order, receives fill the outputs in order: ncclSend/ncclRecv,
  /// all inside the backend's ncclGroupStart/End.
  static void issue_request(const ops::batch_isend_irecv& o, const nccl_request& c) {
    const auto& req = c.req;
    std::size_t si = 0, ri = 0;
    for (const ops::p2p_desc& d : o.ops) {
      const int peer = req.group.index_of(d.peer);
      CCGRAPH_CHECK(peer >= 0 && d.peer != req.rank, c.what, ": peer rank ", d.peer, " is not another member of group ",
                    list_str(req.group.ranks));
      const auto& b = d.is_send ? req.inputs.at(si++) : req.outputs.at(ri++);
      const auto count = nccl_count(numel_of(b.meta.shape), b.meta.dtype);
      if (count == 0) continue;
      if (d.is_send)
        CCGRAPH_CHECK_NCCL(ncclSend(buffer_address(b), count, nccl_dtype(b.meta.dtype), peer, c.comm, c.stream));
      else
        CCGRAPH_CHECK_NCCL(ncclRecv(buffer_address(b), count, nccl_dtype(b.meta.dtype), peer, c.comm, c.stream));
    }
  }
};

/// `O`'s NCCL calls take the whole request (nccl_impl<O>::issue_request), not one tensor at a time.
template <class O>
concept nccl_per_request = requires(const O& o, const nccl_request& r) {
  { nccl_impl<O>::issue_request(o, r) } -> std::same_as<void>;
};

template <class O>
concept has_nccl_impl = requires(const O& o, const nccl_call& c) {
  { nccl_impl<O>::grouped } -> std::convertible_to<bool>;
} && (nccl_per_request<O> || requires(const O& o, const nccl_call& c) {
  { nccl_impl<O>::issue(o, c) } -> std::same_as<void>;
});

/// Enqueues the NCCL calls of `req` (collective `o`) on `s`: per tensor, or per request.
template <class O>
void nccl_issue(const O& o, const ::ccgraph::detail::collective_request& req, ncclComm_t comm, cudaStream_t s,
                const char* what) {
  if constexpr (nccl_per_request<O>) {
    nccl_impl<O>::issue_request(o, nccl_request{req, comm, s, what});
  } else {
    for (std::size_t i = 0; i < req.inputs.size(); ++i)
      nccl_impl<O>::issue(o, nccl_call{req, req.inputs[i], req.outputs[i], buffer_address(req.inputs[i]),
                                       buffer_address(req.outputs[i]), comm, s, what});
  }
}

template <class O>
constexpr bool check_nccl_op() {
  static_assert(has_nccl_impl<O>,
                "nccl backend: a collective lacks `nccl_impl<O>` (issue or issue_request, grouped) in cuda/nccl_ops.hpp; see "
                "docs/concepts.md \"Adding an op\" (the op is named in the instantiation backtrace)");
  return true;
}
template <class... Os>
constexpr bool check_nccl_ops(const std::variant<Os...>*) {
  return (check_nccl_op<Os>() && ...);
}
// Every collective of the closed set has its NCCL calls.
static_assert(check_nccl_ops(static_cast<const ops::collective_op*>(nullptr)));

/// True when one tensor of collective `op` already takes several NCCL calls (a group).
inline bool nccl_always_grouped(const ops::collective_op& op) {
  return ::ccgraph::detail::visit([](const auto& o) { return nccl_impl<std::decay_t<decltype(o)>>::grouped; }, op);
}

}  // namespace ccgraph::cuda::detail
