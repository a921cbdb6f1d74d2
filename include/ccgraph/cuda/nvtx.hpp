// ccgraph/cuda/nvtx.hpp: NVTX ranges in ccgraph's own domain ("ccgraph"), so Nsight Systems
// shows the executor's nodes and the nccl backend's collectives by name. NVTX v3 is header-only
// (the CUDA toolkit's nvtx3/): with no tool attached every call is a jump to an empty function,
// and a tool (nsys) is found once, at the first call, through NVTX_INJECTION64_PATH.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace ccgraph::cuda::detail {

/// ccgraph's NVTX domain, created at first use.
inline nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA("ccgraph");
  return d;
}

/// `label` registered in the domain (a tool copies it once; ranges then pass a handle): null
/// when no tool listens.
inline void* nvtx_register(const char* label) {
  return static_cast<void*>(nvtxDomainRegisterStringA(nvtx_domain(), label));
}

/// Opens a range named by a handle from nvtx_register.
inline void nvtx_push(void* name) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = static_cast<nvtxStringHandle_t>(name);
  nvtxDomainRangePushEx(nvtx_domain(), &a);
}

/// Opens a range named `name` (a string that outlives the call; nothing is formatted).
inline void nvtx_push_ascii(const char* name) {
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = name;
  nvtxDomainRangePushEx(nvtx_domain(), &a);
}

/// Closes the innermost range of this thread in the domain.
inline void nvtx_pop() { nvtxDomainRangePop(nvtx_domain()); }

/// An NVTX range for the scope, named `name` (see nvtx_push_ascii).
class nvtx_scope {
 public:
  explicit nvtx_scope(const char* name) { nvtx_push_ascii(name); }
  nvtx_scope(const nvtx_scope&) = delete;
  nvtx_scope& operator=(const nvtx_scope&) = delete;
  ~nvtx_scope() { nvtx_pop(); }
};

}  // namespace ccgraph::cuda::detail
