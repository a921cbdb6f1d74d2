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

#include <ccgraph/core/config.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/source_location.hpp>
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
  CCGRAPH_DECL ~node();

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
  bool is_collective() const { return category_of(op_) == op_category::collective; }
  /// The op's category (op_traits<O>::category).
  op_category category() const { return category_of(op_); }
  /// True for wait_tensor nodes.
  bool is_wait() const { return category() == op_category::wait; }
  /// True for nodes dead-code elimination must keep: inputs, outputs, collectives and waits.
  bool is_impure() const {
    const op_category c = category();
    return c == op_category::collective || c == op_category::wait || c == op_category::input ||
           c == op_category::output;
  }
  /// True for view ops: the output aliases the input (reshape and contiguous: unless the
  /// input's layout forces a copy).
  bool is_view() const { return category() == op_category::view; }
  /// The graph that owns this node.
  const graph* owner() const { return owner_; }
  /// Where the user called the collective this node records (file and line), when it was
  /// traced from a public collective call; an unknown location (line 0) otherwise.
  const std::source_location& source() const { return source_; }

 private:
  friend class graph;
  CCGRAPH_DECL node(graph* owner, node_op&& op, std::string name);

  node_op op_;
  std::string name_;
  std::vector<value_ref> args_;
  std::vector<node*> users_;
  std::vector<tensor_meta> metas_;
  std::optional<group_info> group_;
  std::source_location source_{};
  graph* owner_;
  std::size_t pos_ = 0;  // index in the owner's order, kept by graph::reindex
};

/// A graph of nodes in topological order, starting with placeholders and ending with one output
/// node. Copying a graph copies its nodes (node pointers of the copy are new).
class graph {
 public:
  graph() = default;
  CCGRAPH_DECL graph(const graph& other);
  CCGRAPH_DECL graph& operator=(const graph& other);
  CCGRAPH_DECL graph(graph&& other) noexcept;
  CCGRAPH_DECL graph& operator=(graph&& other) noexcept;
  CCGRAPH_DECL virtual ~graph();

  /// The nodes in topological (execution) order.
  const std::vector<node*>& nodes() const { return order_; }
  /// Number of nodes.
  std::size_t size() const { return order_.size(); }
  /// Number of nodes whose op() is `op`.
  CCGRAPH_DECL std::size_t count(std::string_view op) const;
  /// The placeholders, in input order.
  CCGRAPH_DECL std::vector<node*> placeholders() const;
  /// The output node, or null before one is set.
  CCGRAPH_DECL node* output_node() const;
  /// The node called `name`, or null.
  CCGRAPH_DECL node* find(std::string_view name) const;

  /// Appends a node (before the output node, if there is one), inferring and validating its
  /// output metas from its arguments. `hint` seeds its unique name. (The op is taken by
  /// reference: copying or moving node_op, a variant over every op, is costly to compile, so
  /// only the library's compiled part does it.)
  CCGRAPH_DECL node* add(node_op&& op, std::vector<value_ref> args, std::optional<group_info> group = {},
                         std::string_view hint = {});
  /// add with a copy of `op`.
  CCGRAPH_DECL node* add(const node_op& op, std::vector<value_ref> args, std::optional<group_info> group = {},
                         std::string_view hint = {});
  /// Inserts a node right after `pos`.
  CCGRAPH_DECL node* insert_after(const node* pos, node_op&& op, std::vector<value_ref> args,
                                  std::optional<group_info> group = {}, std::string_view hint = {});
  /// insert_after with a copy of `op`.
  CCGRAPH_DECL node* insert_after(const node* pos, const node_op& op, std::vector<value_ref> args,
                                  std::optional<group_info> group = {}, std::string_view hint = {});
  /// Appends a graph input of meta `m` (pending: the caller passes an async tensor).
  CCGRAPH_DECL node* add_placeholder(const tensor_meta& m, bool pending = false, std::string_view hint = {});
  /// Sets the graph's results (replacing an earlier output node).
  CCGRAPH_DECL node* set_output(std::vector<value_ref> results);

  /// Sets where the user called `n`'s collective (node::source); passes that replace
  /// collectives pass their originals' on.
  void set_source(node* n, const std::source_location& loc) { n->source_ = loc; }

  /// The one mutator of arguments: replaces `n`'s arguments and keeps every users list right.
  CCGRAPH_DECL void set_args(node* n, std::vector<value_ref> args);
  /// Makes every reader of `from` read `to` instead (same meta required).
  CCGRAPH_DECL void replace_all_uses(value_ref from, value_ref to);
  /// Removes `n`; refuses while another node still reads it.
  CCGRAPH_DECL void erase(node* n);
  /// Removes every node of `ns` at once: O(V + E), where erasing them one by one costs O(V)
  /// each. Refuses, changing nothing, while a node not in `ns` still reads one of them.
  CCGRAPH_DECL void erase(const std::vector<node*>& ns);
  /// Puts the nodes in `order`, which must hold each node once and respect every dependency
  /// (what schedulers call).
  CCGRAPH_DECL void reorder(const std::vector<node*>& order);
  /// Checks the graph's invariants (see cg::lint in ccgraph/ir/analysis.hpp, which defines
  /// this member); throws ccgraph::error carrying the printed graph.
  CCGRAPH_DECL void lint() const;

  /// Position of `n` in the order (constant time: each node keeps its own).
  std::size_t position(const node* n) const {
    check_owned(n, "position");
    return n->pos_;
  }

 private:
  CCGRAPH_DECL node* insert_at(std::size_t pos, node_op&& op, std::vector<value_ref> args,
                               std::optional<group_info> group, std::string_view hint);
  /// `hint`, or `hint_k` with the smallest free k at or after the last one given out for this
  /// hint: constant time per name, so tracing stays linear in the number of nodes.
  CCGRAPH_DECL std::string unique_name(std::string_view hint);
  void reindex(std::size_t from) {
    for (std::size_t i = from; i < order_.size(); ++i) order_[i]->pos_ = i;
  }
  void check_owned(const node* n, const char* what) const {
    if (n == nullptr || n->owner_ != this) not_owned(n, what);
  }
  [[noreturn]] CCGRAPH_DECL void not_owned(const node* n, const char* what) const;
  /// Lists `n` once with each distinct source of its arguments. `n` is in no users list when
  /// called (set_args detached it), so only repeats among its own arguments are skipped: a scan
  /// for a few arguments, a set for many (a coalesced collective of thousands of inputs).
  CCGRAPH_DECL static void attach_to_sources(node* n);
  CCGRAPH_DECL static void detach_user(node* src, node* user);
  CCGRAPH_DECL void copy_from(const graph& other);

  std::vector<std::unique_ptr<node>> nodes_;
  std::vector<node*> order_;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, int> next_suffix_;  // last suffix given out per name hint
};

namespace detail {
/// Adds a wait_tensor node reading `v` (kept out of templates: building a node_op instantiates
/// the variant's special members).
CCGRAPH_DECL node* add_wait(graph& g, value_ref v);
}  // namespace detail

}  // namespace ccgraph

#if CCGRAPH_HEADER_ONLY
#include <ccgraph/ir/impl/graph.ipp>
#endif
