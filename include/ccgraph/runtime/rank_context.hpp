// ccgraph/runtime/rank_context.hpp: moved to <ccgraph/comm/rank_context.hpp>
// (the rank context sits below the ops that read it). This header forwards there, so existing includes keep compiling.
#pragma once

#include <ccgraph/comm/rank_context.hpp>
