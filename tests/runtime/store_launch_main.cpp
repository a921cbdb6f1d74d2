// tests/runtime/store_launch_main.cpp: one rank of the launcher test (CTest launch.*): run by
// scripts/ccgraph-launch -n N, each process rendezvouses through the store the environment
// names (rank 0's tcp_store, or a file_store), publishes a key, reads every peer's, meets the
// others at a barrier and prints OK. Exits non-zero, naming what failed, otherwise.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <ccgraph/runtime/store.hpp>

namespace cg = ccgraph;

int main() {
  try {
    const cg::env_config cfg = cg::env_config::from_env();
    const auto store = cg::make_store_from_env(cfg);
    const std::string mine = "hello from rank " + std::to_string(cfg.rank);
    store->set("greeting/" + std::to_string(cfg.rank), {mine.begin(), mine.end()});
    for (int peer = 0; peer < cfg.world_size; ++peer) {
      const auto v = store->get("greeting/" + std::to_string(peer));
      const std::string got(v.begin(), v.end());
      if (got != "hello from rank " + std::to_string(peer)) {
        std::fprintf(stderr, "FAILED: rank %d read '%s' from rank %d\n", cfg.rank, got.c_str(),
                     peer);
        return 1;
      }
    }
    if (store->add("arrivals", 1) > cfg.world_size) {
      std::fprintf(stderr, "FAILED: more arrivals than ranks (a stale store?)\n");
      return 1;
    }
    // Rank 0 serves the tcp_store: nobody may still need it when it exits.
    cg::barrier(*store, "done", cfg.rank, cfg.world_size);
    std::printf("OK rank %d of %d via %s\n", cfg.rank, cfg.world_size, store->describe().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
}
