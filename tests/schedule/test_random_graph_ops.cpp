// tests/schedule/test_random_graph_ops.cpp: random programs over the transformer-block graph ops
// (reductions along dims with keepdim, softmax / log_softmax, layer_norm / rms_norm, cat / stack /
// split, bmm / linear, comparisons and where, embedding / index_select / gather, max along a dim,
// cross_entropy), interleaved with matmuls, views and collectives on 2-4 thread ranks, traced and
// run through every schedule pass (each alone, and all in order) and cg::compile_function: each
// gives the eager bits. The same programs' training steps (value_and_grad of a loss over their
// outputs, one joint forward+backward graph) scheduled by every pass give the unscheduled joint
// graph's bits. The generator follows test_trace.cpp's interpreter (one code path for
// tensors and symbolic values, bounds that keep values finite); a failing case names its seed,
// world and passes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ccgraph/ccgraph.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace random_graph_ops_test {

using i64 = std::int64_t;
constexpr i64 n = 12;  // every value is [12, 12]: 12 divides by every group size used (2, 3, 4)

/// One step of a program: its kind and the random words it reads.
struct step {
  int kind;
  std::uint32_t r[6];
};
constexpr int n_kinds = 14;

std::vector<step> make_program(std::uint64_t seed, int length) {
  std::mt19937_64 rng(seed);
  std::vector<step> p(static_cast<std::size_t>(length));
  for (auto& s : p) {
    s.kind = static_cast<int>(rng() % n_kinds);
    for (auto& r : s.r) r = static_cast<std::uint32_t>(rng());
  }
  return p;
}

/// Interprets a random program over float values V (tensors eagerly, symbolic values traced).
/// `bound` tracks an upper bound of each value's magnitude; a value past `limit` is divided
/// down (a pointwise node like any other), so every value stays finite.
template <class V>
struct interpreter {
  static constexpr double limit = 64;
  int rank, world;
  std::vector<V> pool;
  std::vector<double> bound;
  /// Only differentiable choices (the joint-graph property): no max/min all_reduce, no fused
  /// gelu in linear, embedding for index_select (their gradient rules are not written yet).
  bool differentiable = false;

  V fit(const V& x, double& b, double max) {
    if (b <= max) return x;
    const double d = std::ceil(b / max);
    b = b / d;
    return cg::eval(x / static_cast<float>(d));
  }
  void push(V v, double b) {
    v = fit(v, b, limit);
    pool.push_back(v);
    bound.push_back(b);
  }
  std::size_t pick(std::uint32_t r) const {
    const std::size_t recent = std::min<std::size_t>(pool.size(), 5);
    return pool.size() - 1 - r % recent;
  }
  /// The world, or (in even worlds) MPMD pairs; fills this rank's members.
  cg::group group_of(std::uint32_t r, std::vector<int>& members) const {
    if (world % 2 == 0 && r % 3 != 0) {
      std::vector<std::vector<int>> lists;
      for (int i = 0; i < world / 2; ++i)
        lists.push_back(r % 3 == 1 ? std::vector<int>{2 * i, 2 * i + 1} : std::vector<int>{i, i + world / 2});
      for (auto& l : lists)
        if (std::find(l.begin(), l.end(), rank) != l.end()) members = l;
      return lists;
    }
    members.clear();
    for (int i = 0; i < world; ++i) members.push_back(i);
    return cg::group("0");
  }

  void run(const step& s) {
    const auto& r = s.r;
    const std::size_t ia = pick(r[0]), ib = pick(r[1]);
    std::vector<int> members;
    const cg::group g = group_of(r[2], members);
    const int m = static_cast<int>(members.size());
    const V x = pool[ia], y = pool[ib];
    const double bx = bound[ia], by = bound[ib];
    const i64 dim = r[3] % 2;
    const bool keep = (r[4] % 2) != 0;
    switch (s.kind) {
      case 0: {  // a reduction along a dim, kept and broadcast back
        switch (r[5] % 6) {
          case 0: return push(cg::eval(x - cg::mean(x, dim, true)), 2 * bx);
          case 1: return push(cg::eval(cg::sum(x, dim, true) * 0.125f + y), n * bx / 8 + by);
          case 2: return push(cg::eval(x / (cg::amax(cg::eval(cg::abs(x)), std::vector<i64>{dim}, true) + 1.f)), 1);
          case 3: return push(cg::eval(cg::amin(x, dim, true) - y), bx + by);
          case 4: return push(cg::eval(cg::var(x, dim, 1.0, true) + y), 4 * bx * bx + by);
          default: {  // keepdim false: unsqueezed back
            auto v = cg::sum(x, std::vector<i64>{dim}, keep);
            return push(cg::eval((keep ? v : v.unsqueeze(static_cast<int>(dim))) + y), n * bx + by);
          }
        }
      }
      case 1:  // softmax / log_softmax along a dim
        if (keep) return push(cg::softmax(x, dim), 1);
        return push(cg::log_softmax(x, -1 - dim), 2 * bx + 3);
      case 2: {  // norms over the last dim, the affine weights rows of y
        const V w = y.select(0, static_cast<i64>(r[5] % n)), b = y.select(1, static_cast<i64>(r[4] % n));
        switch (r[3] % 4) {
          case 0: return push(cg::layer_norm(x, w, b, 1e-5), 4 * by + by);
          case 1: return push(cg::layer_norm(x, std::vector<i64>{n}), 4);
          case 2: return push(cg::rms_norm(x, w, 1e-6), 4 * by);
          default: return push(cg::rms_norm(x, std::vector<i64>{n}), 4);
        }
      }
      case 3: {  // split and cat back in another order; stack and a reduction over it
        if (keep) {
          const i64 k = 1 + r[5] % 5;
          auto parts = cg::split(x, std::vector<i64>{k, n - k}, dim);
          return push(cg::cat({parts[1], parts[0]}, dim), bx);
        }
        auto parts = cg::split(x, 4, dim);  // three views
        auto st = cg::stack({parts[2], parts[0], parts[1]}, 0);  // [3, 4, 12] or [3, 12, 4]
        return push(cg::cat({st.select(0, 1), st.select(0, 0), st.select(0, 2)}, dim), bx);
      }
      case 4: {  // bmm over a stack; linear with a bias and an activation
        double b1 = bx, b2 = by;
        const V p = fit(x, b1, 8), q = fit(y, b2, 8);
        if (keep) {
          auto z = cg::bmm(cg::stack({p, q}, 0), cg::stack({q, p.transpose(0, 1)}, 0));  // [2, 12, 12]
          return push(cg::sum(z, std::vector<i64>{0}), 2 * n * b1 * b2);
        }
        const auto act = r[5] % 2 && !differentiable ? cg::linear_activation::gelu_tanh : cg::linear_activation::none;
        if (r[4] % 3 == 0) return push(cg::linear(p, q, std::nullopt, act), n * b1 * b2);
        return push(cg::linear(p, q, q.select(0, static_cast<i64>(r[5] % n)), act), n * b1 * b2 + b2);
      }
      case 5: {  // comparisons and where
        switch (r[5] % 3) {
          case 0: return push(cg::eval(cg::where(x > y, x, y * 0.5f)), std::max(bx, by));
          case 1: return push(cg::eval(cg::where(x <= 0.f, cg::clamp(y, -1.f, 1.f), x)), std::max(bx, 1.0));
          default: return push(cg::eval(cg::where(cg::ne(x, y), x - y, 1.f)), bx + by + 1);
        }
      }
      case 6: {  // embedding and index_select by argmax / argmin indices
        const V table = y;
        switch (differentiable && r[5] % 3 == 1 ? 0 : r[5] % 3) {
          case 0: return push(cg::embedding(cg::argmax(x, std::optional<i64>(1)), table), by);
          case 1: return push(cg::index_select(table, dim, cg::argmin(x, std::optional<i64>(dim))), by);
          default: {
            auto idx = cg::argmax(x, std::optional<i64>(1)).reshape({3, 4});
            return push(cg::embedding(idx, table).reshape({n, n}), by);
          }
        }
      }
      case 7: {  // max along a dim (values, indices) and gather at the indices
        auto [vals, idx] = cg::max(x, dim, true);
        auto picked = cg::gather(y, dim, idx);  // [12, 1] or [1, 12]
        return push(cg::eval(vals - picked + x), 2 * bx + by);
      }
      case 8: {  // cross_entropy per row, against argmax targets, broadcast back
        const auto red = keep ? cg::loss_reduction::none : cg::loss_reduction::mean;
        auto t = cg::argmax(y, std::optional<i64>(1));
        auto ce = cg::cross_entropy(x, t, std::nullopt, -100, red);
        if (keep) return push(cg::eval(ce.unsqueeze(1) + y), 2 * bx + std::log(double(n)) + by);
        return push(cg::eval(x * 0.5f + ce), bx / 2 + 2 * bx + std::log(double(n)));
      }
      case 9: {  // matmul, or a transposed copy (the older compute ops)
        if (keep) return push(x.transpose(0, 1).contiguous(), bx);
        double b1 = bx, b2 = by;
        const V p = fit(x, b1, 8), q = fit(y, b2, 8);
        return push(cg::matmul(p, q), n * b1 * b2);
      }
      case 10: {  // all_reduce
        const char* ops[] = {"sum", "avg", "max", "min"};
        const std::uint32_t k = r[5] % (differentiable ? 2 : 4);
        return push(cg::all_reduce(x, ops[k], g), k == 0 ? bx * m : bx);
      }
      case 11:  // all_gather along a dim, narrowed back
        return push(cg::all_gather_tensor(x, dim, g).narrow(dim, n * static_cast<i64>(r[5] % m), n), bx);
      case 12: {  // reduce_scatter along a dim, repeated back
        auto out = cg::reduce_scatter_tensor(x, "sum", dim, g);
        return push(dim == 0 ? out.repeat({m, 1}) : out.repeat({1, m}), bx * m);
      }
      default:  // all_to_all_single
        return push(cg::all_to_all_single(x, std::nullopt, std::nullopt, g), bx);
    }
  }

  std::vector<V> operator()(const std::vector<step>& program, const V& x0, const V& x1, std::uint32_t pick_out) {
    pool = {x0, x1};
    bound = {1, 1};
    for (const auto& s : program) run(s);
    std::vector<V> out(pool.end() - 3, pool.end());
    out.push_back(pool[pick_out % pool.size()]);
    return out;
  }
};


/// Every pass alone, and all of them in cg::schedule's order.
std::vector<std::vector<std::string>> pass_lists() {
  std::vector<std::vector<std::string>> lists;
  std::vector<std::string> all;
  for (auto p : cg::schedule_pass_names()) {
    lists.push_back({std::string(p)});
    all.emplace_back(p);
  }
  lists.push_back(all);
  return lists;
}

std::mutex seen_mutex;
std::set<std::string>& ops_seen() {
  static std::set<std::string> s;
  return s;
}
/// The passes that changed some program's graph (its op sequence), over all of them: each pass
/// must have had something to do, or the property would hold trivially for it.
std::set<std::string>& passes_that_changed() {
  static std::set<std::string> s;
  return s;
}

/// `g` scheduled by each pass list (linted) and compiled on `ctx`, run on (x0, x1): each must
/// give `expected`, else `fail(how)`; a pass alone that changed the op sequence goes into
/// `changed`. Then compile_function of `fn` with every pass, called twice.
template <class G, class Fn, class Fail>
void check_every_pass(const G& g, Fn& fn, cg::rank_context& ctx, const cg::tensor<float>& x0,
                      const cg::tensor<float>& x1, const std::string& expected, std::set<std::string>& changed,
                      Fail& fail) {
  for (const auto& passes : pass_lists()) {
    std::string how = "scheduled by";
    for (const auto& p : passes) how += " " + p;
    const auto s = cg::schedule(g, passes);
    cg::lint(s);
    if (passes.size() == 1 && cg::op_sequence(s) != cg::op_sequence(g)) {
      std::lock_guard lk(seen_mutex);
      changed.insert(passes[0]);
    }
    if (bits_of(cg::compile(s, ctx)(x0, x1)) != expected) fail(how);
  }
  auto f = cg::compile_function<float, float>(fn, ctx, {.passes = pass_lists().back()});
  for (int call = 0; call < 2; ++call)
    if (bits_of(f(x0, x1)) != expected) fail("compile_function with every pass, call " + std::to_string(call));
}

/// One program on `world` ranks: eager, then traced and run through check_every_pass; each must
/// give the eager bits.
void property(int world, std::uint64_t seed, int length) {
  const auto program = make_program(seed, length);
  const auto pick_out = static_cast<std::uint32_t>(seed * 7 + 3);
  std::mutex m;
  std::vector<std::string> failures;
  run(world, [&](cg::rank_context& ctx) {
    auto fn = [&](auto x0, auto x1) {
      using V = decltype(x0);
      return interpreter<V>{ctx.rank(), ctx.world_size(), {}, {}}(program, x0, x1, pick_out);
    };
    const auto x0 = cg::uniform<float>({n, n}, -1, 1, seed * 10 + static_cast<std::uint64_t>(ctx.rank()));
    const auto x1 = cg::uniform<float>({n, n}, -1, 1, seed * 10 + 5 + static_cast<std::uint64_t>(ctx.rank()));
    const auto expected = bits_of(fn(x0, x1));
    auto g = cg::trace(fn, cg::input<float>({n, n}), cg::input<float>({n, n}));
    cg::lint(g);
    {
      std::lock_guard lk(seen_mutex);
      for (const cg::node* nd : g.nodes()) ops_seen().insert(std::string(nd->op()));
    }
    auto fail = [&](const std::string& how) {
      std::ostringstream os;
      os << "random graph-ops program seed=" << seed << " world=" << world << " length=" << length << " rank "
         << ctx.rank() << ": " << how << " differs from eager (rerun: property(" << world << ", " << seed << ", "
         << length << "))";
      std::lock_guard lk(m);
      failures.push_back(os.str());
    };
    check_every_pass(g, fn, ctx, x0, x1, expected, passes_that_changed(), fail);
  });
  for (const auto& f : failures) FAIL_CHECK(f);
}

/// The passes that changed some joint graph's op sequence.
std::set<std::string>& passes_that_changed_joint() {
  static std::set<std::string> s;
  return s;
}
/// Rank graphs whose default trace (recompute_pointwise) differs from the recorded one.
int& joint_default_changed() {
  static int k = 0;
  return k;
}

/// One program's training step on `world` ranks (issue 15 item 4): the joint forward+backward
/// graph of a scalar loss over the program's outputs, with the gradients of both inputs, traced
/// once as recorded (no recompute_pointwise when the trace ends); scheduled by each pass list
/// and compiled, traced with the default (recompute_pointwise) and compiled, and
/// compile_function'ed (the default) with every pass, it must give the recorded graph's bits.
void joint_property(int world, std::uint64_t seed, int length) {
  const auto program = make_program(seed, length);
  const auto pick_out = static_cast<std::uint32_t>(seed * 7 + 3);
  std::mutex m;
  std::vector<std::string> failures;
  run(world, [&](cg::rank_context& ctx) {
    auto loss = [&](auto x0, auto x1) {
      using V = decltype(x0);
      interpreter<V> in{ctx.rank(), ctx.world_size(), {}, {}};
      in.differentiable = true;
      const std::vector<V> out = in(program, x0, x1, pick_out);
      V l = cg::sum(out[0]);
      for (std::size_t i = 1; i < out.size(); ++i) l = cg::eval(l + cg::sum(out[i]) * (0.5f / static_cast<float>(i)));
      return l;
    };
    auto step_with = [&](cg::grad_options o) {
      return [&, o](auto x0, auto x1) {
        using V = decltype(x0);
        auto [l, g0, g1] = cg::value_and_grad(loss, {0, 1}, o)(x0, x1);
        return std::vector<V>{l, g0, g1};
      };
    };
    auto step = step_with({});
    const auto recorded = step_with({.recompute_pointwise = false});
    const auto x0 = cg::uniform<float>({n, n}, -1, 1, seed * 10 + static_cast<std::uint64_t>(ctx.rank()));
    const auto x1 = cg::uniform<float>({n, n}, -1, 1, seed * 10 + 5 + static_cast<std::uint64_t>(ctx.rank()));
    auto g = cg::trace(recorded, cg::input<float>({n, n}), cg::input<float>({n, n}));
    cg::lint(g);
    const auto expected = bits_of(cg::compile(g, ctx)(x0, x1));
    const auto g_default = cg::trace(step, cg::input<float>({n, n}), cg::input<float>({n, n}));
    cg::lint(g_default);
    {
      std::lock_guard lk(seen_mutex);
      if (!cg::structurally_equal(g_default, g)) joint_default_changed() += 1;
    }
    auto fail = [&](const std::string& how) {
      std::ostringstream os;
      os << "random joint graph seed=" << seed << " world=" << world << " length=" << length << " rank "
         << ctx.rank() << ": " << how << " differs from the unscheduled joint graph (rerun: joint_property("
         << world << ", " << seed << ", " << length << "))";
      std::lock_guard lk(m);
      failures.push_back(os.str());
    };
    if (bits_of(cg::compile(g_default, ctx)(x0, x1)) != expected) fail("traced with recompute_pointwise");
    check_every_pass(g, step, ctx, x0, x1, expected, passes_that_changed_joint(), fail);
  });
  for (const auto& f : failures) FAIL_CHECK(f);
}

}  // namespace random_graph_ops_test

using namespace random_graph_ops_test;

TEST_CASE("schedule.random_graph_ops.joint_graph_every_pass_equals_unscheduled") {
  int cases = 0;
  for (int world : {2, 3, 4})
    for (std::uint64_t seed = 5; seed <= 8; ++seed) {
      joint_property(world, seed * 2003 + static_cast<std::uint64_t>(world), 28);
      ++cases;
    }
  CHECK(cases == 12);
  for (auto pass : cg::schedule_pass_names()) {
    CAPTURE(pass);
    CHECK(passes_that_changed_joint().count(std::string(pass)) == 1);
  }
  CHECK(joint_default_changed() > 0);
}

TEST_CASE("schedule.random_graph_ops.every_pass_equals_eager") {
  int cases = 0;
  for (int world : {2, 3, 4})
    for (std::uint64_t seed = 1; seed <= 16; ++seed) {
      property(world, seed * 1009 + static_cast<std::uint64_t>(world), 28);
      ++cases;
    }
  CHECK(cases == 48);
  // The programs covered every new op (and the collectives they are interleaved with).
  for (const char* op : {"sum", "mean", "amax", "amin", "var", "softmax", "log_softmax", "layer_norm", "rms_norm",
                         "cat", "stack", "bmm", "linear", "embedding", "index_select", "gather", "argmax", "argmin",
                         "max_dim", "cross_entropy", "pointwise", "matmul", "all_reduce", "all_gather_into_tensor",
                         "reduce_scatter_tensor", "all_to_all_single"}) {
    CAPTURE(op);
    CHECK(ops_seen().count(op) == 1);
  }
  // recompute_pointwise has work only where a value is read long after it is made, which these
  // forward programs (each step reads the last few values) do not do: the joint graphs above
  // check that it changed some.
  for (auto pass : cg::schedule_pass_names()) {
    if (pass == "recompute_pointwise") continue;
    CAPTURE(pass);
    CHECK(passes_that_changed().count(std::string(pass)) == 1);
  }
}
