// ODR test: links odr_a.cpp and odr_b.cpp, both of which include all of <ccgraph/ccgraph.hpp>.
#include <cstdio>
#include <string>

std::string odr_a();
std::string odr_b();

int main() {
  const bool ok = odr_a() == "a0" && odr_b() == "b1";
  std::puts(ok ? "odr: ok" : "odr: unexpected values");
  return ok ? 0 : 1;
}
