// ccgraph/ir/impl/graph.ipp: the members of node and graph (ir/graph.hpp). Included by that header
// when header-only, compiled once by <ccgraph/impl/src.hpp> under CCGRAPH_SEPARATE_COMPILATION:
// they copy and destroy node_op, a variant over every op, whose special members are costly to
// instantiate in every unit.
#pragma once

#include <ccgraph/ir/graph.hpp>

namespace ccgraph {

CCGRAPH_DECL node::node(graph* owner, node_op&& op, std::string name)
    : op_(std::move(op)), name_(std::move(name)), owner_(owner) {}

CCGRAPH_DECL node::~node() = default;

CCGRAPH_DECL graph::graph(const graph& other) { copy_from(other); }

CCGRAPH_DECL graph& graph::operator=(const graph& other) {
  if (this != &other) {
    nodes_.clear();
    order_.clear();
    names_.clear();
    next_suffix_.clear();
    copy_from(other);
  }
  return *this;
}

CCGRAPH_DECL graph::graph(graph&& other) noexcept { *this = std::move(other); }

CCGRAPH_DECL graph& graph::operator=(graph&& other) noexcept {
  nodes_ = std::move(other.nodes_);
  order_ = std::move(other.order_);
  names_ = std::move(other.names_);
  next_suffix_ = std::move(other.next_suffix_);
  for (auto& n : nodes_) n->owner_ = this;
  return *this;
}

CCGRAPH_DECL graph::~graph() = default;

CCGRAPH_DECL std::size_t graph::count(std::string_view op) const {
  return static_cast<std::size_t>(
      std::count_if(order_.begin(), order_.end(), [&](const node* n) { return n->op() == op; }));
}

CCGRAPH_DECL std::vector<node*> graph::placeholders() const {
  std::vector<node*> v;
  for (auto* n : order_)
    if (std::holds_alternative<ops::placeholder>(n->kind())) v.push_back(n);
  std::sort(v.begin(), v.end(), [](const node* a, const node* b) {
    return std::get<ops::placeholder>(a->kind()).index < std::get<ops::placeholder>(b->kind()).index;
  });
  return v;
}

CCGRAPH_DECL node* graph::output_node() const {
  return !order_.empty() && std::holds_alternative<ops::output>(order_.back()->kind()) ? order_.back() : nullptr;
}

CCGRAPH_DECL node* graph::find(std::string_view name) const {
  for (auto* n : order_)
    if (n->name() == name) return n;
  return nullptr;
}

CCGRAPH_DECL node* graph::add(node_op&& op, std::vector<value_ref> args, std::optional<group_info> group,
                              std::string_view hint) {
  const std::size_t pos = output_node() ? order_.size() - 1 : order_.size();
  return insert_at(pos, std::move(op), std::move(args), std::move(group), hint);
}

CCGRAPH_DECL node* graph::add(const node_op& op, std::vector<value_ref> args, std::optional<group_info> group,
                              std::string_view hint) {
  return add(node_op(op), std::move(args), std::move(group), hint);
}

CCGRAPH_DECL node* graph::insert_after(const node* pos, node_op&& op, std::vector<value_ref> args,
                                       std::optional<group_info> group, std::string_view hint) {
  return insert_at(position(pos) + 1, std::move(op), std::move(args), std::move(group), hint);
}

CCGRAPH_DECL node* graph::insert_after(const node* pos, const node_op& op, std::vector<value_ref> args,
                                       std::optional<group_info> group, std::string_view hint) {
  return insert_after(pos, node_op(op), std::move(args), std::move(group), hint);
}

CCGRAPH_DECL node* graph::add_placeholder(const tensor_meta& m, bool pending, std::string_view hint) {
  const int index = static_cast<int>(placeholders().size());
  node* n = insert_at(0 + count("placeholder"), ops::placeholder{index, pending}, {}, {}, hint.empty() ? "arg" : hint);
  n->metas_ = {m};
  return n;
}

CCGRAPH_DECL node* graph::set_output(std::vector<value_ref> results) {
  if (node* old = output_node()) {
    set_args(old, std::move(results));
    return old;
  }
  return insert_at(order_.size(), ops::output{}, std::move(results), {}, "output");
}

CCGRAPH_DECL void graph::set_args(node* n, std::vector<value_ref> args) {
  check_owned(n, "set_args");
  for (auto& a : args) check_owned(a.src, "set_args");
  for (auto& a : n->args_) detach_user(a.src, n);
  n->args_ = std::move(args);
  attach_to_sources(n);
}

CCGRAPH_DECL void graph::replace_all_uses(value_ref from, value_ref to) {
  CCGRAPH_CHECK(from.src->meta(from.index) == to.src->meta(to.index), "replace_all_uses: %", from.src->name(), " is ",
                from.src->meta(from.index).str(), " but %", to.src->name(), " is ", to.src->meta(to.index).str());
  const std::vector<node*> users = from.src->users_;
  for (node* u : users) {
    if (u == to.src) continue;
    auto args = u->args_;
    for (auto& a : args)
      if (a == from) a = to;
    set_args(u, std::move(args));
  }
}

CCGRAPH_DECL void graph::erase(node* n) {
  check_owned(n, "erase");
  CCGRAPH_CHECK(n->users_.empty(), "erase: node %", n->name(), " (", n->op(), ") still has ", n->users_.size(),
                " user(s), first %", n->users_.front()->name());
  set_args(n, {});
  const std::size_t pos = position(n);
  order_.erase(order_.begin() + static_cast<std::ptrdiff_t>(pos));
  names_.erase(n->name());
  auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](auto& p) { return p.get() == n; });
  nodes_.erase(it);
  reindex(pos);
}

CCGRAPH_DECL void graph::erase(const std::vector<node*>& ns) {
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

CCGRAPH_DECL void graph::reorder(const std::vector<node*>& order) {
  CCGRAPH_CHECK(order.size() == order_.size(), "reorder: ", order.size(), " nodes for a graph of ", order_.size());
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
        CCGRAPH_THROW(::ccgraph::error, "reorder: node %", order[i]->name(), " would run before its input %",
                      a.src->name());
      }
  order_ = order;
}

CCGRAPH_DECL node* graph::insert_at(std::size_t pos, node_op&& op, std::vector<value_ref> args,
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

CCGRAPH_DECL std::string graph::unique_name(std::string_view hint) {
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

CCGRAPH_DECL void graph::not_owned(const node* n, const char* what) const {
  CCGRAPH_THROW(::ccgraph::error, "graph::", what, ": node is not owned by this graph",
                n ? " (%" + n->name() + ")" : std::string());
}

CCGRAPH_DECL void graph::attach_to_sources(node* n) {
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

CCGRAPH_DECL void graph::detach_user(node* src, node* user) {
  auto& u = src->users_;
  u.erase(std::remove(u.begin(), u.end(), user), u.end());
}

CCGRAPH_DECL void graph::copy_from(const graph& other) {
  std::unordered_map<const node*, node*> map;
  for (const node* o : other.order_) {
    auto owned = std::unique_ptr<node>(new node(this, node_op(o->op_), o->name_));
    node* n = owned.get();
    nodes_.push_back(std::move(owned));
    n->metas_ = o->metas_;
    n->group_ = o->group_;
    n->source_ = o->source_;
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

CCGRAPH_DECL node* detail::add_wait(graph& g, value_ref v) { return g.add(ops::wait_tensor{}, {v}, {}, "wait_tensor"); }

}  // namespace ccgraph
