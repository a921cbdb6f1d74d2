// ODR test, first TU: a header that defines a non-inline function or variable makes the two
// TUs fail to link together.
#include <ccgraph/ccgraph.hpp>

#include <string>

std::string odr_a() { return ccgraph::detail::concat("a", CCGRAPH_VERSION_MAJOR); }
