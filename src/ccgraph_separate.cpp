// ccgraph's separately compiled part, for the in-tree programs that use separate compilation (the
// CPU examples, structure.separate_compilation): see <ccgraph/impl/src.hpp>.
#include <ccgraph/impl/src.hpp>
