// tests/schedule/same_results.hpp: whether graph passes kept a program's results, checked by
// running the graphs before and after on the same random inputs (test_bucketing,
// test_decompose).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <variant>
#include <vector>

#include <ccgraph/ccgraph.hpp>

namespace ccgraph_test {

/// A deterministic input of `m`'s shape and dtype: uniform in [-1, 1] for float types, small
/// integers for integer types; other dtypes are an error naming the meta.
inline ccgraph::any_tensor random_input(const ccgraph::tensor_meta& m, std::uint64_t seed) {
  return ccgraph::visit_dtype(m.dtype, [&](auto tag) -> ccgraph::any_tensor {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      return ccgraph::uniform<T>(m.shape, -1.0, 1.0, seed);
    } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      std::vector<T> v(static_cast<std::size_t>(ccgraph::numel_of(m.shape)));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<T>((seed + 7 * i) % 13);
      return ccgraph::tensor<T>::from(v, m.shape);
    } else {
      CCGRAPH_THROW(ccgraph::error, "random_input: no random ", m.str(), " in this test");
    }
  });
}

/// The bytes of a tensor's values (bools one byte each).
inline std::vector<unsigned char> bytes_of(const ccgraph::any_tensor& t) {
  return std::visit(
      [](const auto& x) {
        const auto v = x.to_vector();
        std::vector<unsigned char> b;
        if constexpr (std::is_same_v<typename std::decay_t<decltype(x)>::value_type, bool>) {
          b.assign(v.begin(), v.end());
        } else {
          b.resize(v.size() * sizeof(v[0]));
          if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
        }
        return b;
      },
      t);
}

/// Runs `base` and every graph of `others` on the same random inputs on each of `world` ranks;
/// true when every output of every rank is bitwise equal to base's.
inline bool same_results(const ccgraph::graph& base, const std::vector<const ccgraph::graph*>& others,
                         int world) {
  std::vector<int> ok(static_cast<std::size_t>(world), 0);
  ccgraph::run_threads(world, [&](ccgraph::rank_context& ctx) {
    std::vector<ccgraph::any_tensor> in;
    std::uint64_t k = 0;
    for (const ccgraph::node* p : base.placeholders())
      in.push_back(random_input(p->meta(), 1000u * static_cast<std::uint64_t>(ctx.rank() + 1) + k++));
    const auto expect = ccgraph::compile(base, ctx).run(in);
    bool good = true;
    for (const ccgraph::graph* o : others) {
      const auto got = ccgraph::compile(*o, ctx).run(in);
      good = good && got.size() == expect.size();
      for (std::size_t i = 0; good && i < got.size(); ++i)
        good = ccgraph::meta_of(got[i]) == ccgraph::meta_of(expect[i]) &&
               bytes_of(got[i]) == bytes_of(expect[i]);
    }
    ok[static_cast<std::size_t>(ctx.rank())] = good;
  });
  return std::count(ok.begin(), ok.end(), 1) == world;
}

/// same_results of `a` against `b` alone.
inline bool same_results(const ccgraph::graph& a, const ccgraph::graph& b, int world) {
  return same_results(a, {&b}, world);
}

}  // namespace ccgraph_test
