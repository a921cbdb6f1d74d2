// ccgraph/impl/gradient_rules.hpp: every op's gradient rules, compiled in the one unit of a
// program that includes this header. With CCGRAPH_SEPARATE_GRADIENTS defined in every unit
// (autograd/grad.hpp), the other units only declare them, so the minutes of compiling them are
// paid once instead of in each unit that calls cg::grad. <ccgraph/impl/src.hpp> includes it
// under separate compilation; a header-only program includes it in one unit of its own.
#pragma once

#include <ccgraph/autograd/grad.hpp>

#if !defined(CCGRAPH_SEPARATE_GRADIENTS)
#error "<ccgraph/impl/gradient_rules.hpp> compiles the gradient rules for the units that declare them: define CCGRAPH_SEPARATE_GRADIENTS in every unit of the program, this one included"
#endif

template void ccgraph::detail::run_gradient_rule_here<float>(ccgraph::detail::grad_ctx<float>&);
template void ccgraph::detail::run_gradient_rule_here<double>(ccgraph::detail::grad_ctx<double>&);
template void ccgraph::detail::run_gradient_rule_here<ccgraph::bf16>(ccgraph::detail::grad_ctx<ccgraph::bf16>&);
