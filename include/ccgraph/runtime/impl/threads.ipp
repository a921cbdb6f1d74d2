// ccgraph/runtime/impl/threads.ipp: the non-template functions of
// <ccgraph/runtime/threads.hpp>. Included by that header when header-only, compiled once by
// <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION.
#pragma once

#include <ccgraph/runtime/threads.hpp>

namespace ccgraph {

namespace detail {

CCGRAPH_DECL std::vector<std::shared_ptr<collective_request>> split_p2p(const collective_request& req) {
  const auto& b = std::get<ops::batch_isend_irecv>(req.op);
  std::vector<std::size_t> slot(b.ops.size());  // per transfer: its input (send) or output (recv)
  std::size_t sends = 0, recvs = 0;
  for (std::size_t i = 0; i < b.ops.size(); ++i) slot[i] = b.ops[i].is_send ? sends++ : recvs++;
  std::vector<std::shared_ptr<collective_request>> out;
  for (auto& t : ops::p2p_transfers(b, req.rank, req.group)) {
    auto r = std::make_shared<collective_request>();
    const bool is_send = t.op.ops[0].is_send;
    r->op = std::move(t.op);
    r->group = std::move(t.pair);
    r->rank = req.rank;
    r->overlap = req.overlap;
    if (is_send) r->inputs.push_back(req.inputs.at(slot[t.index]));
    else r->outputs.push_back(req.outputs.at(slot[t.index]));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace detail

}  // namespace ccgraph
