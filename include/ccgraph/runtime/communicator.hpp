// ccgraph/runtime/communicator.hpp: moved to <ccgraph/comm/communicator.hpp>
// (the communicator sits below the ops that call it). This header forwards there, so existing includes keep compiling.
#pragma once

#include <ccgraph/comm/communicator.hpp>
