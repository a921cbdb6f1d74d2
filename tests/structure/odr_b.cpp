// ODR test, second TU: see odr_a.cpp.
#include <ccgraph/ccgraph.hpp>

#include <string>

std::string odr_b() { return ccgraph::detail::concat("b", CCGRAPH_VERSION_MINOR); }
