// ccgraph/runtime/impl/cpu_collectives.ipp: the non-template functions of
// <ccgraph/runtime/cpu_collectives.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/runtime/cpu_collectives.hpp>

namespace ccgraph::detail {

CCGRAPH_DECL void snapshot_aliased_inputs(collective_request& req) {
  auto range = [](const buffer& b) {
    const auto bytes = numel_of(b.meta.shape) * static_cast<std::int64_t>(element_size(b.meta.dtype));
    const auto* p = b.st ? static_cast<const std::byte*>(b.st->data()) : nullptr;
    const auto* lo = p ? p + b.offset * static_cast<std::int64_t>(element_size(b.meta.dtype)) : nullptr;
    return std::pair<const std::byte*, const std::byte*>{lo, lo ? lo + bytes : nullptr};
  };
  for (auto& in : req.inputs) {
    const auto [ilo, ihi] = range(in);
    if (!ilo || ilo == ihi) continue;
    bool aliased = false;
    for (auto& out : req.outputs) {
      const auto [olo, ohi] = range(out);
      aliased = aliased || (olo && olo < ihi && ilo < ohi);
    }
    if (!aliased) continue;
    const auto bytes = static_cast<std::size_t>(ihi - ilo);
    auto copy = storage::host(bytes);
    std::memcpy(copy->data(), ilo, bytes);
    in = buffer{std::move(copy), 0, in.meta};
  }
}

CCGRAPH_DECL void run_cpu_collective(const collective_request& mine,
                               const std::vector<const collective_request*>& all, int me) {
  // A receive has no input: its output's dtype is the transfer's.
  visit_any_dtype((mine.inputs.empty() ? mine.outputs.at(0) : mine.inputs[0]).meta.dtype, [&](auto tag) {
    const cpu_member<decltype(tag)> m{mine, all, me};
    ::ccgraph::detail::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          require_run_cpu_collective<O>();
          op_traits<O>::run_cpu(o, m);
        },
        mine.op);
  });
}

}  // namespace ccgraph::detail
