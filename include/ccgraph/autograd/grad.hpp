// ccgraph/autograd/grad.hpp: cg::grad and cg::value_and_grad (JAX-style). Reverse mode over the
// traced graph: the backward of each node is recorded, by the node's own gradient rule
// (op_traits<O>::gradient, next to the op), as more nodes of the same graph, so the result is one
// joint forward + backward graph that cg::schedule, cg::compile and cg::compile_function take
// unchanged. Called with tensors, the function is traced, differentiated and run at once.
//
// Everything here is a template instantiated where a gradient is taken: including this header
// (the umbrella does) compiles no rule.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ccgraph/autograd/pointwise_grad.hpp>
#include <ccgraph/core/config.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/ir/graph.hpp>
#include <ccgraph/ops/comm_counter.hpp>
#include <ccgraph/runtime/compiled_function.hpp>
#include <ccgraph/runtime/executor.hpp>
#include <ccgraph/runtime/rank_context.hpp>
#include <ccgraph/schedule/cost_model.hpp>
#include <ccgraph/schedule/recompute.hpp>
#include <ccgraph/trace/ops.hpp>
#include <ccgraph/trace/symbolic.hpp>
#include <ccgraph/trace/trace.hpp>

namespace ccgraph {

/// How cg::grad and cg::value_and_grad build the joint forward + backward graph.
struct grad_options {
  /// When the trace ends, run the recompute_pointwise pass on the whole graph: a cheap
  /// pointwise value that the backward reads is recomputed there from inputs that are alive
  /// anyway, instead of kept from the forward, wherever that lowers the memory planner's live
  /// peak (schedule/recompute.hpp; PyTorch's joint-graph partitioner does this by default). The
  /// results are the same bits either way.
  bool recompute_pointwise = true;
  /// Its time budget (estimated by the default cost model) and memory measure.
  recompute_options recompute{};
};

namespace detail {

/// Calls f(tag) with a value of the floating element type `d` that gradients are taken in
/// (f32, f64, bf16: a bf16 value's gradient is bf16, as in PyTorch); any other type is an error
/// naming `what`.
template <class F>
decltype(auto) visit_grad_dtype(dtype d, std::string_view what, F&& f) {
  if (d == dtype::f64) return f(double{});
  if (d == dtype::bf16) return f(bf16{});
  CCGRAPH_CHECK(d == dtype::f32, "grad: ", what, " is ", d, "; gradients are taken in f32, f64 and bf16 (", d,
                " is not supported yet)");
  return f(float{});
}

/// The values of checkpoint regions (autograd/checkpoint.hpp) recomputed for the backward,
/// lazily: for a rule of a node inside region R, read(v, R) of a value computed inside R records
/// a copy of its node (after the copies of the values of R it reads, recursively) the first time
/// a rule asks, and returns the copy's value from then on; values from outside R (its inputs,
/// another region's outputs) are read as they are, kept from the forward. A collective is copied
/// with all its waits. A nested region belongs to the outermost one. (A template, so that it is
/// compiled only where a gradient is taken.)
template <class Unused = void>
class recomputer {
 public:
  explicit recomputer(trace_state& st) : st_(st) {
    // Regions are recorded when they end: an enclosing region comes after the ones it holds.
    // Resharded regions first, numbered after the checkpoints: a checkpoint enclosing one
    // takes its nodes.
    const std::size_t nc = st.checkpoints.size();
    for (std::size_t r = 0; r < st.reshards.size(); ++r)
      for (const node* n : st.reshards[r]) region_[n] = nc + r;
    first_reshard_ = nc;
    for (std::size_t r = 0; r < nc; ++r)
      for (const node* n : st.checkpoints[r]) region_[n] = r;
  }
  /// The region `n` was recorded in (its outermost), or -1.
  std::ptrdiff_t region_of(const node* n) const {
    const auto it = region_.find(n);
    return it == region_.end() ? -1 : static_cast<std::ptrdiff_t>(it->second);
  }
  /// `v`, or its recomputed copy when region `r` computed it, or when a resharded region did
  /// (whichever rule reads it).
  value_ref read(value_ref v, std::ptrdiff_t r) {
    if (const std::ptrdiff_t own = region_of(v.src); own >= static_cast<std::ptrdiff_t>(first_reshard_)) r = own;
    if (r < 0 || region_of(v.src) != r) return v;
    if (auto it = done_.find(v); it != done_.end()) return it->second;
    node* n = v.src;
    if (n->is_wait()) {  // copying the collective copies its waits
      (void)read(n->args().at(0), r);
      return done_.at(v);
    }
    if (const auto* pw = std::get_if<ops::pointwise>(&n->kind()); pw && pw->kernel && pw->kernel->draws_random())
      CCGRAPH_THROW(error, "checkpoint: node %", n->name(), " (", n->op(), ") draws random numbers inside a "
                    "checkpointed function; recomputing it for the backward would draw another mask. Move the "
                    "dropout out of the checkpointed function");
    std::vector<value_ref> args;
    for (const value_ref& a : n->args()) args.push_back(read(a, r));
    node* c = st_.g.add(n->kind(), std::move(args), n->group(), n->name());
    copies_.push_back(c);
    for (int k = 0; k < n->num_outputs(); ++k) done_[value_ref{n, k}] = value_ref{c, k};
    if (n->is_collective()) {
      const std::vector<node*> users = n->users();
      for (node* u : users)
        if (u->is_wait()) {
          node* w = st_.g.add(u->kind(), {done_.at(u->args().at(0))}, u->group(), u->name());
          copies_.push_back(w);
          done_[value_ref{u, 0}] = value_ref{w, 0};
        }
    }
    return done_.at(v);
  }

  /// When the backward is recorded: erases the copies nothing reads (a rule reads its inputs
  /// whether or not the gradient it computes needs them: linear's reads w when only w's
  /// gradient is asked for; a recomputed collective is impure, so no later pass would drop it),
  /// latest first, except the values in `keep` (the gradients returned); then counts each
  /// recomputed collective that stays as issued (comm_counter), since it runs again.
  void prune(const std::vector<value_ref>& keep) {
    std::unordered_set<const node*> kept;
    for (const value_ref& k : keep) kept.insert(k.src);
    for (auto it = copies_.rbegin(); it != copies_.rend(); ++it) {
      node* c = *it;
      if (c->users().empty() && !kept.count(c)) {
        st_.g.erase(c);
        continue;
      }
      if (c->is_collective()) note_collective(c->op());
    }
    copies_.clear();
  }

 private:
  struct key_hash {
    std::size_t operator()(const value_ref& r) const {
      return std::hash<const void*>()(r.src) ^ (static_cast<std::size_t>(r.index) * 0x9e3779b97f4a7c15ULL);
    }
  };
  trace_state& st_;
  std::unordered_map<const node*, std::size_t> region_;
  std::size_t first_reshard_ = 0;
  std::unordered_map<value_ref, value_ref, key_hash> done_;
  std::vector<node*> copies_;  // recorded copies, in order
};

/// What a gradient rule sees of one node: its op's inputs and outputs as traced values, the
/// gradients flowing into its outputs, and where the gradients of its inputs go. T is the
/// element type of the node's differentiated outputs. A rule reads `input<U>(i)`, `output<U>(k)`,
/// `grad<U>(k)`, asks `needs_grad(i)`, and gives each needed input's gradient with `add_grad(i, g)`.
template <class T>
class grad_ctx {
 public:
  /// The element type the node's gradients are in.
  using value_type = T;

  /// `rc`: the recomputed values the rule reads instead (a node inside a checkpoint region).
  grad_ctx(trace_state* st, const node* n, std::vector<std::optional<value_ref>> gout, std::vector<char> needs,
           recomputer<>* rc = nullptr)
      : st_(st), n_(n), gout_(std::move(gout)), needs_(std::move(needs)), gin_(n->args().size()), rc_(rc),
        region_(rc ? rc->region_of(n) : -1) {}

  /// Number of inputs and of outputs of the node.
  std::size_t num_inputs() const { return n_->args().size(); }
  int num_outputs() const { return n_->num_outputs(); }
  /// Input i as a traced value of element type U.
  template <class U = T>
  symbolic<U> input(std::size_t i) const {
    return symbolic<U>(st_, saved(n_->args().at(i)));
  }
  /// Output k as a traced value of element type U. A collective's output is its wait_tensor's
  /// (tracing adds one per output, right after it): the graph may read a collective's result only
  /// there, and a rule reading the raw output would give a graph that lint refuses.
  template <class U = T>
  symbolic<U> output(int k = 0) const {
    const value_ref v{const_cast<node*>(n_), k};
    if (n_->is_collective())
      for (node* u : n_->users())
        if (std::holds_alternative<ops::wait_tensor>(u->kind()) && u->args().at(0) == v)
          return symbolic<U>(st_, saved({u, 0}));
    return symbolic<U>(st_, saved(v));
  }
  /// True when a gradient flows into output k.
  bool has_grad(int k = 0) const { return gout_.at(static_cast<std::size_t>(k)).has_value(); }
  /// The gradient of output k (zeros of its shape when none flows there).
  template <class U = T>
  symbolic<U> grad(int k = 0) const {
    if (const auto& g = gout_.at(static_cast<std::size_t>(k))) return symbolic<U>(st_, *g);
    return filled_like(output<U>(k), 0.0);
  }
  /// True when input i needs a gradient (it depends on a differentiated input).
  bool needs_grad(std::size_t i) const { return needs_.at(i) != 0; }
  /// True when input i is a transpose of its source's last two dims (`w.transpose(0, 1)` of a
  /// matrix, `x.transpose(-2, -1)`): a rule can then give that input's gradient transposed from
  /// a product computed in the source's own layout, as PyTorch's mm_mat2_backward does by
  /// strides, so the source's gradient (a weight's) is contiguous for its collective and the
  /// optimizer rather than a transposed view every later pointwise kernel reads strided.
  bool input_is_transposed(std::size_t i) const {
    const value_ref& v = n_->args().at(i);
    const auto* t = std::get_if<ops::transpose>(&v.src->kind());
    const std::size_t r = v.src->meta(v.index).shape.size();
    if (t == nullptr || r < 2) return false;
    const int d0 = normalize_dim(t->dim0, r, "grad"), d1 = normalize_dim(t->dim1, r, "grad");
    return std::min(d0, d1) == static_cast<int>(r) - 2 && std::max(d0, d1) == static_cast<int>(r) - 1;
  }
  /// Adds `g` to input i's gradient.
  template <class U>
  void add_grad(std::size_t i, const symbolic<U>& g) {
    if (!needs_grad(i)) return;
    const tensor_meta& m = n_->args().at(i).src->meta(n_->args()[i].index);
    CCGRAPH_CHECK(g.shape() == m.shape && dtype_v<U> == m.dtype, "grad: the gradient rule of ", n_->op(), " (node %",
                  n_->name(), ") gave input ", i, " a gradient ", tensor_meta{dtype_v<U>, g.shape()}.str(),
                  " for an input ", m.str());
    auto& slot = gin_.at(i);
    slot = slot ? symbolic<U>(symbolic<U>(st_, *slot) + g).ref() : g.ref();
  }
  /// The node's group (collectives).
  const group_info& group() const {
    CCGRAPH_CHECK(n_->group().has_value(), "grad: node %", n_->name(), " (", n_->op(), ") has no group");
    return *n_->group();
  }
  /// The rank the graph is traced for.
  int rank() const { return st_->rank; }
  /// Records collective `op` on `xs` over this node's group (its waits follow), counted by
  /// the comm_counters alive (as every functional collective is).
  template <class U>
  std::vector<symbolic<U>> collective(ops::collective_op op, const std::vector<symbolic<U>>& xs) const {
    note_collective(ops::name_of(op));
    return collective_backend<symbolic<U>>::issue(ops::name_of(op).data(), std::move(op), group(), xs);
  }
  /// Helpers for rules (members, so a rule in an op header finds them where it is instantiated):
  /// `g` summed down to `shape` (the gradient of a broadcast).
  template <class U>
  symbolic<U> sum_to(const symbolic<U>& g, const shape_t& shape) const {
    return sum_to_shape(g, shape);
  }
  /// Zeros of x's shape and type.
  template <class U>
  symbolic<U> zeros_like(const symbolic<U>& x) const {
    return filled_like(x, 0.0);
  }
  /// `v` broadcast to `like`'s shape.
  template <class U>
  symbolic<U> expand_as(const symbolic<U>& v, const symbolic<U>& like) const {
    return expand_like(like, v);
  }
  /// `g` (of a slice of length g.size(dim) at `start` along `dim`) placed in zeros of `like`'s
  /// shape: the gradient of narrow / select.
  template <class U>
  symbolic<U> pad_into(const symbolic<U>& g, const symbolic<U>& like, std::int64_t dim, std::int64_t start) const {
    const int d = normalize_dim(dim, like.shape().size(), "grad");
    const std::int64_t len = g.size(d), total = like.size(d);
    if (len == total) return g;
    // Zeros of `k` along d, shaped from the gradient rather than from `like`, so the rule keeps
    // no forward value alive (nor makes a resharded one be gathered again, FSDP) for a shape.
    auto zeros = [&](std::int64_t k) {
      if (len == 0) return filled_like(like.narrow(d, 0, k), 0.0);  // no gradient to shape it from
      const symbolic<U> z = filled_like(g, 0.0);
      std::vector<symbolic<U>> reps;
      for (std::int64_t have = 0; have < k; have += len) reps.push_back(z);
      const symbolic<U> zs = reps.size() == 1 ? z : cat(reps, d);
      return zs.size(d) == k ? zs : zs.narrow(d, 0, k);
    };
    std::vector<symbolic<U>> parts;
    if (start > 0) parts.push_back(zeros(start));
    parts.push_back(g);
    if (start + len < total) parts.push_back(zeros(total - start - len));
    return cat(parts, d);
  }
  /// The node, for messages.
  const node& current() const { return *n_; }
  /// The gradients given to the inputs (what the engine collects).
  const std::vector<std::optional<value_ref>>& input_grads() const { return gin_; }

 private:
  trace_state* st_;
  const node* n_;
  std::vector<std::optional<value_ref>> gout_;
  std::vector<char> needs_;
  std::vector<std::optional<value_ref>> gin_;
  recomputer<>* rc_;
  std::ptrdiff_t region_;

  /// A forward value as the rule reads it: recomputed when the node's checkpoint region made it.
  value_ref saved(value_ref v) const { return rc_ ? rc_->read(v, region_) : v; }
};

/// Runs node `n`'s gradient rule (op_traits<O>::gradient::backward) in this translation unit:
/// an op whose rule is still gradient_todo, or that is not_differentiable, is an error naming it.
/// Instantiating it compiles every op's rule for T, and under nvcc their pointwise kernels: the
/// minutes of nvcc that run_gradient_rule spares the units of a CUDA program (below).
template <class T>
void run_gradient_rule_here(grad_ctx<T>& c) {
  const node& n = c.current();
  visit_op(n.kind(), [&](const auto& o) {
    using O = std::decay_t<decltype(o)>;
    using G = typename op_traits<O>::gradient;
    if constexpr (std::is_same_v<G, gradient_todo> && std::is_same_v<O, ops::user>) {
      CCGRAPH_THROW(error, "grad: user op ", o.op, " (node %", n.name(), ") has no gradient rule, and a "
                    "differentiated input reaches the result through it");
    } else if constexpr (std::is_same_v<G, gradient_todo>) {
      CCGRAPH_THROW(error, "grad: ", O::name, " (node %", n.name(), ") has no gradient rule yet, and a differentiated "
                    "input reaches the result through it (", G::reason, ")");
    } else if constexpr (std::is_same_v<G, not_differentiable>) {
      CCGRAPH_THROW(error, "grad: ", O::name, " (node %", n.name(), ") is not differentiable, and a differentiated "
                    "input reaches the result through it");
    } else {
      G::backward(o, c);
    }
  });
}

// With CCGRAPH_SEPARATE_GRADIENTS (defined in every unit of the program) the rules are compiled
// once, by the one unit that includes <ccgraph/impl/gradient_rules.hpp> (<ccgraph/impl/src.hpp>
// does under separate compilation): minutes of -O2 there instead of in every unit that
// differentiates. Opt-in, since a program that never differentiates would pay them for nothing.
// Not in units nvcc compiles, whose rules must hold device kernels.
#if defined(CCGRAPH_SEPARATE_GRADIENTS) && !defined(__CUDACC__)
extern template void run_gradient_rule_here<float>(grad_ctx<float>&);
extern template void run_gradient_rule_here<double>(grad_ctx<double>&);
extern template void run_gradient_rule_here<bf16>(grad_ctx<bf16>&);
#endif

/// The gradient rules of every op for T, compiled once by the unit that compiles a CUDA
/// program's op kernels (src/cuda_op_kernels.cu, with CCGRAPH_CUDA_GRADIENT_KERNELS; see
/// cuda/install_ops.hpp) and installed there at start-up; null until then.
template <class T>
inline void (*gradient_rule_slot)(grad_ctx<T>&) = nullptr;

/// Runs node `n`'s gradient rule: the installed one (gradient_rule_slot) when a unit installed
/// it, which is the same code compiled by nvcc; else, in a unit that does not leave the kernels
/// to another (no CCGRAPH_CUDA_NO_OP_KERNELS: a host program, or a one-unit CUDA program), the
/// rules compiled here. A unit with CCGRAPH_CUDA_NO_OP_KERNELS never compiles them, and refuses
/// when nothing installed them rather than record kernels that could not run on a GPU.
template <class T>
void run_gradient_rule(grad_ctx<T>& c) {
  if (const auto installed = gradient_rule_slot<T>) return installed(c);
#if defined(CCGRAPH_CUDA_NO_OP_KERNELS)
  CCGRAPH_THROW(error, "grad: node %", c.current().name(), " (", c.current().op(),
                "): this translation unit was compiled with CCGRAPH_CUDA_NO_OP_KERNELS, so the gradient "
                "rules come from the unit that compiles the op kernels, but none installed them: link "
                "ccgraph_cuda_op_kernels (src/cuda_op_kernels.cu), or compile one unit of the program "
                "without CCGRAPH_CUDA_NO_OP_KERNELS and with CCGRAPH_CUDA_GRADIENT_KERNELS");
#else
  run_gradient_rule_here(c);
#endif
}

/// The sum of two gradients of one value. (A template, so that it is compiled only where a
/// gradient is taken, not in every translation unit of the umbrella header.)
template <class Unused = void>
value_ref add_grads(trace_state& st, value_ref a, value_ref b) {
  return visit_grad_dtype(a.src->dtype(a.index), "a gradient", [&](auto tag) {
    using U = decltype(tag);
    return symbolic<U>(symbolic<U>(&st, a) + symbolic<U>(&st, b)).ref();
  });
}

/// Reverse mode over the nodes of `st`'s graph recorded so far: records the gradient of `loss`
/// (one element) with respect to each of `wrt` and returns them (zeros for an input the loss
/// does not depend on). Only floating values carry gradients: an integer or bool value (an
/// index, a comparison) stops them.
template <class Unused = void>
std::vector<value_ref> backprop(trace_state& st, value_ref loss, const std::vector<value_ref>& wrt) {
  const std::vector<node*> order = st.g.nodes();  // a copy: the rules append nodes
  struct key_hash {
    std::size_t operator()(const value_ref& r) const {
      return std::hash<const void*>()(r.src) ^ (static_cast<std::size_t>(r.index) * 0x9e3779b97f4a7c15ULL);
    }
  };
  // Values that depend on a differentiated input.
  std::unordered_map<value_ref, char, key_hash> depends;
  for (const value_ref& w : wrt) depends[w] = 1;
  for (node* n : order) {
    if (n->category() == op_category::output) continue;
    bool any = false;
    for (const value_ref& a : n->args()) any = any || depends.count(a);
    // A point-to-point batch may carry a peer's differentiated value: its receives count as
    // depending on one on every rank, so all ranks run its backward alike.
    if (!any && !std::holds_alternative<ops::batch_isend_irecv>(n->kind())) continue;
    for (int k = 0; k < n->num_outputs(); ++k)
      if (is_floating(n->dtype(k))) depends.emplace(value_ref{n, k}, 1);
  }
  std::unordered_map<value_ref, value_ref, key_hash> grads;
  recomputer<> rc(st);
  auto accumulate = [&](value_ref v, value_ref g) {
    auto [it, fresh] = grads.emplace(v, g);
    if (!fresh) it->second = add_grads(st, it->second, g);
  };
  if (depends.count(loss)) {
    visit_grad_dtype(loss.src->dtype(loss.index), "the function's result", [&](auto tag) {
      using U = decltype(tag);
      accumulate(loss, filled_like(symbolic<U>(&st, loss), 1.0).ref());
    });
  }
  // Gradient hooks (trace_state::grad_hooks) on a value replace its whole gradient when its node
  // is reached (every user has been, so the gradient is complete). A differentiated value with
  // a hook gets it run on every rank alike, with zeros where no gradient reached it, since a
  // hook may issue collectives.
  auto apply_hooks = [&](value_ref v) {
    if (!depends.count(v)) return;
    for (const grad_hook& h : st.grad_hooks) {
      if (!(h.at == v)) continue;
      auto g = grads.find(v);
      const value_ref in = g != grads.end() ? g->second
                                            : visit_grad_dtype(v.src->dtype(v.index), "a hooked value", [&](auto tag) {
                                                using U = decltype(tag);
                                                return filled_like(symbolic<U>(&st, v), 0.0).ref();
                                              });
      grads.insert_or_assign(v, h.fn(in));
    }
  };
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    node* n = *it;
    if (n->category() == op_category::output || n->category() == op_category::input) continue;
    if (!st.grad_hooks.empty())
      for (int k = 0; k < n->num_outputs(); ++k) apply_hooks(value_ref{n, k});
    std::vector<std::optional<value_ref>> gout(static_cast<std::size_t>(n->num_outputs()));
    bool any_grad = false;
    int first = -1;
    for (int k = 0; k < n->num_outputs(); ++k)
      if (auto g = grads.find({n, k}); g != grads.end()) {
        gout[static_cast<std::size_t>(k)] = g->second;
        any_grad = true;
        if (first < 0) first = k;
      }
    std::vector<char> needs(n->args().size(), 0);
    bool any_need = false;
    for (std::size_t i = 0; i < needs.size(); ++i) {
      needs[i] = depends.count(n->args()[i]) ? 1 : 0;
      any_need = any_need || needs[i];
    }
    // Every rank must issue the same backward collectives: a collective's backward runs wherever
    // its input is differentiated (SPMD: on every rank alike), with zeros for a result this rank
    // does not use, and a point-to-point batch's backward runs on every rank.
    const bool p2p = std::holds_alternative<ops::batch_isend_irecv>(n->kind());
    const bool run = p2p || (n->is_collective() ? any_need : any_grad && any_need);
    if (!run) continue;
    // The element type of the rule: of the first output with a gradient, else the first
    // floating output or input (a collective whose result this rank does not use).
    dtype dt = dtype::f32;
    bool found = false;
    if (first >= 0) {
      dt = n->dtype(first);
      found = true;
    }
    for (int k = 0; !found && k < n->num_outputs(); ++k)
      if (is_floating(n->dtype(k))) dt = n->dtype(k), found = true;
    for (const value_ref& a : n->args())
      if (!found && is_floating(a.src->dtype(a.index))) dt = a.src->dtype(a.index), found = true;
    if (!found) continue;
    const std::string what = "a value of %" + n->name();
    visit_grad_dtype(dt, what, [&](auto tag) {
      using U = decltype(tag);
      grad_ctx<U> c(&st, n, std::move(gout), needs, &rc);
      run_gradient_rule(c);
      for (std::size_t i = 0; i < needs.size(); ++i) {
        if (!needs[i]) continue;
        const auto& g = c.input_grads()[i];
        CCGRAPH_CHECK(g.has_value(), "grad: the gradient rule of ", n->op(), " (node %", n->name(),
                      ") gave no gradient for its input ", i, " (%", n->args()[i].src->name(), ")");
        accumulate(n->args()[i], *g);
      }
    });
  }
  std::vector<value_ref> out;
  for (const value_ref& w : wrt) {
    if (auto g = grads.find(w); g != grads.end()) {
      out.push_back(g->second);
    } else {
      out.push_back(visit_grad_dtype(w.src->dtype(w.index), "a differentiated input", [&](auto tag) {
        using U = decltype(tag);
        return filled_like(symbolic<U>(&st, w), 0.0).ref();
      }));
    }
  }
  rc.prune(out);
  return out;
}

/// The element type gradients of a function of inputs Ts... are returned in: the first floating
/// one's (each differentiated input must have it).
template <class... Ts>
struct grad_element;
template <>
struct grad_element<> {
  using type = float;
};
template <class T, class... Ts>
struct grad_element<T, Ts...> {
  using type = std::conditional_t<is_floating(dtype_v<T>), T, typename grad_element<Ts...>::type>;
};

/// A dtensor (dist/dtensor.hpp, a layer above): what value_and_grad reads of a dtensor loss.
template <class R>
concept dtensor_like = requires(const R& r) {
  r.to_local();
  r.placements();
  r.device_mesh();
};

/// A traced dtensor: dtensor_like, its local value symbolic, and it makes the dtensor of a
/// gradient of its local value (dtensor::grad_from_local).
template <class X>
concept traced_dtensor_like = dtensor_like<X> && requires(const X& x) {
  { x.local_value() } -> symbolic_type;
  x.grad_from_local(x.local_value());
};

/// An eager dtensor (cg::dtensor<T>): dtensor_like with a tensor local value.
template <class X>
concept eager_dtensor_like = dtensor_like<X> && requires(const X& x) {
  requires is_tensor_v<std::remove_cvref_t<decltype(x.local_value())>>;
};

/// The compile_function argument kind of an eager input: its element type for a tensor<T>,
/// the dtensor type itself for a dtensor.
template <class X>
struct eager_kind {
  using type = X;
};
template <class T>
struct eager_kind<tensor<T>> {
  using type = T;
};

/// What value_and_grad differentiates for an argument: a traced dtensor's local value, or the
/// symbolic value itself.
template <class X>
const auto& local_of(const X& x) {
  if constexpr (traced_dtensor_like<X>) return x.local_value();
  else return x;
}

template <class X>
struct traced_value_type {
  using type = typename X::value_type;
};

}  // namespace detail

/// What cg::value_and_grad returns: a callable that gives std::tuple{value, gradient of each
/// `wrt` input, in order}. Called with traced values (inside cg::trace) it records the forward
/// and the backward into the enclosing trace; called with tensors it traces, differentiates and
/// runs at once (on the calling rank's context inside run_threads, else on a one-rank world).
/// `f` must return one element (a 0-d or 1-element tensor).
template <class F, std::size_t N, bool WithValue>
class value_and_grad_fn {
 public:
  value_and_grad_fn(F f, std::array<int, N> wrt, grad_options opt = {}) : f_(std::move(f)), wrt_(wrt), opt_(opt) {}

  /// Traced: the value and the gradients as traced values of the enclosing trace.
  template <class... Ts>
  auto operator()(const symbolic<Ts>&... xs) const {
    static_assert(sizeof...(Ts) > 0, "value_and_grad: the function needs at least one input");
    using G = typename detail::grad_element<Ts...>::type;
    const std::array<value_ref, sizeof...(Ts)> refs{xs.ref()...};
    detail::trace_state* st = std::get<0>(std::forward_as_tuple(xs...)).state();
    // Collective counters without a phase label count the forward under "forward" and the
    // backward under "backward" (PyTorch's CommDebugMode does the same by module hooks).
    auto label = [](const char* phase) {
      std::vector<comm_counter::phase_scope> scopes;
      for (comm_counter* c : detail::active_comm_counters())
        if (c->current_phase().empty()) scopes.push_back(c->phase(phase));
      return scopes;
    };
    auto forward_scopes = label("forward");
    auto value = [&] {
      auto result = f_(xs...);
      using R = std::remove_cvref_t<decltype(result)>;
      if constexpr (detail::dtensor_like<R>) {
        // A dtensor loss: its local value through to_local(), whose gradient hook makes the
        // gradients those of the global loss (a Replicate loss counted once, not once per rank).
        using L = std::remove_cvref_t<decltype(result.to_local())>;
        static_assert(is_symbolic_v<L>, "value_and_grad: a dtensor loss must be traced (its local value symbolic)");
        return L(result.to_local());
      } else {
        static_assert(is_symbolic_v<R> || is_expression_v<R>,
                      "value_and_grad: the function must return one tensor (its loss), a 0-d or 1-element one, "
                      "or a dtensor of one element");
        return symbolic<typename detail::traced_value_type<R>::type>(result);
      }
    }();
    forward_scopes.clear();
    auto backward_scopes = label("backward");
    CCGRAPH_CHECK(value.numel() == 1, "value_and_grad: the function must return one element (a 0-d or 1-element "
                  "tensor), got shape ", shape_str(value.shape()));
    std::vector<value_ref> wrt;
    for (std::size_t i = 0; i < N; ++i) {
      const int k = wrt_[i];
      CCGRAPH_CHECK(k >= 0 && static_cast<std::size_t>(k) < sizeof...(Ts), "value_and_grad: wrt index ", k,
                    " is out of range for a function of ", sizeof...(Ts), " input(s)");
      const tensor_meta& m = refs[static_cast<std::size_t>(k)].src->meta(refs[static_cast<std::size_t>(k)].index);
      CCGRAPH_CHECK(m.dtype == dtype_v<G>, "value_and_grad: input ", k, " is ", m.str(), "; the inputs differentiated "
                    "must all have the element type of the first floating input (", dtype_v<G>, ")");
      wrt.push_back(refs[static_cast<std::size_t>(k)]);
    }
    const std::vector<value_ref> g = detail::backprop(*st, value.ref(), wrt);
    if (opt_.recompute_pointwise)
      st->finish_with("recompute_pointwise", [o = opt_.recompute](graph& jg) {
        const cost_model model;
        (void)recompute_pointwise(jg, [&](const node& n) { return model.estimate_us(n); }, o);
      });
    auto grads = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple{symbolic<G>(st, g[I])...};
    }(std::make_index_sequence<N>{});
    if constexpr (WithValue)
      return std::tuple_cat(std::tuple{value}, grads);
    else if constexpr (N == 1)
      return std::get<0>(grads);
    else
      return grads;
  }

  /// Traced, with traced dtensors among the inputs (what cg::compile_function gives a function
  /// for its cg::dtensor<T> arguments, or from_local of a traced value): the function is called
  /// with them as given and differentiated with respect to their local values. Each gradient
  /// is a traced dtensor laid out as its input (dtensor::grad_from_local: a Partial input's
  /// gradient is Replicate), the same numbers as taking the local values in and calling
  /// from_local inside gives; the value is the dtensor the function returned (a Partial loss
  /// stays each rank's term), or its one-element tensor. Every `wrt` input must be a dtensor.
  template <class... Xs>
    requires((detail::traced_dtensor_like<Xs> || ...) && ((detail::traced_dtensor_like<Xs> || is_symbolic_v<Xs>) && ...))
  auto operator()(const Xs&... xs) const {
    static constexpr std::array<bool, sizeof...(Xs)> is_dtensor{detail::traced_dtensor_like<Xs>...};
    for (std::size_t i = 0; i < N; ++i) {
      const int k = wrt_[i];
      CCGRAPH_CHECK(k >= 0 && static_cast<std::size_t>(k) < sizeof...(Xs), "value_and_grad: wrt index ", k,
                    " is out of range for a function of ", sizeof...(Xs), " input(s)");
      CCGRAPH_CHECK(is_dtensor[static_cast<std::size_t>(k)], "value_and_grad: input ", k,
                    " is a tensor among dtensor inputs; differentiate dtensors only (make it one with from_local)");
    }
    using R = std::remove_cvref_t<decltype(f_(xs...))>;
    std::optional<R> loss;  // what f returned, kept for a dtensor value
    // f on the dtensors as given: their local values are the symbolic values differentiated.
    auto on_dtensors = [&](const auto&...) {
      R r = f_(xs...);
      if constexpr (detail::dtensor_like<R>) loss.emplace(r);
      return r;
    };
    const auto out =
        value_and_grad_fn<decltype(on_dtensors), N, WithValue>(on_dtensors, wrt_, opt_)(detail::local_of(xs)...);
    const auto args = std::forward_as_tuple(xs...);
    // The gradient of input wrt_[i] (a dtensor: checked above; of the gradients' element type:
    // checked by the symbolic call) as a dtensor of its layout.
    auto grad_of = [&](std::size_t i, const auto& g) {
      using G = std::remove_cvref_t<decltype(g)>;
      std::optional<dtensor_of_local_t<G, Xs...>> d;
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        (
            [&] {
              using XK = std::remove_cvref_t<decltype(std::get<K>(args))>;
              if constexpr (detail::traced_dtensor_like<XK>)
                if constexpr (std::is_same_v<std::remove_cvref_t<decltype(std::get<K>(args).local_value())>, G>)
                  if (static_cast<std::size_t>(wrt_[i]) == K) d.emplace(std::get<K>(args).grad_from_local(g));
            }(),
            ...);
      }(std::index_sequence_for<Xs...>{});
      return std::move(*d);
    };
    auto value = [&](const auto& v) {
      if constexpr (detail::dtensor_like<R>) return *loss;
      else return v;
    };
    if constexpr (WithValue) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple{value(std::get<0>(out)), grad_of(I, std::get<I + 1>(out))...};
      }(std::make_index_sequence<N>{});
    } else if constexpr (N == 1) {
      return grad_of(0, out);
    } else {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::tuple{grad_of(I, std::get<I>(out))...};
      }(std::make_index_sequence<N>{});
    }
  }

  /// Eager, with dtensors among the inputs (cg::dtensor<T>; needs <ccgraph/ccgraph.hpp>, which
  /// brings dist/compiled_dtensor.hpp): traces, differentiates and runs at once on the calling
  /// rank, as cg::compile_function of this callable does, so the value and gradients are the
  /// dtensors the traced overload above gives (gradients laid out as their inputs).
  template <class... Xs>
    requires((detail::eager_dtensor_like<Xs> || ...) && ((detail::eager_dtensor_like<Xs> || is_tensor_v<Xs>) && ...))
  auto operator()(const Xs&... xs) const {
    rank_context* ctx = detail::current_rank_ptr();
    CCGRAPH_CHECK(ctx != nullptr, "value_and_grad: dtensor inputs need the calling rank's context (call it inside "
                  "run_threads or run_gpus)");
    return compile_function<typename detail::eager_kind<Xs>::type...>(*this, *ctx)(xs...);
  }

  /// Eager: traces the function on these tensors' shapes, differentiates it and runs the joint
  /// graph; the same values as the traced form gives.
  template <class... Ts>
  auto operator()(const tensor<Ts>&... xs) const {
    auto g = trace([this](const auto&... s) { return (*this)(s...); }, xs...);
    if (rank_context* ctx = detail::current_rank_ptr()) return compile(g, *ctx)(xs...);
    // No rank: a world of one, with no communicator (a collective in f then needs run_threads).
    const device dev = std::get<0>(std::forward_as_tuple(xs...)).device();
    rank_context local(0, 1, dev, std::make_shared<group_registry>(1), nullptr);
    return compile(g, local)(xs...);
  }

 private:
  /// The first of the traced dtensors Xs whose local value is an L (void if none).
  template <class L, class... Xs>
  struct dtensor_of_local {
    using type = void;
  };
  template <class L, class X, class... Xs>
  struct dtensor_of_local<L, X, Xs...> {
    static auto pick() {
      if constexpr (detail::traced_dtensor_like<X>) {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(std::declval<const X&>().local_value())>, L>)
          return std::type_identity<X>{};
        else
          return std::type_identity<typename dtensor_of_local<L, Xs...>::type>{};
      } else {
        return std::type_identity<typename dtensor_of_local<L, Xs...>::type>{};
      }
    }
    using type = typename decltype(pick())::type;
  };
  template <class L, class... Xs>
  using dtensor_of_local_t = typename dtensor_of_local<L, Xs...>::type;

  F f_;
  std::array<int, N> wrt_;
  grad_options opt_;
};

/// cg::value_and_grad(f, {1, 2}): a callable returning std::tuple{f(xs...), d f / d xs[1],
/// d f / d xs[2]} (JAX's value_and_grad with argnums). `f` maps tensors to one element (the
/// loss); gradients are the sum over every use of an input, zeros for an input f does not use.
/// `opt`: how the joint graph is built (cg::grad_options).
template <class F, std::size_t N>
auto value_and_grad(F f, const int (&wrt)[N], grad_options opt = {}) {
  std::array<int, N> w{};
  for (std::size_t i = 0; i < N; ++i) w[i] = wrt[i];
  return value_and_grad_fn<F, N, true>(std::move(f), w, opt);
}
/// cg::value_and_grad(f, i): std::tuple{value, gradient of input i} (input 0 by default).
template <class F>
auto value_and_grad(F f, int wrt = 0, grad_options opt = {}) {
  return value_and_grad_fn<F, 1, true>(std::move(f), {wrt}, opt);
}
/// cg::grad(f, {1, 2}): a callable returning std::tuple of the gradients of inputs 1 and 2.
template <class F, std::size_t N>
auto grad(F f, const int (&wrt)[N], grad_options opt = {}) {
  std::array<int, N> w{};
  for (std::size_t i = 0; i < N; ++i) w[i] = wrt[i];
  return value_and_grad_fn<F, N, false>(std::move(f), w, opt);
}
/// cg::grad(f, i): a callable returning the gradient of input i (input 0 by default).
template <class F>
auto grad(F f, int wrt = 0, grad_options opt = {}) {
  return value_and_grad_fn<F, 1, false>(std::move(f), {wrt}, opt);
}

}  // namespace ccgraph
