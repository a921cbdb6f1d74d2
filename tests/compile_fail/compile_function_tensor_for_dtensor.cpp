// expect: no match(ing function)? for call to
// A plain tensor passed where compile_function's argument list declares cg::dtensor<T> does
// not compile: the call takes the dtensor (its layout is part of the program), and the
// diagnostic names compiled_function's call operator and the argument that does not convert.
#include <ccgraph/ccgraph.hpp>

void compile_function_tensor_for_dtensor(ccgraph::rank_context& ctx) {
  namespace cg = ccgraph;
  auto f = cg::compile_function<cg::dtensor<float>>([](auto x) { return x + x; }, ctx);
  (void)f(cg::zeros<float>({4, 4}));
}
