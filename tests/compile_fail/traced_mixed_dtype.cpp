// expect: operator[+]: mixing dtypes
// Inside cg::trace, a pointwise expression over traced values of two element types fails at
// compile time with the same static_assert as on tensors, naming the operator: tracing never
// inserts a silent conversion.
#include <cstdint>

#include <ccgraph/ops/pointwise.hpp>
#include <ccgraph/trace/trace.hpp>

void traced_mixed_dtype() {
  namespace cg = ccgraph;
  auto g = cg::trace(cg::trace_options{.rank = 0, .world_size = 1},
                     [](auto a, auto b) { return cg::eval(cg::relu(a) + b); },
                     cg::input<float>({4}), cg::input<std::int32_t>({4}));
  (void)g;
}
