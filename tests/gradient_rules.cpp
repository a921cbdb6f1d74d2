// Every op's gradient rules, compiled once for the whole test executable: its units define
// CCGRAPH_SEPARATE_GRADIENTS (tests/CMakeLists.txt), so they only declare them.
#include <ccgraph/impl/gradient_rules.hpp>
