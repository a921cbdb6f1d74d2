// ccgraph/schedule/verify.hpp: moved to <ccgraph/runtime/verify.hpp>
// (it runs collectives, so it lives beside the runtime). This header forwards there, so existing includes keep compiling.
#pragma once

#include <ccgraph/runtime/verify.hpp>
