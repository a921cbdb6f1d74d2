// ccgraph/autograd/data_parallel.hpp: the gradient collectives of data parallelism, issued the
// way DDP issues them. The schedule passes never change the relative order of collectives
// (every rank must issue them alike), so the order a program issues its gradients' all_reduces
// in is the order they can run in: issued in parameter order, the first layer's all_reduce
// (whose gradient the backward computes last) holds back every later one until the backward
// has ended, and nothing overlaps. cg::all_reduce_gradients issues them in the order the
// backward produces the gradients (the last layer's first), so bucket_collectives groups
// neighbours into buckets and raise_comms starts each bucket as soon as its gradients exist,
// behind the rest of the backward.
//
// Everything here is a template instantiated where it is called.
#pragma once

#include <cstddef>
#include <vector>

#include <ccgraph/core/reduce_op.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ops/collectives.hpp>
#include <ccgraph/tensor/tensor.hpp>
#include <ccgraph/trace/symbolic.hpp>

namespace ccgraph {

/// The all_reduce (`op`: "avg" as DDP, "sum", ...) of each gradient over `g`, returned in the
/// order of `grads`. Traced, they are issued in the order the graph computes the gradients (a
/// stable sort by producing node), which every rank shares, so the schedule passes can bucket
/// them and overlap each bucket with the remaining backward; eagerly, in the order given.
template <class V>
std::vector<V> all_reduce_gradients(const std::vector<V>& grads, reduce_op_arg op, const group& g) {
  std::vector<V> out = grads;  // (a symbolic value has no default)
  for (const std::size_t i : production_order(grads)) out[i] = V(all_reduce(grads[i], op, g));
  return out;
}

}  // namespace ccgraph
