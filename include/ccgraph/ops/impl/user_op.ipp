// ccgraph/ops/impl/user_op.ipp: the non-template functions of
// <ccgraph/ops/user_op.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/ops/user_op.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL user_op_registry& user_ops() {
  static user_op_registry r;
  return r;
}

}  // namespace detail

CCGRAPH_DECL user_op register_op(user_op_def def) {
  CCGRAPH_CHECK(!def.name.empty(), "register_op: the op needs a name (\"namespace::op\")");
  CCGRAPH_CHECK(static_cast<bool>(def.infer), "register_op: ", def.name, " has no infer (its shape function)");
  CCGRAPH_CHECK(static_cast<bool>(def.cpu), "register_op: ", def.name, " has no cpu callable");
  CCGRAPH_CHECK(static_cast<bool>(def.cost), "register_op: ", def.name,
                " has no cost: the scheduler overlaps communication by it; give op_cost::compute(flops, bytes, "
                "peak_class::...)");
  auto d = std::make_shared<const user_op_def>(std::move(def));
  auto& reg = detail::user_ops();
  std::lock_guard lk(reg.mu);
  const auto [it, inserted] = reg.ops.emplace(d->name, d);
  CCGRAPH_CHECK(inserted, "register_op: an op named ", d->name, " is already registered");
  return user_op(d);
}

}  // namespace ccgraph
