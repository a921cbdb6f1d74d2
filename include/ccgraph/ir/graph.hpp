// ccgraph/ir/graph.hpp: the IR. A graph owns its nodes in topological order; each node knows its
// inputs and users, and the graph keeps the two consistent through one mutator (set_args).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/tensor_meta.hpp>
#include <ccgraph/group/group.hpp>
#include <ccgraph/ir/node_op.hpp>

namespace ccgraph {

class node;
class graph;

/// One output of a node: most nodes have one; coalesced collectives have one per input.
struct value_ref {
  node* src = nullptr;
  int index = 0;
  friend bool operator==(const value_ref&, const value_ref&) = default;
};

/// A graph node: an op with its attributes, its arguments (outputs of earlier nodes), the metas
/// of its outputs, and its users. Nodes are created and changed only through their graph.
class node {
 public:
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  /// The op name: "placeholder", "output", "all_reduce", "wait_tensor", "matmul", "pointwise", ...
  std::string_view op() const { return name_of(op_); }
  /// The op with its attributes.
  const node_op& kind() const { return op_; }
  /// The SSA name (unique in the graph), printed as %name.
  const std::string& name() const { return name_; }
  /// The arguments, in order, with output indices.
  const std::vector<value_ref>& args() const { return args_; }
  /// The nodes this one reads, in argument order (repeats kept).
  std::vector<node*> inputs() const {
    std::vector<node*> v;
    v.reserve(args_.size());
    for (auto& a : args_) v.push_back(a.src);
    return v;
  }
  /// The distinct nodes that read this one, in the order they were attached.
  const std::vector<node*>& users() const { return users_; }
  /// Number of outputs.
  int num_outputs() const { return static_cast<int>(metas_.size()); }
  /// Meta of output `i`.
  const tensor_meta& meta(int i = 0) const {
    CCGRAPH_CHECK(i >= 0 && i < num_outputs(), "node::meta: node %", name_, " (", op(), ") has ",
                  num_outputs(), " outputs, not ", i + 1);
    return metas_[static_cast<std::size_t>(i)];
  }
  /// All output metas.
  const std::vector<tensor_meta>& metas() const { return metas_; }
  /// Shape of output `i`.
  const shape_t& shape(int i = 0) const { return meta(i).shape; }
  /// Element type of output `i`.
  ccgraph::dtype dtype(int i = 0) const { return meta(i).dtype; }
  /// The group of a collective node.
  const std::optional<group_info>& group() const { return group_; }
  /// The collective this node runs, if it is one.
  std::optional<ops::collective_op> collective() const { return as_collective(op_); }
  /// True for collective nodes.
  bool is_collective() const { return collective().has_value(); }
  /// True for wait_tensor nodes.
  bool is_wait() const { return std::holds_alternative<ops::wait_tensor>(op_); }
  /// True for nodes dead-code elimination must keep: inputs, outputs, collectives and waits.
  bool is_impure() const {
    return is_collective() || is_wait() || std::holds_alternative<ops::placeholder>(op_) ||
           std::holds_alternative<ops::output>(op_);
  }
  /// True for view ops (the output aliases the input).
  bool is_view() const {
    return std::visit([](const auto& o) { return is_view_op_v<std::decay_t<decltype(o)>>; }, op_);
  }
  /// The graph that owns this node.
  const graph* owner() const { return owner_; }

 private:
  friend class graph;
  node(graph* owner, node_op op, std::string name) : op_(std::move(op)), name_(std::move(name)), owner_(owner) {}

  node_op op_;
  std::string name_;
  std::vector<value_ref> args_;
  std::vector<node*> users_;
  std::vector<tensor_meta> metas_;
  std::optional<group_info> group_;
  graph* owner_;
  std::size_t pos_ = 0;  // index in the owner's order, kept by graph::reindex
};

/// A graph of nodes in topological order, starting with placeholders and ending with one output
/// node. Copying a graph copies its nodes (node pointers of the copy are new).
class graph {
 public:
  graph() = default;
  graph(const graph& other) { copy_from(other); }
  graph& operator=(const graph& other) {
    if (this != &other) {
      nodes_.clear();
      order_.clear();
      names_.clear();
      next_suffix_.clear();
      copy_from(other);
    }
    return *this;
  }
  graph(graph&& other) noexcept { *this = std::move(other); }
  graph& operator=(graph&& other) noexcept {
    nodes_ = std::move(other.nodes_);
    order_ = std::move(other.order_);
    names_ = std::move(other.names_);
    next_suffix_ = std::move(other.next_suffix_);
    for (auto& n : nodes_) n->owner_ = this;
    return *this;
  }
  virtual ~graph() = default;

  /// The nodes in topological (execution) order.
  const std::vector<node*>& nodes() const { return order_; }
  /// Number of nodes.
  std::size_t size() const { return order_.size(); }
  /// Number of nodes whose op() is `op`.
  std::size_t count(std::string_view op) const {
    return static_cast<std::size_t>(
        std::count_if(order_.begin(), order_.end(), [&](const node* n) { return n->op() == op; }));
  }
  /// The placeholders, in input order.
  std::vector<node*> placeholders() const {
    std::vector<node*> v;
    for (auto* n : order_)
      if (std::holds_alternative<ops::placeholder>(n->kind())) v.push_back(n);
    std::sort(v.begin(), v.end(), [](const node* a, const node* b) {
      return std::get<ops::placeholder>(a->kind()).index < std::get<ops::placeholder>(b->kind()).index;
    });
    return v;
  }
  /// The output node, or null before one is set.
  node* output_node() const {
    return !order_.empty() && std::holds_alternative<ops::output>(order_.back()->kind()) ? order_.back()
                                                                                       : nullptr;
  }
  /// The node called `name`, or null.
  node* find(std::string_view name) const {
    for (auto* n : order_)
      if (n->name() == name) return n;
    return nullptr;
  }

  /// Appends a node (before the output node, if there is one), inferring and validating its
  /// output metas from its arguments. `hint` seeds its unique name.
  node* add(node_op op, std::vector<value_ref> args, std::optional<group_info> group = {},
            std::string_view hint = {}) {
    const std::size_t pos = output_node() ? order_.size() - 1 : order_.size();
    return insert_at(pos, std::move(op), std::move(args), std::move(group), hint);
  }
  /// Inserts a node right after `pos`.
  node* insert_after(const node* pos, node_op op, std::vector<value_ref> args,
                     std::optional<group_info> group = {}, std::string_view hint = {}) {
    return insert_at(position(pos) + 1, std::move(op), std::move(args), std::move(group), hint);
  }
  /// Appends a graph input of meta `m` (pending: the caller passes an async tensor).
  node* add_placeholder(const tensor_meta& m, bool pending = false, std::string_view hint = {}) {
    const int index = static_cast<int>(placeholders().size());
    node* n = insert_at(0 + count("placeholder"), ops::placeholder{index, pending}, {}, {}, hint.empty() ? "arg" : hint);
    n->metas_ = {m};
    return n;
  }
  /// Sets the graph's results (replacing an earlier output node).
  node* set_output(std::vector<value_ref> results) {
    if (node* old = output_node()) {
      set_args(old, std::move(results));
      return old;
    }
    return insert_at(order_.size(), ops::output{}, std::move(results), {}, "output");
  }

  /// The one mutator of arguments: replaces `n`'s arguments and keeps every users list right.
  void set_args(node* n, std::vector<value_ref> args) {
    check_owned(n, "set_args");
    for (auto& a : args) check_owned(a.src, "set_args");
    for (auto& a : n->args_) detach_user(a.src, n);
    n->args_ = std::move(args);
    attach_to_sources(n);
  }
  /// Makes every reader of `from` read `to` instead (same meta required).
  void replace_all_uses(value_ref from, value_ref to) {
    CCGRAPH_CHECK(from.src->meta(from.index) == to.src->meta(to.index), "replace_all_uses: %",
                  from.src->name(), " is ", from.src->meta(from.index).str(), " but %",
                  to.src->name(), " is ", to.src->meta(to.index).str());
    const std::vector<node*> users = from.src->users_;
    for (node* u : users) {
      if (u == to.src) continue;
      auto args = u->args_;
      for (auto& a : args)
        if (a == from) a = to;
      set_args(u, std::move(args));
    }
  }
  /// Removes `n`; refuses while another node still reads it.
  void erase(node* n) {
    check_owned(n, "erase");
    CCGRAPH_CHECK(n->users_.empty(), "erase: node %", n->name(), " (", n->op(), ") still has ",
                  n->users_.size(), " user(s), first %", n->users_.front()->name());
    set_args(n, {});
    const std::size_t pos = position(n);
    order_.erase(order_.begin() + static_cast<std::ptrdiff_t>(pos));
    names_.erase(n->name());
    auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](auto& p) { return p.get() == n; });
    nodes_.erase(it);
    reindex(pos);
  }
  /// Removes every node of `ns` at once: O(V + E), where erasing them one by one costs O(V)
  /// each. Refuses, changing nothing, while a node not in `ns` still reads one of them.
  void erase(const std::vector<node*>& ns) {
    if (ns.empty()) return;
    std::vector<char> gone(order_.size(), 0);  // by position
    for (node* n : ns) {
      check_owned(n, "erase");
      gone[n->pos_] = 1;
    }
    for (node* n : ns)
      for (node* u : n->users_)
        CCGRAPH_CHECK(gone[u->pos_], "erase: node %", n->name(), " (", n->op(), ") is still read by %", u->name());
    // Each source that loses readers filters its users list once.
    std::vector<node*> sources;
    for (node* n : ns)
      for (auto& a : n->args_)
        if (!gone[a.src->pos_]) sources.push_back(a.src);
    std::sort(sources.begin(), sources.end());
    sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
    auto is_gone = [&](const node* u) { return gone[u->pos_] != 0; };
    for (node* s : sources) s->users_.erase(std::remove_if(s->users_.begin(), s->users_.end(), is_gone), s->users_.end());
    for (node* n : ns) names_.erase(n->name_);
    order_.erase(std::remove_if(order_.begin(), order_.end(), is_gone), order_.end());
    // (a kept node is tested before it moves; an erased one is freed when overwritten)
    nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(), [&](const auto& p) { return is_gone(p.get()); }),
                 nodes_.end());
    reindex(0);
  }
  /// Puts the nodes in `order`, which must hold each node once and respect every dependency
  /// (what schedulers call).
  void reorder(const std::vector<node*>& order) {
    CCGRAPH_CHECK(order.size() == order_.size(), "reorder: ", order.size(), " nodes for a graph of ",
                  order_.size());
    std::vector<char> listed(order.size(), 0);  // by current position
    for (node* n : order) {
      check_owned(n, "reorder");
      CCGRAPH_CHECK(!listed[n->pos_], "reorder: node %", n->name(), " listed twice");
      listed[n->pos_] = 1;
    }
    // A permutation: give every node its new position, check the dependencies with them, and
    // put the old positions back if one is broken (the graph is left as it was).
    for (std::size_t i = 0; i < order.size(); ++i) order[i]->pos_ = i;
    for (std::size_t i = 0; i < order.size(); ++i)
      for (auto& a : order[i]->args_)
        if (a.src->pos_ >= i) {
          reindex(0);
          CCGRAPH_THROW(::ccgraph::error, "reorder: node %", order[i]->name(),
                        " would run before its input %", a.src->name());
        }
    order_ = order;
  }
  /// Checks the graph's invariants (see cg::lint in ccgraph/ir/analysis.hpp, which defines
  /// this member); throws ccgraph::error carrying the printed graph.
  void lint() const;

  /// Position of `n` in the order (constant time: each node keeps its own).
  std::size_t position(const node* n) const {
    check_owned(n, "position");
    return n->pos_;
  }

 private:
  node* insert_at(std::size_t pos, node_op op, std::vector<value_ref> args,
                  std::optional<group_info> group, std::string_view hint) {
    std::vector<tensor_meta> in;
    in.reserve(args.size());
    for (auto& a : args) {
      check_owned(a.src, "add");
      in.push_back(a.src->meta(a.index));
    }
    const bool is_output = std::holds_alternative<ops::output>(op);
    const bool is_placeholder = std::holds_alternative<ops::placeholder>(op);
    std::vector<tensor_meta> metas;
    if (!is_output && !is_placeholder) metas = infer(op, in, group);
    auto owned = std::unique_ptr<node>(new node(this, std::move(op), unique_name(hint)));
    node* n = owned.get();
    nodes_.push_back(std::move(owned));
    n->metas_ = std::move(metas);
    n->group_ = std::move(group);
    order_.insert(order_.begin() + static_cast<std::ptrdiff_t>(pos), n);
    reindex(pos);
    set_args(n, std::move(args));
    return n;
  }

  /// `hint`, or `hint_k` with the smallest free k at or after the last one given out for this
  /// hint: constant time per name, so tracing stays linear in the number of nodes.
  std::string unique_name(std::string_view hint) {
    std::string base(hint.empty() ? "v" : hint);
    std::string name = base;
    if (names_.count(name)) {
      int& k = next_suffix_[base];
      do name = base + "_" + std::to_string(++k);
      while (names_.count(name));
    }
    names_.insert(name);
    return name;
  }

  void reindex(std::size_t from) {
    for (std::size_t i = from; i < order_.size(); ++i) order_[i]->pos_ = i;
  }

  void check_owned(const node* n, const char* what) const {
    CCGRAPH_CHECK(n != nullptr && n->owner_ == this, "graph::", what,
                  ": node is not owned by this graph", n ? " (%" + n->name() + ")" : std::string());
  }

  /// Lists `n` once with each distinct source of its arguments. `n` is in no users list when
  /// called (set_args detached it), so only repeats among its own arguments are skipped: a scan
  /// for a few arguments, a set for many (a coalesced collective of thousands of inputs).
  static void attach_to_sources(node* n) {
    const auto& args = n->args_;
    if (args.size() <= 16) {
      for (std::size_t i = 0; i < args.size(); ++i) {
        bool repeat = false;
        for (std::size_t j = 0; j < i && !repeat; ++j) repeat = args[j].src == args[i].src;
        if (!repeat) args[i].src->users_.push_back(n);
      }
      return;
    }
    std::unordered_set<const node*> seen;
    seen.reserve(args.size());
    for (auto& a : args)
      if (seen.insert(a.src).second) a.src->users_.push_back(n);
  }
  static void detach_user(node* src, node* user) {
    auto& u = src->users_;
    u.erase(std::remove(u.begin(), u.end(), user), u.end());
  }

  void copy_from(const graph& other) {
    std::unordered_map<const node*, node*> map;
    for (const node* o : other.order_) {
      auto owned = std::unique_ptr<node>(new node(this, o->op_, o->name_));
      node* n = owned.get();
      nodes_.push_back(std::move(owned));
      n->metas_ = o->metas_;
      n->group_ = o->group_;
      for (auto a : o->args_) {
        a.src = map.at(a.src);
        n->args_.push_back(a);
      }
      map[o] = n;
      order_.push_back(n);
      names_.insert(n->name_);
    }
    next_suffix_ = other.next_suffix_;
    for (const node* o : other.order_)
      for (const node* u : o->users_) map.at(o)->users_.push_back(map.at(u));
    reindex(0);
  }

  std::vector<std::unique_ptr<node>> nodes_;
  std::vector<node*> order_;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, int> next_suffix_;  // last suffix given out per name hint
};

}  // namespace ccgraph
