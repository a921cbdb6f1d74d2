// tests/runtime/test_store.cpp: the rendezvous stores of ccgraph/runtime/store.hpp (tcp_store
// with a server on port 0 and client threads, file_store in a temp dir), barrier(), the
// launcher environment (env_config, make_store_from_env) and scripts/ccgraph-launch. Timeouts
// are short where a timeout is the point, and long (a bug fails in seconds, never hangs) where
// it is not.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <latch>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>

#include <ccgraph/core/error.hpp>
#include <ccgraph/runtime/store.hpp>

#include "support.hpp"

namespace cg = ccgraph;
using namespace ccgraph_test;

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// A generous timeout for stores that must not time out.
constexpr milliseconds long_timeout{30000};

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& v) { return {v.begin(), v.end()}; }

/// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ccgraph-store-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

/// Sets (or, with nullopt, unsets) environment variables for a scope, then restores them.
class env_guard {
 public:
  explicit env_guard(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }
  ~env_guard() {
    for (const auto& [k, v] : saved_) {
      if (v) {
        ::setenv(k.c_str(), v->c_str(), 1);
      } else {
        ::unsetenv(k.c_str());
      }
    }
  }
  env_guard(const env_guard&) = delete;
  env_guard& operator=(const env_guard&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

/// A port nobody listens on now: one the kernel handed to a server that is gone again.
int unused_port() {
  cg::tcp_store s("127.0.0.1", 0, true, 1, long_timeout);
  return s.port();
}

/// Runs `fn(i)` on `n` threads and joins them; an exception in a thread fails the test.
template <class F>
void on_threads(int n, F fn) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      try {
        fn(i);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(i)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < n; ++i)
    CHECK_MESSAGE(errors[static_cast<std::size_t>(i)].empty(), "thread ", i, ": ",
                  errors[static_cast<std::size_t>(i)]);
}

/// The work every store must do the same way: set/get/check/wait/add from `n` threads, each
/// with its own store from `make(i)` (or one shared store when make returns the same one).
template <class Make>
void exercise_store(int n, Make make) {
  std::vector<std::shared_ptr<cg::store>> stores;
  for (int i = 0; i < n; ++i) stores.push_back(make(i));
  on_threads(n, [&](int i) {
    cg::store& s = *stores[static_cast<std::size_t>(i)];
    s.set("key/" + std::to_string(i), bytes("value " + std::to_string(i)));
    for (int k = 0; k < 50; ++k) s.add("counter", 1);
    std::vector<std::string> all;
    for (int j = 0; j < n; ++j) all.push_back("key/" + std::to_string(j));
    s.wait(all);
    CHECK(s.check(all));
    for (int j = 0; j < n; ++j)
      CHECK(text(s.get("key/" + std::to_string(j))) == "value " + std::to_string(j));
    cg::barrier(s, "counted", i, n);  // every add is done past here
    CHECK(s.add("counter", 0) == 50 * n);
  });
  cg::store& s = *stores[0];
  CHECK(text(s.get("counter")) == std::to_string(50 * n));  // a counter is its decimal text
  CHECK_FALSE(s.check({"key/0", "nobody/set/this"}));
  CHECK(s.check({}));
  s.set("key/0", bytes("replaced"));
  CHECK(text(s.get("key/0")) == "replaced");
  s.set("empty", {});
  CHECK(s.get("empty").empty());
  CHECK(s.add("negative", -5) == -5);
  CHECK(s.add("max", std::numeric_limits<std::int64_t>::max()) ==
        std::numeric_limits<std::int64_t>::max());
  CHECK(contains(error_of<cg::error>([&] { s.add("max", 1); }), "overflows int64"));
  CHECK(s.add("max", 0) == std::numeric_limits<std::int64_t>::max());  // unchanged
  const std::string m = error_of<cg::error>([&] { s.add("key/1", 1); });
  CHECK(contains(m, "add"));
  CHECK(contains(m, "'key/1'"));
  CHECK(contains(m, "not a decimal integer"));
  // Values of any bytes, and large enough to arrive in many pieces.
  std::vector<std::uint8_t> big(3u << 20);
  for (std::size_t k = 0; k < big.size(); ++k) big[k] = static_cast<std::uint8_t>(k * 7 + k / 4096);
  s.set("big", big);
  CHECK(stores.back()->get("big") == big);
}

/// A get on one thread that another thread satisfies later: get blocks, then returns it.
void get_blocks_until_set(cg::store& getter, cg::store& setter) {
  std::atomic<bool> set_done{false};
  std::vector<std::uint8_t> got;
  std::thread t([&] { got = getter.get("late"); });
  std::this_thread::sleep_for(milliseconds(50));
  set_done = true;
  setter.set("late", bytes("finally"));
  t.join();
  CHECK(set_done.load());
  CHECK(text(got) == "finally");
}

/// get and wait of missing keys time out after the 100 ms timeout, naming what is missing.
void missing_keys_time_out(cg::store& s, const std::string& name) {
  s.set_timeout(milliseconds(100));
  CHECK(s.timeout() == milliseconds(100));
  auto t0 = clock_type::now();
  std::string m = error_of<cg::timeout_error>([&] { s.get("no/such/key"); });
  const double took = seconds_since(t0);
  CHECK(took >= 0.09);
  CHECK(took < 3.0);
  CHECK(contains(m, "get"));
  CHECK(contains(m, "'no/such/key'"));
  CHECK(contains(m, name));
  CHECK(contains(m, "100 ms"));

  s.set("here", bytes("x"));
  t0 = clock_type::now();
  m = error_of<cg::timeout_error>([&] { s.wait({"here", "missing/a", "missing/b"}); });
  CHECK(seconds_since(t0) < 3.0);
  CHECK(contains(m, "wait"));
  CHECK(contains(m, "2 of 3 keys"));
  CHECK(contains(m, "'missing/a', 'missing/b'"));
  CHECK_FALSE(contains(m, "'here'"));
  CHECK(contains(m, name));
  // The store still works after a timeout (tcp_store: the connection stayed in step).
  CHECK(text(s.get("here")) == "x");
  s.wait({"here"});
  CHECK_THROWS_AS(s.set_timeout(milliseconds(0)), cg::error);
}

}  // namespace

// --- tcp_store -------------------------------------------------------------------------------

TEST_CASE("store.tcp.server_on_port_0_and_client_threads") {
  auto server = std::make_shared<cg::tcp_store>("127.0.0.1", 0, true, 4, long_timeout);
  REQUIRE(server->port() > 0);
  CHECK(server->is_server());
  CHECK(server->world_size() == 4);
  CHECK(server->describe() == "127.0.0.1:" + std::to_string(server->port()));
  exercise_store(4, [&](int i) -> std::shared_ptr<cg::store> {
    if (i == 0) return server;
    return std::make_shared<cg::tcp_store>("localhost", server->port(), false, 4, long_timeout);
  });
}

TEST_CASE("store.tcp.one_store_shared_by_threads") {
  // Threads share one client: a get blocked on one thread must not hold up a set on another.
  cg::tcp_store server("127.0.0.1", 0, true, 2, long_timeout);
  auto client = std::make_shared<cg::tcp_store>("127.0.0.1", server.port(), false, 2, long_timeout);
  get_blocks_until_set(*client, *client);
  exercise_store(4, [&](int) -> std::shared_ptr<cg::store> { return client; });
}

TEST_CASE("store.tcp.get_blocks_until_set") {
  cg::tcp_store server("127.0.0.1", 0, true, 2, long_timeout);
  cg::tcp_store client("127.0.0.1", server.port(), false, 2, long_timeout);
  get_blocks_until_set(client, server);
}

TEST_CASE("store.tcp.missing_key_times_out") {
  cg::tcp_store server("127.0.0.1", 0, true, 2, long_timeout);
  cg::tcp_store client("127.0.0.1", server.port(), false, 2, long_timeout);
  missing_keys_time_out(client, "127.0.0.1:" + std::to_string(server.port()));
  missing_keys_time_out(server, "127.0.0.1:" + std::to_string(server.port()));
}

TEST_CASE("store.tcp.no_server_times_out_naming_host_port") {
  const int port = unused_port();
  const auto t0 = clock_type::now();
  const std::string m = error_of<cg::timeout_error>(
      [&] { cg::tcp_store("127.0.0.1", port, false, 2, milliseconds(300)); });
  CHECK(seconds_since(t0) >= 0.29);
  CHECK(seconds_since(t0) < 5.0);
  CHECK(contains(m, "127.0.0.1:" + std::to_string(port)));
  CHECK(contains(m, "300 ms"));
  CHECK(contains(m, "refused"));
}

TEST_CASE("store.tcp.server_starts_after_the_client") {
  const int port = unused_port();
  std::unique_ptr<cg::tcp_store> client;
  std::string error;
  std::thread t([&] {
    try {
      client = std::make_unique<cg::tcp_store>("127.0.0.1", port, false, 2, long_timeout);
      client->set("from", bytes("client"));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(200));  // the client is retrying by now
  cg::tcp_store server("127.0.0.1", port, true, 2, long_timeout);
  CHECK(server.port() == port);
  CHECK(text(server.get("from")) == "client");
  t.join();
  CHECK(error.empty());
  client.reset();
}

TEST_CASE("store.tcp.server_destroyed_under_a_blocked_client") {
  // The server stops at once even with clients connected, and a client blocked in get() fails
  // promptly with an error naming the store, instead of waiting out its timeout.
  auto server = std::make_unique<cg::tcp_store>("127.0.0.1", 0, true, 2, long_timeout);
  const int port = server->port();
  cg::tcp_store client("127.0.0.1", port, false, 2, long_timeout);
  client.set("a", bytes("1"));
  std::string m;
  bool was_timeout = false;
  std::thread t([&] {
    try {
      client.get("never");
    } catch (const cg::timeout_error& e) {
      was_timeout = true;
      m = e.what();
    } catch (const cg::error& e) {
      m = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(100));
  const auto t0 = clock_type::now();
  server.reset();
  t.join();
  CHECK(seconds_since(t0) < 5.0);
  CHECK_FALSE(was_timeout);
  CHECK(contains(m, "tcp_store::get"));
  CHECK(contains(m, "127.0.0.1:" + std::to_string(port)));
}

TEST_CASE("store.tcp.stopping_server_answers_connected_clients") {
  // Destroying the server's store stops new connections, but a rank still connected is
  // served until it hangs up; then the destructor returns at once, well before its grace.
  auto server = std::make_unique<cg::tcp_store>("127.0.0.1", 0, true, 2, long_timeout,
                                                milliseconds(20000));
  const int port = server->port();
  auto client = std::make_unique<cg::tcp_store>("127.0.0.1", port, false, 2, long_timeout);
  client->set("before", bytes("1"));
  double stop_seconds = -1;
  std::thread stopper([&] {
    const auto t0 = clock_type::now();
    server.reset();
    stop_seconds = seconds_since(t0);
  });
  std::this_thread::sleep_for(milliseconds(100));  // the server is stopping by now
  CHECK(text(client->get("before")) == "1");
  client->set("after", bytes("2"));
  CHECK(text(client->get("after")) == "2");
  CHECK(client->add("n", 3) == 3);
  // New connections are refused while it stops.
  CHECK_THROWS_AS(cg::tcp_store("127.0.0.1", port, false, 2, milliseconds(200)),
                  cg::timeout_error);
  client.reset();
  stopper.join();
  CHECK(stop_seconds >= 0.05);
  CHECK(stop_seconds < 10.0);
}

TEST_CASE("store.tcp.server_leaving_a_barrier_last_does_not_cut_off_its_peer") {
  // The end of every job: the peer arrives at the final barrier first; the server's rank
  // arrives last, sets the barrier's key, returns at once and destroys its store, while the
  // peer's wait may still be on its way (CI once saw it cut off: "connection reset"). The
  // barrier's two steps are spelled out so the peer can be slow between them, by 0 to 1.6 ms:
  // before, during and after the server stops.
  for (int round = 0; round < 45; ++round) {
    auto server = std::make_unique<cg::tcp_store>("127.0.0.1", 0, true, 2, long_timeout);
    auto client =
        std::make_unique<cg::tcp_store>("127.0.0.1", server->port(), false, 2, long_timeout);
    std::string error;
    std::thread peer([&] {
      try {
        client->add("arrived", 1);
        std::this_thread::sleep_for(std::chrono::microseconds(200 * (round % 9)));
        client->wait({"done"});
      } catch (const std::exception& e) {
        error = e.what();
      }
      client.reset();
    });
    while (server->add("arrived", 0) < 1)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    server->set("done", bytes("1"));
    server.reset();
    peer.join();
    REQUIRE_MESSAGE(error.empty(), "round ", round, ": ", error);
  }
}

TEST_CASE("store.tcp.shutdown_grace_bounds_an_idle_client") {
  // A rank that stays connected but sends nothing holds the stopping server for at most the
  // grace; its next call then fails naming the store, as with a server that is gone.
  auto server = std::make_unique<cg::tcp_store>("127.0.0.1", 0, true, 2, long_timeout,
                                                milliseconds(300));
  const int port = server->port();
  cg::tcp_store client("127.0.0.1", port, false, 2, long_timeout);
  client.set("a", bytes("1"));
  const auto t0 = clock_type::now();
  server.reset();
  CHECK(seconds_since(t0) >= 0.25);
  CHECK(seconds_since(t0) < 5.0);
  const std::string m = error_of<cg::error>([&] { client.get("a"); });
  CHECK(contains(m, "tcp_store::get"));
  CHECK(contains(m, "127.0.0.1:" + std::to_string(port)));
  CHECK_THROWS_AS(cg::tcp_store("127.0.0.1", 0, true, 2, long_timeout, milliseconds(-1)),
                  cg::error);
}

TEST_CASE("store.tcp.bad_arguments") {
  CHECK_THROWS_AS(cg::tcp_store("127.0.0.1", 0, false, 2, long_timeout), cg::error);
  CHECK_THROWS_AS(cg::tcp_store("127.0.0.1", 70000, true, 2, long_timeout), cg::error);
  CHECK_THROWS_AS(cg::tcp_store("127.0.0.1", 0, true, 0, long_timeout), cg::error);
  CHECK_THROWS_AS(cg::tcp_store("", 0, true, 1, long_timeout), cg::error);
  // Two servers on one port: the second names the port.
  cg::tcp_store first("127.0.0.1", 0, true, 1, long_timeout);
  const std::string m = error_of<cg::error>(
      [&] { cg::tcp_store("127.0.0.1", first.port(), true, 1, long_timeout); });
  CHECK(contains(m, "port " + std::to_string(first.port())));
  CHECK(contains(m, "in use"));
}

// --- file_store ------------------------------------------------------------------------------

TEST_CASE("store.file.set_get_add_from_threads") {
  temp_dir dir;
  const std::string path = dir.file("store");
  {
    // One file_store per thread, as one per process: add is atomic across them.
    exercise_store(4, [&](int) -> std::shared_ptr<cg::store> {
      return std::make_shared<cg::file_store>(path, 4, long_timeout);
    });
  }
  // The last of the 4 file_stores removed the file.
  CHECK_FALSE(std::filesystem::exists(path));
  // One file_store shared by threads.
  auto shared = std::make_shared<cg::file_store>(path, 1, long_timeout);
  CHECK(shared->path() == path);
  CHECK(shared->describe() == path);
  exercise_store(3, [&](int) -> std::shared_ptr<cg::store> { return shared; });
}

TEST_CASE("store.file.add_is_atomic_across_stores") {
  temp_dir dir;
  const std::string path = dir.file("counter");
  std::vector<std::unique_ptr<cg::file_store>> stores;
  for (int i = 0; i < 4; ++i)
    stores.push_back(std::make_unique<cg::file_store>(path, 4, long_timeout));
  std::vector<std::vector<std::int64_t>> seen(4);
  on_threads(4, [&](int i) {
    for (int k = 0; k < 100; ++k)
      seen[static_cast<std::size_t>(i)].push_back(stores[static_cast<std::size_t>(i)]->add("n", 1));
  });
  // Every value 1..400 was returned exactly once: no two adds read the same old value.
  std::vector<int> hits(401, 0);
  for (const auto& v : seen)
    for (auto x : v) {
      REQUIRE(x >= 1);
      REQUIRE(x <= 400);
      ++hits[static_cast<std::size_t>(x)];
    }
  for (int x = 1; x <= 400; ++x) CHECK(hits[static_cast<std::size_t>(x)] == 1);
  CHECK(stores[0]->add("n", 0) == 400);
}

TEST_CASE("store.file.get_blocks_until_set") {
  temp_dir dir;
  cg::file_store a(dir.file("s"), 2, long_timeout);
  cg::file_store b(dir.file("s"), 2, long_timeout);
  get_blocks_until_set(a, b);
}

TEST_CASE("store.file.missing_key_times_out") {
  temp_dir dir;
  cg::file_store s(dir.file("s"), 1, long_timeout);
  missing_keys_time_out(s, dir.file("s"));
}

TEST_CASE("store.file.bad_paths_and_files") {
  temp_dir dir;
  std::string m = error_of<cg::error>([&] { cg::file_store(dir.file("no/such/dir/s"), 1); });
  CHECK(contains(m, dir.file("no/such/dir/s")));
  CHECK(contains(m, "No such file"));
  { std::ofstream(dir.file("garbage")) << "this is not a store file at all\n"; }
  m = error_of<cg::error>([&] { cg::file_store(dir.file("garbage"), 1); });
  CHECK(contains(m, dir.file("garbage")));
  CHECK(contains(m, "not a file_store file"));
  CHECK_THROWS_AS(cg::file_store(dir.file("s"), 0), cg::error);
}

TEST_CASE("store.file.torn_record_is_cut_off") {
  // A writer that died halfway through a record leaves a partial one at the end: readers skip
  // it, and the next append replaces it.
  temp_dir dir;
  const std::string path = dir.file("s");
  cg::file_store s(path, 2, long_timeout);
  s.set("a", bytes("1"));
  {
    std::ofstream f(path, std::ios::app | std::ios::binary);
    const char partial[] = {0, 0, 0, 3, 'x', 'y'};  // key length 3, then 2 of its 3 bytes
    f.write(partial, sizeof partial);
  }
  cg::file_store other(path, 2, long_timeout);  // reads past nothing it cannot parse
  CHECK(text(other.get("a")) == "1");
  other.set("b", bytes("2"));
  CHECK(text(s.get("b")) == "2");
  CHECK(text(s.get("a")) == "1");
}

namespace {

/// Every entry of `dir` with its type, permissions and (for files) bytes: what a file_store that
/// refuses a file must leave exactly as it was (no temporary files left behind either).
std::map<std::string, std::string> snapshot(const std::filesystem::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const auto st = e.symlink_status();
    std::string v = std::to_string(static_cast<int>(st.type())) + "/" +
                    std::to_string(static_cast<int>(st.permissions())) + "/";
    if (st.type() == std::filesystem::file_type::regular) {
      std::ifstream f(e.path(), std::ios::binary);
      v.append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    m[e.path().filename().string()] = v;
  }
  return m;
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// A file_store header: magic, version, world size.
std::string store_header(std::uint32_t version, std::uint32_t world_size) {
  std::string h = "ccgstore";
  for (const std::uint32_t v : {version, world_size})
    for (int s = 24; s >= 0; s -= 8) h += static_cast<char>((v >> s) & 0xff);
  return h;
}

}  // namespace

TEST_CASE("store.file.foreign_files_are_errors_and_left_unchanged") {
  // A wrong CCGRAPH_STORE_FILE used to destroy the file: one starting 00 00 00 xx was read as
  // a store with a torn last record, cut to 35 bytes, and unlinked by the last rank.
  temp_dir dir;
  std::mt19937 rng(21);
  std::string random(4108, '\0');
  for (auto& ch : random) ch = static_cast<char>(rng());
  // The reproducer: a "record" with key "hello" and a value of 8192 bytes, of which
  // only 4095 follow: a torn record to the old code, which cut the file to 35 bytes.
  std::string record_like("\0\0\0\x05hello\0\0\x20\0", 13);
  record_like.resize(4108, 'a');
  write_file(dir.file("random"), random);
  write_file(dir.file("empty"), "");
  write_file(dir.file("record_like"), record_like);
  write_file(dir.file("short"), "ccgsto");
  write_file(dir.file("other_version"), store_header(7, 1));
  write_file(dir.file("text"), "this is not a store file at all\n");
  std::filesystem::create_directory(dir.file("directory"));
  write_file(dir.file("unreadable"), random.substr(0, 100));
  std::filesystem::permissions(dir.file("unreadable"), std::filesystem::perms::none);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"random", "not a file_store file (4108 bytes, starting "},
      {"empty", "not a file_store file (0 bytes)"},
      {"record_like", "not a file_store file (4108 bytes, starting 00 00 00 05 68 65 6c 6c 6f 00 00 20"},
      {"short", "not a file_store file (6 bytes, starting 63 63 67 73 74 6f)"},
      {"other_version", "is a file_store file of format version 7, this ccgraph reads version 1"},
      {"text", "not a file_store file"},
      {"directory", "Is a directory"},
      // Permission denied; as root (who may open it anyway), not a store file.
      {"unreadable", ::geteuid() == 0 ? "not a file_store file" : "Permission denied"},
  };
  const auto before = snapshot(dir.path);
  for (const auto& [name, expect] : cases) {
    CAPTURE(name);
    const std::string path = dir.file(name);
    std::string m = error_of<cg::error>([&] { cg::file_store(path, 2, long_timeout); });
    CHECK_MESSAGE(contains(m, "'" + path + "'"), m);
    CHECK_MESSAGE(contains(m, expect), m);
    // Through the launcher's environment, as in the issue.
    {
      env_guard env({{"CCGRAPH_STORE_FILE", path}});
      cg::env_config c;
      c.world_size = 2;
      m = error_of<cg::error>([&] { cg::make_store_from_env(c); });
      CHECK_MESSAGE(contains(m, expect), m);
    }
    CHECK(snapshot(dir.path) == before);  // byte-identical, still there, nothing added
  }
  std::filesystem::permissions(dir.file("unreadable"), std::filesystem::perms::owner_all);
}

TEST_CASE("store.file.made_with_a_header_for_its_world_size") {
  temp_dir dir;
  const std::string path = dir.file("s");
  auto a = std::make_unique<cg::file_store>(path, 2, long_timeout);
  CHECK(read_file(path).substr(0, 16) == store_header(1, 2));
  // Another world size is an error on the rank that brings it, and harms nothing.
  const auto before = snapshot(dir.path);
  const std::string m = error_of<cg::error>([&] { cg::file_store(path, 3, long_timeout); });
  CHECK(contains(m, "was made for world_size 2 but this rank joins with world_size 3"));
  CHECK(snapshot(dir.path) == before);
  auto b = std::make_unique<cg::file_store>(path, 2, long_timeout);
  a->set("k", bytes("v"));
  CHECK(text(b->get("k")) == "v");
  a.reset();
  CHECK(std::filesystem::exists(path));
  b.reset();
  CHECK_FALSE(std::filesystem::exists(path));  // the last of 2 removed it
}

TEST_CASE("store.file.concurrent_creation") {
  // The ranks of a job create the file at once: exactly one makes it, nobody sees it without
  // its header, and nothing is left behind.
  temp_dir dir;
  for (int round = 0; round < 10; ++round) {
    const std::string path = dir.file("race" + std::to_string(round));
    constexpr int n = 6;
    std::vector<std::unique_ptr<cg::file_store>> stores(n);
    std::latch start(n);
    on_threads(n, [&](int i) {
      start.arrive_and_wait();
      stores[static_cast<std::size_t>(i)] = std::make_unique<cg::file_store>(path, n, long_timeout);
      stores[static_cast<std::size_t>(i)]->set("rank/" + std::to_string(i), bytes("x"));
    });
    std::vector<std::string> all;
    for (int i = 0; i < n; ++i) all.push_back("rank/" + std::to_string(i));
    for (auto& s : stores) REQUIRE(s != nullptr);
    stores[0]->wait(all);
    stores.clear();
    CHECK(std::filesystem::is_empty(dir.path));
  }
}

TEST_CASE("store.file.removes_only_the_file_it_opened") {
  // Whatever now sits at the path (replaced while the store was in use) is not the store's to
  // remove; its calls fail naming the path instead of writing into it.
  temp_dir dir;
  const std::string path = dir.file("s");
  {
    cg::file_store s(path, 1, long_timeout);
    s.set("a", bytes("1"));
    write_file(dir.file("precious"), "precious data");
    std::filesystem::rename(dir.file("precious"), path);
    const std::string m = error_of<cg::error>([&] { s.set("b", bytes("2")); });
    CHECK(contains(m, "'" + path + "' is no longer the store file this file_store opened"));
  }
  CHECK(read_file(path) == "precious data");
  // A store file shortened behind its back is an error too, not a fresh start.
  std::filesystem::remove(path);
  {
    cg::file_store s(path, 1, long_timeout);
    s.set("a", bytes("1"));
    std::filesystem::resize_file(path, 16);
    CHECK(contains(error_of<cg::error>([&] { s.get("a"); }), "shrank"));
  }
}

// --- barrier ---------------------------------------------------------------------------------

TEST_CASE("store.barrier.four_threads_tcp_and_file") {
  temp_dir dir;
  for (const bool tcp : {true, false}) {
    CAPTURE(tcp);
    std::vector<std::unique_ptr<cg::store>> stores;
    auto server = std::make_unique<cg::tcp_store>("127.0.0.1", 0, true, 4, long_timeout);
    const int port = server->port();
    for (int i = 0; i < 4; ++i) {
      if (tcp) {
        stores.push_back(
            i == 0 ? std::unique_ptr<cg::store>(std::move(server))
                   : std::make_unique<cg::tcp_store>("127.0.0.1", port, false, 4, long_timeout));
      } else {
        stores.push_back(std::make_unique<cg::file_store>(dir.file("barrier"), 4, long_timeout));
      }
    }
    // Nobody leaves round k before everybody entered it; the name is reused across rounds.
    constexpr int rounds = 5;
    std::vector<std::atomic<int>> entered(rounds);
    on_threads(4, [&](int rank) {
      for (int k = 0; k < rounds; ++k) {
        if (rank == k % 4) std::this_thread::sleep_for(milliseconds(20));  // one straggler
        entered[static_cast<std::size_t>(k)].fetch_add(1);
        cg::barrier(*stores[static_cast<std::size_t>(rank)], "rounds", rank, 4);
        CHECK(entered[static_cast<std::size_t>(k)].load() == 4);
      }
    });
    // The server (stores[0] in the tcp case) goes last.
    for (std::size_t i = stores.size(); i-- > 0;) stores[i].reset();
  }
}

TEST_CASE("store.barrier.timeout_names_the_barrier") {
  cg::tcp_store s("127.0.0.1", 0, true, 2, milliseconds(100));
  const std::string m = error_of<cg::timeout_error>([&] { cg::barrier(s, "lonely", 1, 2); });
  CHECK(contains(m, "barrier 'lonely'"));
  CHECK(contains(m, "rank 1"));
  CHECK(contains(m, "1 of 2 ranks arrived"));
  CHECK(contains(m, "127.0.0.1:" + std::to_string(s.port())));
  CHECK_THROWS_AS(cg::barrier(s, "x", 2, 2), cg::error);
  CHECK_THROWS_AS(cg::barrier(s, "x", 0, 0), cg::error);
  cg::barrier(s, "alone", 0, 1);  // a world of one never waits
}

// --- env_config and make_store_from_env ------------------------------------------------------

namespace {

/// env_config::from_env over `vars` instead of the process environment.
cg::env_config parse_env(const std::map<std::string, std::string>& vars) {
  return cg::env_config::from_env([&](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

std::string env_error(const std::map<std::string, std::string>& vars) {
  return error_of<cg::error>([&] { parse_env(vars); });
}

}  // namespace

TEST_CASE("env_config.from_env.values_and_defaults") {
  auto c = parse_env({{"RANK", "3"}, {"WORLD_SIZE", "8"}});
  CHECK(c.rank == 3);
  CHECK(c.world_size == 8);
  CHECK(c.local_rank == 3);  // defaults: the whole job on one machine
  CHECK(c.local_world_size == 8);
  CHECK(c.master_addr == "127.0.0.1");
  CHECK(c.master_port == 29500);

  c = parse_env({{"RANK", "5"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "4"},
                 {"MASTER_ADDR", "node-0.cluster"},
                 {"MASTER_PORT", "12345"}});
  CHECK(c.rank == 5);
  CHECK(c.local_rank == 1);
  CHECK(c.local_world_size == 4);
  CHECK(c.master_addr == "node-0.cluster");
  CHECK(c.master_port == 12345);
}

TEST_CASE("env_config.from_env.errors_name_the_variable_and_value") {
  std::string m = env_error({{"WORLD_SIZE", "2"}});
  CHECK(contains(m, "RANK is not set"));
  CHECK(contains(m, "ccgraph-launch"));
  CHECK(contains(env_error({{"RANK", "0"}}), "WORLD_SIZE is not set"));
  m = env_error({{"RANK", "0"}, {"WORLD_SIZE", "two"}});
  CHECK(contains(m, "WORLD_SIZE='two' is not an integer"));
  CHECK(contains(env_error({{"RANK", "1x"}, {"WORLD_SIZE", "2"}}), "RANK='1x' is not an integer"));
  CHECK(contains(env_error({{"RANK", ""}, {"WORLD_SIZE", "2"}}), "RANK='' is not an integer"));
  CHECK(contains(env_error({{"RANK", " 1"}, {"WORLD_SIZE", "2"}}), "RANK=' 1'"));
  CHECK(contains(env_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE=0 must be in [1,"));
  CHECK(contains(env_error({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}),
                 "WORLD_SIZE=99999999999"));
  m = env_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  CHECK(contains(m, "RANK=4 must be in [0, WORLD_SIZE=4)"));
  CHECK(contains(env_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), "RANK=-1"));
  m = env_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "8"}});
  CHECK(contains(m, "LOCAL_WORLD_SIZE=8 must be in [1, WORLD_SIZE=4]"));
  m = env_error(
      {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}});
  CHECK(contains(m, "LOCAL_RANK=2 must be in [0, LOCAL_WORLD_SIZE=2)"));
  m = env_error({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}});
  CHECK(contains(m, "LOCAL_RANK is not set, so it defaults to RANK=3"));
  CHECK(contains(env_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}),
                 "MASTER_PORT=70000 must be in [1, 65535]"));
  CHECK(contains(env_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "http"}}),
                 "MASTER_PORT='http' is not an integer"));
  CHECK(contains(env_error({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", ""}}),
                 "MASTER_ADDR is set but empty"));
}

TEST_CASE("env_config.make_store_from_env") {
  // The real process environment (no other thread runs while this test changes it).
  temp_dir dir;
  const std::string file = dir.file("job-store");
  {
    env_guard env({{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_RANK", std::nullopt},
                   {"LOCAL_WORLD_SIZE", std::nullopt},
                   {"MASTER_ADDR", std::nullopt},
                   {"MASTER_PORT", "23456"},
                   {"CCGRAPH_STORE_FILE", file},
                   {"CCGRAPH_STORE_TIMEOUT_S", "0.25"}});
    const auto c = cg::env_config::from_env();
    CHECK(c.rank == 1);
    CHECK(c.world_size == 2);
    CHECK(c.local_rank == 1);
    CHECK(c.master_port == 23456);
    auto s = cg::make_store_from_env(c);
    REQUIRE(dynamic_cast<cg::file_store*>(s.get()) != nullptr);
    CHECK(s->describe() == file);
    CHECK(s->timeout() == milliseconds(250));
  }
  {
    const int port = unused_port();
    env_guard env({{"CCGRAPH_STORE_FILE", std::nullopt}, {"CCGRAPH_STORE_TIMEOUT_S", "20"}});
    cg::env_config c;
    c.rank = 0;
    c.world_size = 2;
    c.master_port = port;
    auto server = cg::make_store_from_env(c);
    auto* tcp = dynamic_cast<cg::tcp_store*>(server.get());
    REQUIRE(tcp != nullptr);
    CHECK(tcp->is_server());
    CHECK(tcp->port() == port);
    CHECK(tcp->timeout() == milliseconds(20000));
    c.rank = 1;
    auto client = cg::make_store_from_env(c);
    REQUIRE(dynamic_cast<cg::tcp_store*>(client.get()) != nullptr);
    CHECK_FALSE(dynamic_cast<cg::tcp_store&>(*client).is_server());
    client->set("k", bytes("v"));
    CHECK(text(server->get("k")) == "v");
  }
  for (const char* bad : {"0", "-3", "soon", "1e999", "nan"}) {
    env_guard env({{"CCGRAPH_STORE_FILE", file}, {"CCGRAPH_STORE_TIMEOUT_S", bad}});
    const std::string m = error_of<cg::error>([] { cg::make_store_from_env(cg::env_config{}); });
    CHECK(contains(m, std::string("CCGRAPH_STORE_TIMEOUT_S='") + bad + "'"));
  }
}

// --- scripts/ccgraph-launch ------------------------------------------------------------------

#ifdef CCGRAPH_LAUNCH_SCRIPT
namespace {

/// Runs `cmd` through the shell; returns its exit status and its stdout.
std::pair<int, std::string> run_command(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string launcher = std::string("bash '") + CCGRAPH_LAUNCH_SCRIPT + "'";

}  // namespace

TEST_CASE("launch.sets_the_environment_and_prefixes_lines") {
  const auto result = run_command(
      launcher +
      " -n 3 --master-port 23999 sh -c "
      "'echo \"$RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE $MASTER_ADDR:$MASTER_PORT\"; "
      "printf last' 2>/dev/null");
  const std::string& out = result.second;
  CHECK(result.first == 0);
  INFO("launcher output:\n", out);
  for (int r = 0; r < 3; ++r) {
    const std::string p = "[rank " + std::to_string(r) + "] ";
    CHECK(
        contains(out, p + std::to_string(r) + "/3 " + std::to_string(r) + "/3 127.0.0.1:23999\n"));
    CHECK(contains(out, p + "last\n"));  // a last line without a newline still comes out whole
  }
  // Without --master-port it picks one.
  const auto [status2, out2] = run_command(launcher + " -n 1 sh -c 'echo port=$MASTER_PORT'");
  CHECK(status2 == 0);
  CHECK(contains(out2, "[rank 0] port="));
  CHECK_FALSE(contains(out2, "port=\n"));
}

TEST_CASE("launch.a_failing_rank_stops_the_others") {
  const auto t0 = clock_type::now();
  const auto [status, out] = run_command(
      launcher +
      " -n 3 --grace 0.3 sh -c 'if [ $RANK = 1 ]; then echo failing; exit 7; fi; sleep 60' "
      "2>/dev/null");
  CHECK(status == 7);  // the failing rank's status
  CHECK(contains(out, "[rank 1] failing"));
  CHECK(seconds_since(t0) < 20.0);  // the sleeping ranks were stopped, not waited for
  CHECK(run_command(launcher + " -n 2 false 2>/dev/null").first == 1);
  CHECK(run_command(launcher + " -n 0 true 2>/dev/null").first == 2);  // usage error
}
#endif
