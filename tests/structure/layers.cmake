# tests/structure/layers.cmake (cmake -P, a CTest test): the layers of include/ccgraph/ include
# only downward. A folder may include itself and the folders before it in LAYERS; the few
# exceptions below say why. A header that only forwards an old path to a moved one is skipped.
#   cmake -DINCLUDE_DIR=<repo>/include -P tests/structure/layers.cmake
# impl/ is <ccgraph/impl/src.hpp>, the separately compiled part: it includes everything.
set(LAYERS core tensor expr group ops comm ir trace schedule runtime autograd dist cuda nccl interop impl)
set(ALLOWED
  # The tensor declares the expression types it converts from; expr/ builds on tensor/.
  "tensor/tensor.hpp>expr/fwd.hpp"
  # The functional collectives are the front end of comm/: they hand their descriptors
  # (ops/collective_ops.hpp, below comm/) to the calling rank's communicator.
  "ops/collectives.hpp>comm/rank_context.hpp")

if(NOT INCLUDE_DIR)
  message(FATAL_ERROR "layers.cmake: pass -DINCLUDE_DIR=<repo>/include")
endif()
file(GLOB_RECURSE _headers RELATIVE "${INCLUDE_DIR}/ccgraph" "${INCLUDE_DIR}/ccgraph/*/*.hpp"
     "${INCLUDE_DIR}/ccgraph/*/*.cuh" "${INCLUDE_DIR}/ccgraph/*/*.ipp")
set(_bad "")
foreach(_h IN LISTS _headers)
  string(REGEX MATCH "^[a-z_]+" _from "${_h}")
  list(FIND LAYERS "${_from}" _from_rank)
  if(_from_rank LESS 0)
    string(APPEND _bad "  ${_h}: folder ${_from} is not in LAYERS (add it where it belongs)\n")
    continue()
  endif()
  file(READ "${INCLUDE_DIR}/ccgraph/${_h}" _text)
  if(_text MATCHES "This header forwards there")
    continue()
  endif()
  string(REGEX MATCHALL "#include <ccgraph/[a-z_]+/[a-z_./]+>" _incs "${_text}")
  foreach(_inc IN LISTS _incs)
    string(REGEX REPLACE "#include <ccgraph/([a-z_]+/[a-z_./]+)>" "\\1" _target "${_inc}")
    string(REGEX MATCH "^[a-z_]+" _to "${_target}")
    list(FIND LAYERS "${_to}" _to_rank)
    if(_to_rank GREATER _from_rank)
      list(FIND ALLOWED "${_h}>${_target}" _ok)
      if(_ok LESS 0)
        string(APPEND _bad "  ${_h} includes ${_target}: ${_to}/ is above ${_from}/\n")
      endif()
    endif()
  endforeach()
endforeach()
if(_bad)
  message(FATAL_ERROR "layers: headers that reach upward (order: ${LAYERS}):\n${_bad}")
endif()
list(LENGTH _headers _n)
message(STATUS "layers: ${_n} headers include only downward")
