// Example 01: the seeds' buffer-reuse program, eagerly on the threads backend.
//
//   ar = all_reduce(a); c = relu(a); d = c @ c; e = d + ar        (a = ones(4, 4) + rank)
//
// The all_reduce is launched on the rank's communication worker and its result stays pending
// while relu and the matmul run on the rank's own thread; `d + ar` is its first use and waits.
// Each rank's result is printed and checked against the closed form
//   e = 4 (1 + rank)^2 + n (n + 1) / 2.
#include <ccgraph/ccgraph.hpp>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace cg = ccgraph;

// The program, written once: it runs on any rank of any world.
template <class Tensor>
auto buffer_reuse(const Tensor& a, const cg::group& g) {
  auto ar = cg::all_reduce(a, "sum", g);  // pending: computed by the comm worker
  cg::tensor<float> c = cg::relu(a);      // overlaps with the all_reduce
  auto d = cg::matmul(c, c);
  cg::tensor<float> e = d + ar;           // first use of ar: waits here
  return e;
}

int run(int world) {
  std::vector<std::string> report(static_cast<std::size_t>(world));
  std::vector<int> ok(static_cast<std::size_t>(world), 0);
  cg::run_threads(world, [&](cg::rank_context& ctx) {
    const int r = ctx.rank();
    cg::tensor<float> a = cg::ones<float>({4, 4}) + static_cast<float>(r);
    cg::tensor<float> e = buffer_reuse(a, ctx.world());

    const float expected = 4.f * float((1 + r) * (1 + r)) + float(world * (world + 1) / 2);
    bool good = e.shape() == cg::shape_t{4, 4};
    for (float v : e.to_vector()) good = good && v == expected;
    // The functional all_reduce must not have touched its input.
    for (float v : a.to_vector()) good = good && v == float(1 + r);

    std::ostringstream os;
    os << "  rank " << r << ": e = " << e << "\n    expected every element = " << expected
       << (good ? "  [ok]" : "  [MISMATCH]") << '\n';
    report[static_cast<std::size_t>(r)] = os.str();
    ok[static_cast<std::size_t>(r)] = good;
  });
  std::cout << "world size " << world << ":\n";
  int failures = 0;
  for (int r = 0; r < world; ++r) {
    std::cout << report[static_cast<std::size_t>(r)];
    failures += ok[static_cast<std::size_t>(r)] ? 0 : 1;
  }
  return failures;
}

int main() {
  int failures = 0;
  for (int world : {2, 4}) failures += run(world);
  std::cout << (failures == 0 ? "example 01: all ranks correct\n" : "example 01: FAILED\n");
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
