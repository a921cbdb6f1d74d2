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

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

// --- tcp_store: where it listens, who may join, and what a peer can make the server do --------

namespace {

/// A raw TCP connection to a store's server, for speaking (and breaking) its protocol by hand.
/// Blocking, with 2 s send and receive timeouts, so no test can hang on it.
struct raw_conn {
  cg::detail::unique_fd fd;

  explicit raw_conn(int port, const char* host = "127.0.0.1", int timeout_ms = 2000) {
    fd = cg::detail::unique_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    REQUIRE(::inet_pton(AF_INET, host, &a.sin_addr) == 1);
    connected = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
    connect_errno = connected ? 0 : errno;
  }
  bool connected = false;
  int connect_errno = 0;

  /// Sends all of `b`; false when the connection failed or stayed full past the timeout.
  bool send(const std::vector<std::uint8_t>& b) {
    std::size_t off = 0;
    while (off < b.size()) {
      const ssize_t r = ::send(fd.get(), b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (r <= 0) return false;
      off += static_cast<std::size_t>(r);
    }
    return true;
  }
  /// Sends what the socket takes now, without waiting; the bytes sent.
  std::size_t send_now(const std::uint8_t* p, std::size_t n) {
    const ssize_t r = ::send(fd.get(), p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    return r > 0 ? static_cast<std::size_t>(r) : 0;
  }
  std::size_t send_now(const std::vector<std::uint8_t>& b) { return send_now(b.data(), b.size()); }
  bool recv_exact(std::uint8_t* p, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd.get(), p + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<std::size_t>(r);
    }
    return true;
  }
  /// The next reply's payload; nullopt when the connection closed or nothing came in time.
  std::optional<std::vector<std::uint8_t>> recv_frame() {
    std::uint8_t h[4];
    if (!recv_exact(h, 4)) return std::nullopt;
    std::vector<std::uint8_t> p(cg::detail::load_u32(h));
    if (p.size() > (std::size_t{1} << 28) || !recv_exact(p.data(), p.size())) return std::nullopt;
    return p;
  }
  /// Whether the server closes the connection (end of stream or a reset) within the timeout,
  /// skipping any replies before that.
  bool closed_by_server() {
    std::uint8_t b[4096];
    for (;;) {
      const ssize_t r = ::recv(fd.get(), b, sizeof b, 0);
      if (r == 0) return true;
      if (r < 0) return errno == ECONNRESET;
    }
  }
};

/// A request frame built by `fill`.
template <class F>
std::vector<std::uint8_t> frame(F fill) {
  cg::detail::byte_writer w(true);
  fill(w);
  return std::move(w).finish();
}

std::vector<std::uint8_t> hello_frame(std::uint32_t world_size,
                                      std::uint32_t version = cg::detail::tcp_store_protocol_version,
                                      std::uint32_t magic = cg::detail::tcp_store_magic) {
  return frame([&](cg::detail::byte_writer& w) {
    w.u8(static_cast<std::uint8_t>(cg::detail::tcp_cmd::hello));
    w.u32(magic);
    w.u32(version);
    w.u32(world_size);
  });
}

std::vector<std::uint8_t> set_frame(const std::string& key, const std::vector<std::uint8_t>& value) {
  return frame([&](cg::detail::byte_writer& w) {
    w.u8(static_cast<std::uint8_t>(cg::detail::tcp_cmd::set));
    w.str(key);
    w.bytes(value);
  });
}

std::vector<std::uint8_t> get_frame(const std::string& key, std::uint64_t timeout_ms) {
  return frame([&](cg::detail::byte_writer& w) {
    w.u8(static_cast<std::uint8_t>(cg::detail::tcp_cmd::get));
    w.u64(timeout_ms);
    w.str(key);
  });
}

std::vector<std::uint8_t> keys_frame(cg::detail::tcp_cmd cmd, const std::vector<std::string>& keys,
                                     std::uint64_t timeout_ms = 0) {
  return frame([&](cg::detail::byte_writer& w) {
    w.u8(static_cast<std::uint8_t>(cmd));
    if (cmd == cg::detail::tcp_cmd::wait) w.u64(timeout_ms);
    w.u32(static_cast<std::uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
  });
}

/// A reply's status byte and, for failed/rejected, its message.
std::pair<cg::detail::tcp_status, std::string> status_of(const std::vector<std::uint8_t>& reply) {
  cg::detail::byte_reader rd(reply);
  const auto s = static_cast<cg::detail::tcp_status>(rd.u8());
  if (s == cg::detail::tcp_status::failed || s == cg::detail::tcp_status::rejected)
    return {s, rd.str()};
  return {s, ""};
}

/// A connection that said a correct hello to a server of `world_size` ranks.
raw_conn greeted(int port, std::uint32_t world_size) {
  raw_conn c(port);
  REQUIRE(c.connected);
  REQUIRE(c.send(hello_frame(world_size)));
  const auto r = c.recv_frame();
  REQUIRE(r.has_value());
  REQUIRE(status_of(*r).first == cg::detail::tcp_status::ok);
  return c;
}

/// The server's statistics once `pred` holds of them (the server publishes them once per
/// turn of its loop), or after 5 s.
template <class P>
cg::tcp_store_stats stats_when(const cg::tcp_store& server, P pred) {
  const auto t0 = clock_type::now();
  cg::tcp_store_stats s = *server.server_stats();
  while (!pred(s) && seconds_since(t0) < 5.0) {
    std::this_thread::sleep_for(milliseconds(2));
    s = *server.server_stats();
  }
  return s;
}

/// Whether this machine has IPv6 loopback: an IPv6 socket binds to ::1. The IPv6 cases are
/// skipped without it.
bool has_ipv6_loopback() {
  cg::detail::unique_fd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  return ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
}

/// How listen_address() begins for a server on every interface: "[::]:", dual-stack, where
/// this machine makes dual-stack IPv6 sockets, else "0.0.0.0:" (what the server falls back to).
std::string every_interface() {
  cg::detail::unique_fd fd(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  int zero = 0;
  const bool dual = fd && ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0;
  return dual ? "[::]:" : "0.0.0.0:";
}

}  // namespace

TEST_CASE("store.tcp.listens_where_master_addr_points") {
  // Loopback stays loopback: a server for 127.0.0.2 is not reachable at 127.0.0.1.
  {
    cg::tcp_store server("127.0.0.2", 0, true, 2, long_timeout);
    CHECK(server.listen_address() == "127.0.0.2:" + std::to_string(server.port()));
    raw_conn elsewhere(server.port(), "127.0.0.1");
    CHECK_FALSE(elsewhere.connected);
    CHECK(elsewhere.connect_errno == ECONNREFUSED);
    cg::tcp_store client("127.0.0.2", server.port(), false, 2, long_timeout);
    client.set("k", bytes("v"));
    CHECK(text(server.get("k")) == "v");
    CHECK_FALSE(client.server_stats().has_value());
    CHECK(client.listen_address().empty());
  }
  {
    cg::tcp_store server("127.0.0.1", 0, true, 1, long_timeout);
    CHECK(server.listen_address() == "127.0.0.1:" + std::to_string(server.port()));
    // An address of another interface of this machine, when it has one, is refused too.
    ifaddrs* ifs = nullptr;
    if (::getifaddrs(&ifs) == 0) {
      for (const ifaddrs* i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        const auto& a = *reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
        if ((ntohl(a.sin_addr.s_addr) >> 24) == 127) continue;
        const std::string host = cg::detail::address_host(*i->ifa_addr);
        CAPTURE(host);
        raw_conn other(server.port(), host.c_str());
        CHECK_FALSE(other.connected);
      }
      ::freeifaddrs(ifs);
    }
  }
  {
    // Every interface, when asked for.
    cg::tcp_store_options opt;
    opt.timeout = long_timeout;
    opt.bind_all_interfaces = true;
    cg::tcp_store server("127.0.0.2", 0, true, 2, opt);
    CHECK(server.listen_address() == every_interface() + std::to_string(server.port()));
    cg::tcp_store a("127.0.0.1", server.port(), false, 2, long_timeout);
    cg::tcp_store b("127.0.0.2", server.port(), false, 2, long_timeout);
    a.set("k", bytes("v"));
    CHECK(text(b.get("k")) == "v");
  }
  // An address that is not this machine's: the error says what to do.
  const std::string m = error_of<cg::error>([] { cg::tcp_store("192.0.2.1", 0, true, 1, long_timeout); });
  CHECK(contains(m, "192.0.2.1"));
  CHECK(contains(m, "CCGRAPH_STORE_BIND=all"));
}

TEST_CASE("store.tcp.ipv6_loopback_plain_and_bracketed") {
  if (!has_ipv6_loopback()) {
    MESSAGE("skipped: this machine has no IPv6 loopback (::1)");
    return;
  }
  for (const std::string host : {"::1", "[::1]"}) {
    CAPTURE(host);
    auto server = std::make_shared<cg::tcp_store>(host, 0, true, 3, long_timeout);
    const std::string endpoint = "[::1]:" + std::to_string(server->port());
    CHECK(server->host() == host);  // as given
    CHECK(server->listen_address() == endpoint);
    CHECK(server->describe() == endpoint);
    // Loopback stays loopback of its family: IPv4's does not reach it.
    raw_conn v4(server->port(), "127.0.0.1");
    CHECK_FALSE(v4.connected);
    exercise_store(3, [&](int i) -> std::shared_ptr<cg::store> {
      if (i == 0) return server;
      auto client = std::make_shared<cg::tcp_store>(host, server->port(), false, 3, long_timeout);
      CHECK(client->describe() == endpoint);
      return client;
    });
    // A rank with another world size: messages name IPv6 endpoints in brackets.
    const std::string m =
        error_of<cg::error>([&] { cg::tcp_store(host, server->port(), false, 2, long_timeout); });
    CHECK_MESSAGE(contains(m, "the store at " + endpoint + " refused this rank"), m);
    const std::string poisoned = error_of<cg::error>([&] { server->get("key/0"); });
    CHECK_MESSAGE(contains(poisoned, "a rank from [::1]:"), poisoned);
  }
  // MASTER_ADDR in brackets, the way torchrun writes it, through the launcher's path.
  env_guard env({{"CCGRAPH_STORE_FILE", std::nullopt}, {"CCGRAPH_STORE_BIND", std::nullopt}});
  cg::env_config c = cg::env_config::from_env([](const char* name) -> std::optional<std::string> {
    if (std::string(name) == "RANK") return "0";
    if (std::string(name) == "WORLD_SIZE") return "1";
    if (std::string(name) == "MASTER_ADDR") return "[::1]";
    return std::nullopt;
  });
  CHECK(c.master_addr == "[::1]");
  c.master_port = unused_port();
  auto s = cg::make_store_from_env(c);
  CHECK(s->describe() == "[::1]:" + std::to_string(c.master_port));
  CHECK(dynamic_cast<cg::tcp_store&>(*s).listen_address() ==
        "[::1]:" + std::to_string(c.master_port));
  s->set("k", bytes("v"));
  CHECK(text(s->get("k")) == "v");
}

TEST_CASE("store.tcp.localhost_host_name") {
  // The server listens on the first address "localhost" resolves to (::1 or 127.0.0.1, as
  // this machine's resolver orders them); clients try each until one answers.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  REQUIRE(::getaddrinfo("localhost", nullptr, &hints, &found) == 0);
  const int first_family = found->ai_family;
  ::freeaddrinfo(found);
  if (first_family == AF_INET6 && !has_ipv6_loopback()) {
    MESSAGE("skipped: localhost resolves to ::1 first, and this machine has no IPv6 loopback");
    return;
  }
  auto server = std::make_shared<cg::tcp_store>("localhost", 0, true, 3, long_timeout);
  const std::string port = std::to_string(server->port());
  CHECK(server->describe() == "localhost:" + port);
  CHECK(server->listen_address() == (first_family == AF_INET6 ? "[::1]:" : "127.0.0.1:") + port);
  exercise_store(3, [&](int i) -> std::shared_ptr<cg::store> {
    if (i == 0) return server;
    return std::make_shared<cg::tcp_store>("localhost", server->port(), false, 3, long_timeout);
  });
}

TEST_CASE("store.tcp.bind_all_is_dual_stack") {
  if (!has_ipv6_loopback()) {
    MESSAGE("skipped: this machine has no IPv6 loopback (::1)");
    return;
  }
  cg::tcp_store_options opt;
  opt.timeout = long_timeout;
  opt.bind_all_interfaces = true;
  for (const std::string host : {"127.0.0.1", "::1"}) {
    CAPTURE(host);
    auto server = std::make_shared<cg::tcp_store>(host, 0, true, 4, opt);
    const int port = server->port();
    CHECK(server->listen_address() == "[::]:" + std::to_string(port));
    // One listening socket answers both families.
    const std::vector<std::string> clients = {"::1", "127.0.0.1", "[::1]"};
    exercise_store(4, [&](int i) -> std::shared_ptr<cg::store> {
      if (i == 0) return server;
      const std::string& client_host = clients[static_cast<std::size_t>(i - 1)];
      return std::make_shared<cg::tcp_store>(client_host, port, false, 4, long_timeout);
    });
    raw_conn v4(port, "127.0.0.1");
    CHECK(v4.connected);
    // An IPv4 peer of the dual-stack socket is named as IPv4, not as ::ffff:127.0.0.1.
    (void)error_of<cg::error>([&] { cg::tcp_store("127.0.0.1", port, false, 5, long_timeout); });
    const std::string m = error_of<cg::error>([&] { server->get("key/0"); });
    CHECK_MESSAGE(contains(m, "a rank from 127.0.0.1:"), m);
    CHECK_FALSE(contains(m, "ffff"));
  }
}

TEST_CASE("store.tcp.bad_host_is_an_error_naming_it") {
  // An IPv6 literal that does not parse fails at once, on the server and on a client (a host
  // name that does not resolve yet is retried: its record may not be published yet).
  for (const std::string host : {"::zz", "[::zz]", "fe80::1::2"}) {
    CAPTURE(host);
    for (const bool is_server : {true, false}) {
      const auto t0 = clock_type::now();
      const std::string m = error_of<cg::error>(
          [&] { cg::tcp_store(host, is_server ? 0 : 29500, is_server, 1, long_timeout); });
      CHECK(seconds_since(t0) < 5.0);
      CHECK_MESSAGE(contains(m, "host '" + host + "' (MASTER_ADDR) is not a valid IPv6 address"),
                    m);
    }
  }
  for (const std::string host : {"[::1", "::1]", "[]", "[::1]:29500"}) {
    CAPTURE(host);
    const std::string m = error_of<cg::error>([&] { cg::tcp_store(host, 0, true, 1, long_timeout); });
    CHECK_MESSAGE(contains(m, "host '" + host + "' (MASTER_ADDR)"), m);
  }
  CHECK(contains(error_of<cg::error>([] { cg::tcp_store("[::1", 0, true, 1, long_timeout); }),
                 "unmatched bracket"));
}

TEST_CASE("store.tcp.world_size_mismatch_is_an_error_on_both_sides") {
  cg::tcp_store server("127.0.0.1", 0, true, 2, long_timeout);
  const int port = server.port();
  cg::tcp_store peer("127.0.0.1", port, false, 2, long_timeout);
  // A rank blocked in a get learns it at once, not at its timeout.
  std::string blocked_error;
  std::thread t([&] { blocked_error = error_of<cg::error>([&] { peer.get("never/set"); }); });
  std::this_thread::sleep_for(milliseconds(100));
  const auto t0 = clock_type::now();
  std::string m = error_of<cg::error>([&] { cg::tcp_store("127.0.0.1", port, false, 3, long_timeout); });
  CHECK_MESSAGE(contains(m, "joins with world_size 3 but the store serves world_size 2"), m);
  CHECK(contains(m, "127.0.0.1:" + std::to_string(port)));
  t.join();
  CHECK(seconds_since(t0) < 5.0);
  CHECK_MESSAGE(contains(blocked_error, "joined with world_size 3 but this store serves world_size 2"),
                blocked_error);
  // The server's own rank, and every later request and rank, get the error.
  m = error_of<cg::error>([&] { server.set("k", bytes("v")); });
  CHECK_MESSAGE(contains(m, "joined with world_size 3 but this store serves world_size 2"), m);
  CHECK(contains(error_of<cg::error>([&] { cg::tcp_store("127.0.0.1", port, false, 2, long_timeout); }),
                 "world_size 3"));
  CHECK(contains(error_of<cg::error>([&] { cg::barrier(peer, "b", 1, 2); }), "world_size 3"));
}

TEST_CASE("store.tcp.protocol_errors_are_answered_and_the_connection_closed") {
  cg::tcp_store server("127.0.0.1", 0, true, 2, long_timeout);
  const int port = server.port();
  const auto expect_rejected = [&](const std::vector<std::uint8_t>& bytes_sent, bool hello_first,
                                   const std::string& expect) {
    CAPTURE(expect);
    raw_conn c = hello_first ? greeted(port, 2) : raw_conn(port);
    REQUIRE(c.connected);
    REQUIRE(c.send(bytes_sent));
    const auto r = c.recv_frame();
    REQUIRE(r.has_value());
    const auto [status, message] = status_of(*r);
    CHECK(status == cg::detail::tcp_status::rejected);
    CHECK_MESSAGE(contains(message, expect), message);
    CHECK(c.closed_by_server());
  };
  // Not a hello first (a version-1 client, or another program).
  expect_rejected(set_frame("k", bytes("v")), false, "first request on a connection must be a hello");
  expect_rejected(hello_frame(2, 2, 0x47455420), false, "is the peer a tcp_store client");
  expect_rejected(hello_frame(2, 1), false, "protocol version 1, this server version 2");
  expect_rejected(hello_frame(2), true, "a second hello");
  expect_rejected(frame([](cg::detail::byte_writer& w) { w.u8(99); }), true, "unknown command 99");
  expect_rejected(frame([](cg::detail::byte_writer& w) {
                    w.u8(static_cast<std::uint8_t>(cg::detail::tcp_cmd::set));
                    w.str("k");
                    w.str("v");
                    w.u8(0);  // one byte too many
                  }),
                  true, "unread bytes");
  expect_rejected(frame([](cg::detail::byte_writer& w) {
                    w.u8(static_cast<std::uint8_t>(cg::detail::tcp_cmd::set));
                    w.u32(1000);  // a key of 1000 bytes, of which 3 came
                    w.u8('a');
                    w.u8('b');
                    w.u8('c');
                  }),
                  true, "malformed message");
  expect_rejected({0, 0, 0, 0}, true, "request of 0 bytes");
  // A declared 2 GiB request is refused at its header: nothing of it is buffered.
  expect_rejected({0x7f, 0xff, 0xff, 0xff, 1, 2, 3}, true, "request of 2147483647 bytes is not allowed");
  const auto s = stats_when(server, [](const cg::tcp_store_stats& s) { return s.connections <= 1; });
  CHECK(s.dropped_connections == 9);
  CHECK(s.connections == 1);  // the server's own rank
  CHECK(s.peak_buffered_bytes < (std::size_t{1} << 20));
  // Well-behaved ranks are served as before.
  cg::tcp_store client("127.0.0.1", port, false, 2, long_timeout);
  client.set("still", bytes("here"));
  CHECK(text(server.get("still")) == "here");
}

TEST_CASE("store.tcp.limits_are_errors_and_the_connection_stays_usable") {
  cg::tcp_store_options opt;
  opt.timeout = long_timeout;
  opt.limits.max_key_bytes = 16;
  opt.limits.max_value_bytes = 100;
  opt.limits.max_keys_per_request = 4;
  opt.limits.max_table_bytes = 1000;
  cg::tcp_store server("127.0.0.1", 0, true, 2, opt);
  cg::tcp_store client("127.0.0.1", server.port(), false, 2, long_timeout);
  const std::string key17(17, 'k');
  std::string m = error_of<cg::error>([&] { client.set(key17, bytes("v")); });
  CHECK(contains(m, "tcp_store::set: key of 17 bytes is longer than the server's limit of 16 bytes"));
  CHECK(contains(error_of<cg::error>([&] { client.get(key17); }), "key of 17 bytes"));
  CHECK(contains(error_of<cg::error>([&] { client.add(key17, 1); }), "key of 17 bytes"));
  CHECK(contains(error_of<cg::error>([&] { client.check({"a", key17}); }), "key of 17 bytes"));
  m = error_of<cg::error>([&] { client.set("k", std::vector<std::uint8_t>(101)); });
  CHECK(contains(m, "value of 101 bytes is larger than the server's limit of 100 bytes"));
  m = error_of<cg::error>([&] { client.check({"a", "b", "c", "d", "e"}); });
  CHECK(contains(m, "tcp_store::check: 5 keys in one request, more than the server's limit of 4"));
  CHECK(contains(error_of<cg::error>([&] { client.wait({"a", "b", "c", "d", "e"}); }), "5 keys"));
  // The client's own limits hold before anything is sent.
  CHECK(contains(error_of<cg::error>([&] { client.set(std::string(70000, 'k'), {}); }),
                 "longer than the limit of 65536"));
  // The table: 1000 bytes of keys and values.
  for (int i = 0; i < 9; ++i) client.set("key" + std::to_string(i), std::vector<std::uint8_t>(100));
  m = error_of<cg::error>([&] { client.set("key9", std::vector<std::uint8_t>(100)); });
  CHECK(contains(m, "the server's table would hold 1040 bytes, more than its limit of 1000 bytes"));
  client.set("key0", std::vector<std::uint8_t>(10));  // replacing frees room
  client.set("key9", std::vector<std::uint8_t>(50));
  CHECK(client.get("key9").size() == 50);
  CHECK(client.check({"key0", "key9"}));
  // Every refusal kept the connection in step: one connection did all of this.
  const auto s = *server.server_stats();
  CHECK(s.refused_requests == 8);
  CHECK(s.dropped_connections == 0);
  CHECK(s.connections == 2);
  CHECK(s.table_bytes <= 1000);
  // Limits clients check before sending may be lowered, not raised.
  opt.limits = {};
  opt.limits.max_value_bytes = cg::detail::store_max_value_bytes + 1;
  CHECK(contains(error_of<cg::error>([&] { cg::tcp_store("127.0.0.1", 0, true, 1, opt); }),
                 "may be lowered, not raised"));
  opt.limits = {};
  opt.limits.max_connections = 0;
  CHECK(contains(error_of<cg::error>([&] { cg::tcp_store("127.0.0.1", 0, true, 1, opt); }),
                 "max_connections (0)"));
}

TEST_CASE("store.tcp.check_of_many_empty_keys_is_bounded") {
  // 65536 empty keys are 256 KiB on the wire; the server looks them up where they lie (it used
  // to make a std::string of each, ~11x the request), and more are refused.
  cg::tcp_store server("127.0.0.1", 0, true, 1, long_timeout);
  raw_conn c = greeted(server.port(), 1);
  const std::vector<std::string> many(cg::detail::store_max_keys_per_request);
  REQUIRE(c.send(keys_frame(cg::detail::tcp_cmd::check, many)));
  auto r = c.recv_frame();
  REQUIRE(r.has_value());
  CHECK(status_of(*r).first == cg::detail::tcp_status::ok);
  CHECK(r->at(1) == 0);  // "" is not set
  std::vector<std::string> too_many = many;
  too_many.emplace_back();
  REQUIRE(c.send(keys_frame(cg::detail::tcp_cmd::check, too_many)));
  r = c.recv_frame();
  REQUIRE(r.has_value());
  CHECK(contains(status_of(*r).second, "65537 keys in one request"));
  server.set("", {});
  REQUIRE(c.send(keys_frame(cg::detail::tcp_cmd::check, many)));
  r = c.recv_frame();
  REQUIRE(r.has_value());
  CHECK(r->at(1) == 1);
  const auto s = *server.server_stats();
  CHECK(s.peak_buffered_bytes < 2 * 4 * many.size() + (std::size_t{128} << 10));
}

TEST_CASE("store.tcp.peer_buffering_is_bounded") {
  cg::tcp_store_options opt;
  opt.timeout = long_timeout;
  opt.limits.max_key_bytes = 256;
  opt.limits.max_value_bytes = 4096;
  cg::tcp_store server("127.0.0.1", 0, true, 2, opt);
  const int port = server.port();
  const std::size_t bound = 2 * cg::detail::tcp_free_bytes_per_connection;
  // Behind a blocked get a peer sends without end: the server reads at most one request's
  // worth and leaves the rest to TCP (it used to buffer it all).
  raw_conn blocked = greeted(port, 2);
  REQUIRE(blocked.send(get_frame("late", 60000)));
  const std::vector<std::uint8_t> junk(std::size_t{1} << 20, 0x5a);
  std::size_t sent = 0;
  for (int idle = 0; idle < 100 && sent < (std::size_t{64} << 20);) {  // until 100 ms of no room
    const std::size_t n = blocked.send_now(junk);
    sent += n;
    idle = n ? 0 : idle + 1;
    if (n == 0) std::this_thread::sleep_for(milliseconds(1));
  }
  CHECK(sent < (std::size_t{64} << 20));  // TCP pushed back: the server stopped reading
  auto s = *server.server_stats();
  CHECK(s.buffered_bytes <= bound);
  // A peer that sends requests but never reads the replies: it is served one reply at a time.
  raw_conn deaf = greeted(port, 2);
  server.set("big", std::vector<std::uint8_t>(4096, 1));
  const auto get_big = get_frame("big", 0);
  std::vector<std::uint8_t> many_gets;  // 7.6 MB: more than TCP buffers between the two
  many_gets.reserve(400000 * get_big.size());
  for (int i = 0; i < 400000; ++i) many_gets.insert(many_gets.end(), get_big.begin(), get_big.end());
  sent = 0;
  for (int i = 0; i < 200 && sent < many_gets.size(); ++i) {
    sent += deaf.send_now(many_gets.data() + sent, many_gets.size() - sent);
    std::this_thread::sleep_for(milliseconds(1));
  }
  CHECK(sent < many_gets.size());  // TCP pushed back here too
  s = *server.server_stats();
  CHECK(s.buffered_bytes <= 2 * bound);
  CHECK(s.peak_buffered_bytes <= 2 * bound + (std::size_t{64} << 10));
  // The blocked get still gets its value, and then the junk behind it ends the connection.
  server.set("late", bytes("value"));
  const auto r = blocked.recv_frame();
  REQUIRE(r.has_value());
  CHECK(status_of(*r).first == cg::detail::tcp_status::ok);
  CHECK(blocked.closed_by_server());
}

TEST_CASE("store.tcp.buffer_budget_refuses_what_does_not_fit") {
  // No buffer beyond each connection's free 64 KiB: a 100 KiB value cannot be received.
  cg::tcp_store_options opt;
  opt.timeout = long_timeout;
  opt.limits.max_buffered_bytes = 0;
  cg::tcp_store server("127.0.0.1", 0, true, 2, opt);
  cg::tcp_store client("127.0.0.1", server.port(), false, 2, long_timeout);
  const std::string m =
      error_of<cg::error>([&] { client.set("big", std::vector<std::uint8_t>(100 << 10)); });
  CHECK_MESSAGE(contains(m, "out of buffer space"), m);
  // Small requests still get through, on a new connection.
  client.set("small", bytes("ok"));
  CHECK(text(server.get("small")) == "ok");
  CHECK_FALSE(client.check({"big"}));
}

TEST_CASE("store.tcp.connection_limit") {
  cg::tcp_store_options opt;
  opt.timeout = long_timeout;
  opt.limits.max_connections = 3;
  cg::tcp_store server("127.0.0.1", 0, true, 1, opt);  // its own rank holds one connection
  const int port = server.port();
  std::optional<raw_conn> a(greeted(port, 1));
  raw_conn b = greeted(port, 1);
  raw_conn c(port);
  REQUIRE(c.connected);  // the kernel accepts; the server then answers and closes
  c.send(hello_frame(1));
  const auto r = c.recv_frame();
  if (r) {
    const auto [status, message] = status_of(*r);
    CHECK(status == cg::detail::tcp_status::rejected);
    CHECK(contains(message, "the server has 3 connections, its limit"));
  }
  CHECK(c.closed_by_server());
  CHECK(stats_when(server, [](const auto& s) { return s.dropped_connections >= 1; }).dropped_connections == 1);
  a.reset();
  stats_when(server, [](const auto& s) { return s.connections <= 2; });
  cg::tcp_store client("127.0.0.1", port, false, 1, long_timeout);
  client.set("k", bytes("v"));
  CHECK(text(server.get("k")) == "v");
}

namespace {

/// This process's CPU time (every thread), in seconds.
double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

TEST_CASE("store.tcp.out_of_descriptors_does_not_spin") {
  // accept() failing with EMFILE leaves the connection pending, so poll() reports it again at
  // once: the server used to spin at full CPU until a descriptor came free.
  cg::tcp_store server("127.0.0.1", 0, true, 1, long_timeout);
  const int port = server.port();
  int highest = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd"))
    highest = std::max(highest, std::stoi(e.path().filename().string()));
  rlimit old{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(highest + 64);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> filler;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) filler.push_back(fd);
  REQUIRE(errno == EMFILE);
  ::close(filler.back());  // one descriptor for the connection below
  filler.pop_back();
  double cpu = 0;
  bool closed = false;
  {
    raw_conn c(port);
    REQUIRE(c.connected);  // the kernel completes it; the server cannot accept it
    const double cpu0 = cpu_seconds();
    const auto t0 = clock_type::now();
    closed = c.closed_by_server();  // it takes the connection on its reserve descriptor, closes it
    std::this_thread::sleep_for(milliseconds(500) - (clock_type::now() - t0));
    cpu = cpu_seconds() - cpu0;
  }
  for (int fd : filler) ::close(fd);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK(closed);
  CHECK_MESSAGE(cpu < 0.25, "CPU seconds in 0.5 s: ", cpu);
  const auto s = *server.server_stats();
  CHECK(s.accept_errors >= 1);
  CHECK(s.dropped_connections >= 1);
  // With descriptors back, ranks connect as usual.
  cg::tcp_store client("127.0.0.1", port, false, 1, long_timeout);
  client.set("k", bytes("v"));
  CHECK(text(server.get("k")) == "v");
}

TEST_CASE("store.tcp.fuzz_the_wire_protocol") {
  // Random and mutated frames from 4 threads for 2 s (valid prefixes, bad lengths, truncated
  // frames, huge declared sizes, random bytes, slow writers, peers that never read), while a
  // well-behaved rank uses the store: it must be served correctly throughout and after, and
  // the server's buffers must stay within their bound.
  cg::tcp_store_options opt;
  opt.timeout = long_timeout;
  opt.limits.max_key_bytes = 256;
  opt.limits.max_value_bytes = 4096;
  opt.limits.max_keys_per_request = 64;
  opt.limits.max_connections = 64;
  opt.limits.max_buffered_bytes = std::size_t{256} << 10;
  opt.limits.max_table_bytes = std::size_t{16} << 20;
  cg::tcp_store server("127.0.0.1", 0, true, 2, opt);
  const int port = server.port();
  std::atomic<bool> stop{false};
  std::string good_error;
  int good_rounds = 0;
  std::thread good([&] {
    try {
      cg::tcp_store c("127.0.0.1", port, false, 2, long_timeout);
      for (int i = 0; !stop; ++i) {
        const std::string k = "good/" + std::to_string(i);
        c.set(k, bytes(std::to_string(i)));
        if (text(c.get(k)) != std::to_string(i)) throw std::runtime_error("wrong value of " + k);
        if (c.add("good/count", 1) != i + 1) throw std::runtime_error("wrong count at " + k);
        if (!c.check({k, "good/count"})) throw std::runtime_error("check failed at " + k);
        c.wait({k});
        ++good_rounds;
      }
    } catch (const std::exception& e) {
      good_error = e.what();
    }
  });
  const std::uint64_t seed = static_cast<std::uint64_t>(clock_type::now().time_since_epoch().count());
  INFO("seed ", seed);
  std::atomic<int> connections{0};
  std::vector<std::thread> fuzzers;
  for (int t = 0; t < 4; ++t) {
    fuzzers.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t));
      const auto pick = [&](std::uint64_t n) { return static_cast<std::size_t>(rng() % n); };
      const auto random_bytes = [&](std::size_t n) {
        std::vector<std::uint8_t> v(n);
        for (auto& b : v) b = static_cast<std::uint8_t>(rng());
        return v;
      };
      const auto key = [&] {
        if (pick(10) == 0) return std::string(257 + pick(40), 'x');  // over the limit
        return "k" + std::to_string(pick(16));
      };
      const auto request = [&]() -> std::vector<std::uint8_t> {
        switch (pick(5)) {
          case 0: return set_frame(key(), random_bytes(pick(10) == 0 ? 4097 + pick(100) : pick(300)));
          case 1: return get_frame(key(), pick(20));
          case 2:
            return frame([&](cg::detail::byte_writer& w) {
              w.u8(static_cast<std::uint8_t>(cg::detail::tcp_cmd::add));
              w.str("n" + std::to_string(pick(4)));
              w.i64(static_cast<std::int64_t>(pick(5)) - 2);
            });
          default: {
            std::vector<std::string> keys(pick(70));
            for (auto& k : keys) k = key();
            return keys_frame(pick(2) ? cg::detail::tcp_cmd::check : cg::detail::tcp_cmd::wait, keys,
                              pick(20));
          }
        }
      };
      const auto mutate = [&](std::vector<std::uint8_t> f) {
        for (std::size_t m = 0, n = 1 + pick(4); m < n && !f.empty(); ++m) {
          switch (pick(5)) {
            case 0: f[pick(f.size())] ^= static_cast<std::uint8_t>(1u << pick(8)); break;
            case 1: f[pick(f.size())] = static_cast<std::uint8_t>(rng()); break;
            case 2: f.resize(pick(f.size())); break;  // truncated
            case 3: {
              const auto more = random_bytes(pick(64));
              f.insert(f.end(), more.begin(), more.end());
              break;
            }
            default:
              if (f.size() >= 4) {  // another declared length
                const std::uint32_t len = static_cast<std::uint32_t>(rng());
                for (int i = 0; i < 4; ++i) f[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(len >> (24 - 8 * i));
              }
          }
        }
        return f;
      };
      const auto t0 = clock_type::now();
      while (seconds_since(t0) < 2.0) {
        raw_conn c(port, "127.0.0.1", 20);
        if (!c.connected) continue;
        ++connections;
        const bool hello = pick(8) != 0;
        if (hello && (!c.send(hello_frame(2)) || !c.recv_frame())) continue;
        switch (pick(8)) {
          case 0:  // random bytes
            c.send(random_bytes(1 + pick(3000)));
            c.recv_frame();
            break;
          case 1:  // a well-formed conversation with random content
            for (std::size_t i = 0, n = 1 + pick(8); i < n; ++i)
              if (!c.send(request()) || !c.recv_frame()) break;
            break;
          case 2:  // mutated requests
            for (std::size_t i = 0, n = 1 + pick(3); i < n; ++i)
              if (!c.send(mutate(request())) || !c.recv_frame()) break;
            break;
          case 3: {  // a huge declared size, then a little
            const std::uint32_t len = static_cast<std::uint32_t>(5000 + pick(0xffff0000u));
            std::vector<std::uint8_t> f{static_cast<std::uint8_t>(len >> 24), static_cast<std::uint8_t>(len >> 16),
                                        static_cast<std::uint8_t>(len >> 8), static_cast<std::uint8_t>(len)};
            const auto more = random_bytes(pick(100));
            f.insert(f.end(), more.begin(), more.end());
            c.send(f);
            c.recv_frame();
            break;
          }
          case 4: {  // a slow writer (for up to 30 pieces) that may give up halfway
            const auto f = request();
            const std::size_t stop_at = pick(2) ? f.size() : pick(f.size());
            for (std::size_t off = 0, piece = 0; off < stop_at; ++piece) {
              const std::size_t n = piece < 30 ? std::min(stop_at - off, 1 + pick(3)) : stop_at - off;
              if (!c.send(std::vector<std::uint8_t>(f.begin() + static_cast<std::ptrdiff_t>(off),
                                                    f.begin() + static_cast<std::ptrdiff_t>(off + n))))
                break;
              off += n;
              std::this_thread::sleep_for(std::chrono::microseconds(200 + pick(2000)));
            }
            break;
          }
          case 5: {  // requests without reading the replies
            std::vector<std::uint8_t> all;
            for (int i = 0; i < 200; ++i) {
              const auto f = request();
              all.insert(all.end(), f.begin(), f.end());
            }
            c.send_now(all);
            break;
          }
          case 6:  // a blocked get, then junk behind it
            c.send(get_frame("never/" + std::to_string(pick(1000)), 50));
            c.send_now(random_bytes(std::size_t{64} << 10));
            break;
          default:  // a bad hello (never another world size: that ends the job, by design)
            c.send(hello_frame(2, pick(2) ? 1 : 3, pick(2) ? cg::detail::tcp_store_magic : 0x12345678));
            c.recv_frame();
        }
      }
    });
  }
  for (auto& f : fuzzers) f.join();
  stop = true;
  good.join();
  // Every fuzz connection is gone; a new rank is served correctly.
  const auto s = stats_when(server, [](const cg::tcp_store_stats& s) { return s.connections <= 2; });
  INFO("fuzz: ", connections.load(), " connections, ", good_rounds, " good rounds; server: ",
       s.dropped_connections, " dropped, ", s.refused_requests, " refused, peak buffered ",
       s.peak_buffered_bytes, " bytes");
  CHECK_MESSAGE(good_error.empty(), good_error);
  CHECK(good_rounds > 0);
  CHECK(s.connections <= 2);
  CHECK(s.peak_buffered_bytes <= opt.limits.max_buffered_bytes +
                                     opt.limits.max_connections * cg::detail::tcp_free_bytes_per_connection);
  CHECK(s.dropped_connections > 0);
  CHECK(s.refused_requests > 0);
  cg::tcp_store after("127.0.0.1", port, false, 2, long_timeout);
  after.set("after", bytes("fuzz"));
  CHECK(text(server.get("after")) == "fuzz");
  CHECK(after.add("good/count", 0) == good_rounds);
  CHECK(after.check({"after", "good/0"}));
  after.wait({"after"});
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

TEST_CASE("env_config.from_env.reads_mpi_and_slurm_launchers") {
  // mpirun (Open MPI): no RANK, its own variables.
  auto c = parse_env({{"OMPI_COMM_WORLD_RANK", "3"},
                      {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(c.launcher == "Open MPI");
  CHECK(c.rank == 3);
  CHECK(c.world_size == 4);
  CHECK(c.local_rank == 1);
  CHECK(c.local_world_size == 2);
  CHECK(c.master_addr == "127.0.0.1");
  // mpiexec (MPICH's Hydra, Intel MPI).
  c = parse_env({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "2"}, {"MPI_LOCALNRANKS", "3"},
                 {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "4000"}});
  CHECK(c.launcher == "MPICH");
  CHECK(c.rank == 2);
  CHECK(c.world_size == 3);
  CHECK(c.local_rank == 2);
  CHECK(c.master_addr == "10.0.0.1");
  CHECK(c.master_port == 4000);
  // srun: a plain tasks-per-node count is the local size; "2(x3)" (uneven nodes) is not used.
  c = parse_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                 {"SLURM_NTASKS_PER_NODE", "4"}});
  CHECK(c.launcher == "Slurm");
  CHECK(c.rank == 5);
  CHECK(c.local_rank == 1);
  CHECK(c.local_world_size == 4);
  c = parse_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                 {"SLURM_NTASKS_PER_NODE", "2(x4)"}});
  CHECK(c.local_world_size == 8);
  // RANK wins over MPI, and MPI over Slurm (mpirun inside an allocation).
  c = parse_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK(c.launcher == "torchrun");
  CHECK(c.rank == 1);
  c = parse_env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "1"}});
  CHECK(c.launcher == "Open MPI");
  CHECK(c.rank == 1);
  // Errors name the launcher's own variables.
  std::string m = env_error({{"OMPI_COMM_WORLD_RANK", "0"}});
  CHECK(contains(m, "OMPI_COMM_WORLD_SIZE is not set"));
  CHECK(contains(m, "the Open MPI variables OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE"));
  CHECK(contains(env_error({{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}}), "PMI_RANK='x' is not an integer"));
  CHECK(contains(env_error({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
                 "SLURM_PROCID=4 must be in [0, SLURM_NTASKS=4)"));
  CHECK(contains(env_error({}), "or under mpirun (Open MPI, MPICH) or srun (Slurm)"));
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
  {
    // Rank 0 listens where MASTER_ADDR points, or everywhere with CCGRAPH_STORE_BIND=all.
    cg::env_config c;
    c.master_port = unused_port();
    for (const auto& [bind, where] : {std::pair<std::optional<std::string>, std::string>{std::nullopt, "127.0.0.1:"},
                                      {"master_addr", "127.0.0.1:"},
                                      {"all", every_interface()}}) {
      env_guard env({{"CCGRAPH_STORE_FILE", std::nullopt}, {"CCGRAPH_STORE_BIND", bind}});
      auto server = cg::make_store_from_env(c);
      CHECK(dynamic_cast<cg::tcp_store&>(*server).listen_address() == where + std::to_string(c.master_port));
    }
    env_guard env({{"CCGRAPH_STORE_FILE", std::nullopt}, {"CCGRAPH_STORE_BIND", "0.0.0.0"}});
    CHECK(contains(error_of<cg::error>([&] { cg::make_store_from_env(c); }),
                   "CCGRAPH_STORE_BIND='0.0.0.0' is not one of master_addr, all"));
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
