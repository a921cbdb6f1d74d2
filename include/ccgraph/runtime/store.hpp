// ccgraph/runtime/store.hpp: rendezvous stores, the small key-value services through which the
// processes of one job find each other (the NCCL backend sends its unique id through one), the
// launcher's environment (RANK, WORLD_SIZE, ...) and a barrier. Host-only and POSIX (TCP sockets,
// poll, flock); no CUDA.
//
// The stores follow PyTorch's c10d:
//   tcp_store   rank 0 serves an in-memory table on a TCP port from a background thread; every
//               rank, rank 0 included, is a client of it.
//   file_store  one append-only file on a filesystem all ranks share, guarded by flock.
// Values are bytes. add() keeps a counter as its decimal text, so get() of a counter returns
// "3" and check()/wait() see it as set, as c10d's Store::add does.
//
// What the stores promise about bad input (README, "Reliability"): a tcp_store server listens
// only where MASTER_ADDR points unless told to listen everywhere, bounds what any peer can make
// it buffer or compute, answers a request that breaks a limit with an error and drops a peer
// that does not speak its protocol, and refuses a rank that joins with another world size; a
// file_store only ever modifies or removes a file that carries its header.
//
// The server is hand-written on poll() rather than Boost.Asio: this header is part of the host
// umbrella, and Asio would add seconds of compile time to every program including it, for a
// single-threaded loop of a few hundred lines whose limits Asio would not enforce anyway.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <ccgraph/core/log.hpp>
#include <ccgraph/core/env.hpp>
#include <ccgraph/core/error.hpp>
#include <ccgraph/core/timeout.hpp>

namespace ccgraph {

/// A key-value store shared by the ranks of one job, used to rendezvous: one rank sets a key
/// (an NCCL unique id, an address), the others get it. Keys are strings, values are bytes.
/// Blocking calls (get, wait) give up after timeout() with a timeout_error that names the keys,
/// the store and the timeout. Every member may be called from several threads at once.
class store {
 public:
  /// A store whose blocking calls wait at most `timeout` (positive; milliseconds::max() waits
  /// forever).
  explicit store(std::chrono::milliseconds timeout) : timeout_ms_(0) { set_timeout(timeout); }
  virtual ~store() = default;
  store(const store&) = delete;
  store& operator=(const store&) = delete;

  /// Sets `key` to `value`, replacing an earlier value, and wakes the ranks waiting for it.
  virtual void set(const std::string& key, const std::vector<std::uint8_t>& value) = 0;

  /// The value of `key`, once some rank has set it. Blocks until then; after timeout() throws
  /// timeout_error naming the key, the store and the timeout.
  virtual std::vector<std::uint8_t> get(const std::string& key) = 0;

  /// Whether every key of `keys` is set (true for none). Never blocks.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  /// Blocks until every key of `keys` is set; after timeout() throws timeout_error naming the
  /// keys still missing, the store and the timeout.
  virtual void wait(const std::vector<std::string>& keys) = 0;

  /// Atomically adds `delta` to the counter `key` (0 when unset) and returns the new value;
  /// add(key, 0) reads it. The counter is stored as its decimal text (c10d's Store::add), so
  /// adding to a key set() to anything else is an error naming the key.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;

  /// How errors name this store: "host:port" or the file's path.
  virtual std::string describe() const = 0;

  /// How long get() and wait() block (and, for tcp_store, how long connecting is retried).
  std::chrono::milliseconds timeout() const noexcept {
    return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed));
  }

  /// Changes the timeout of later calls (calls already blocked keep theirs); must be positive,
  /// and milliseconds::max() waits forever.
  void set_timeout(std::chrono::milliseconds timeout) {
    detail::check_timeout("store::set_timeout", timeout);
    // Atomic: one thread may change the timeout while others are in get().
    timeout_ms_.store(static_cast<std::int64_t>(timeout.count()), std::memory_order_relaxed);
  }

 private:
  std::atomic<std::int64_t> timeout_ms_;
};

namespace detail {

/// Longest key a store accepts (64 KiB: keys are names).
inline constexpr std::size_t store_max_key_bytes = std::size_t{1} << 16;
/// Largest value a store accepts (64 MiB: a rendezvous store passes ids and addresses).
inline constexpr std::size_t store_max_value_bytes = std::size_t{1} << 26;
/// Most keys one check() or wait() may name.
inline constexpr std::size_t store_max_keys_per_request = std::size_t{1} << 16;
/// Largest tcp_store message a server with the given key and value limits accepts: a set of
/// the longest key to the largest value, with room for the fields around them. A list of keys
/// (check, wait) must fit in it too.
constexpr std::size_t tcp_max_frame_bytes(std::size_t max_key_bytes, std::size_t max_value_bytes) {
  return max_key_bytes + max_value_bytes + 64;
}
/// The largest tcp_store message under the default limits.
inline constexpr std::size_t store_max_frame_bytes =
    tcp_max_frame_bytes(store_max_key_bytes, store_max_value_bytes);

/// The message of errno value `e` ("Connection refused"); thread-safe, unlike strerror.
inline std::string errno_message(int e) { return std::generic_category().message(e); }

/// An owned file descriptor (socket, pipe end, file): closed exactly once, when destroyed or
/// reset, so that no error path leaks one.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  /// The descriptor, or -1.
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Closes the descriptor now (close() is not retried on EINTR: on Linux the fd is gone).
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// "'a', 'b'": how messages list keys.
inline std::string quote_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) {
    if (!s.empty()) s += ", ";
    s += '\'';
    s += k;
    s += '\'';
  }
  return s;
}

/// Checks a key and value against the limits every store shares; `call` names the caller.
inline void check_store_entry(const char* call, const std::string& key, std::size_t value_size) {
  CCGRAPH_CHECK(key.size() <= store_max_key_bytes, call, ": key of ", key.size(),
                " bytes is longer than the limit of ", store_max_key_bytes, " bytes");
  CCGRAPH_CHECK(value_size <= store_max_value_bytes, call, ": value of key '", key, "' is ",
                value_size, " bytes, more than the limit of ", store_max_value_bytes, " bytes");
}

/// The counter add(key, delta) makes of `current` (the key's value, or null when unset).
/// Throws error (without a call prefix: callers add theirs) when the value is not a decimal
/// integer or the sum overflows.
inline std::int64_t counter_add(const std::string& key, const std::vector<std::uint8_t>* current,
                                std::int64_t delta) {
  std::int64_t value = 0;
  if (current) {
    const char* first = reinterpret_cast<const char*>(current->data());
    const char* last = first + current->size();
    const auto [end, ec] = std::from_chars(first, last, value);
    if (current->empty() || ec != std::errc() || end != last)
      CCGRAPH_THROW(error, "key '", key, "' holds a value of ", current->size(),
                    " bytes that is not a decimal integer, so it is not a counter");
  }
  constexpr std::int64_t hi = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t lo = std::numeric_limits<std::int64_t>::min();
  if ((delta > 0 && value > hi - delta) || (delta < 0 && value < lo - delta))
    CCGRAPH_THROW(error, "key '", key, "': ", value, " + ", delta, " overflows int64");
  return value + delta;
}

/// The decimal text of a counter, as stored.
inline std::vector<std::uint8_t> counter_bytes(std::int64_t v) {
  const std::string s = std::to_string(v);
  return {s.begin(), s.end()};
}

/// Builds one message: big-endian integers, and strings/bytes as a u32 length then the data.
/// A framed writer starts with room for the u32 payload length that finish() fills in.
class byte_writer {
 public:
  explicit byte_writer(bool framed) {
    if (framed) buf_.resize(4);
    framed_ = framed;
  }
  void u8(std::uint8_t v) { buf_.push_back(v); }
  void u32(std::uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) buf_.push_back(static_cast<std::uint8_t>(v >> s));
  }
  void u64(std::uint64_t v) {
    for (int s = 56; s >= 0; s -= 8) buf_.push_back(static_cast<std::uint8_t>(v >> s));
  }
  void i64(std::int64_t v) { u64(static_cast<std::uint64_t>(v)); }
  void bytes(const void* p, std::size_t n) {
    u32(static_cast<std::uint32_t>(n));  // callers checked n against the store limits
    const auto* b = static_cast<const std::uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  void str(std::string_view s) { bytes(s.data(), s.size()); }
  void bytes(const std::vector<std::uint8_t>& v) { bytes(v.data(), v.size()); }
  /// Bytes already in the wire format (a list of keys copied from a request).
  void raw(const std::uint8_t* p, std::size_t n) { buf_.insert(buf_.end(), p, p + n); }
  /// Room for `n` more bytes at once (a large reply is then allocated exactly once).
  void reserve(std::size_t n) { buf_.reserve(buf_.size() + n); }

  /// The message; a framed one gets its payload length in its first four bytes.
  std::vector<std::uint8_t> finish() && {
    if (framed_) {
      const std::size_t n = buf_.size() - 4;
      CCGRAPH_CHECK(n <= store_max_frame_bytes, "tcp_store: message of ", n,
                    " bytes is larger than the protocol's limit of ", store_max_frame_bytes);
      for (int i = 0; i < 4; ++i)
        buf_[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (24 - 8 * i));
    }
    return std::move(buf_);
  }

 private:
  std::vector<std::uint8_t> buf_;
  bool framed_ = false;
};

/// The u32 at `p`, big-endian.
inline std::uint32_t load_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

/// Reads what byte_writer wrote from one complete message; a message too short for what it
/// claims to hold is an error (the peer is not speaking this protocol).
class byte_reader {
 public:
  byte_reader(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  explicit byte_reader(const std::vector<std::uint8_t>& v) : byte_reader(v.data(), v.size()) {}

  std::uint8_t u8() {
    need(1);
    return p_[pos_++];
  }
  std::uint32_t u32() {
    need(4);
    const std::uint32_t v = load_u32(p_ + pos_);
    pos_ += 4;
    return v;
  }
  std::uint64_t u64() {
    const std::uint64_t hi = u32();
    return (hi << 32) | u32();
  }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  std::string str() {
    const std::size_t n = u32();
    need(n);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }
  std::vector<std::uint8_t> bytes() {
    const std::size_t n = u32();
    need(n);
    std::vector<std::uint8_t> v(p_ + pos_, p_ + pos_ + n);
    pos_ += n;
    return v;
  }
  /// A string field, not copied: valid while the message is.
  std::string_view view() {
    const std::size_t n = u32();
    need(n);
    const std::string_view s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }
  /// Where the next field starts, and the message.
  std::size_t pos() const noexcept { return pos_; }
  const std::uint8_t* data() const noexcept { return p_; }
  /// Errors unless every byte was read: a request with trailing bytes is not ours either.
  void expect_end() const {
    if (pos_ != n_)
      CCGRAPH_THROW(error, "tcp_store: malformed message: ", n_ - pos_,
                    " unread bytes at its end (offset ", pos_, ")");
  }
  /// `count` strings, each read (and bounds-checked) before the next is allocated.
  std::vector<std::string> strs(std::size_t count) {
    std::vector<std::string> v;
    for (std::size_t i = 0; i < count; ++i) v.push_back(str());
    return v;
  }

 private:
  void need(std::size_t k) const {
    if (n_ - pos_ < k)
      CCGRAPH_THROW(error, "tcp_store: malformed message: a field of ", k, " bytes at offset ",
                    pos_, " runs past the message's ", n_, " bytes");
  }
  const std::uint8_t* p_;
  std::size_t n_;
  std::size_t pos_ = 0;
};

// The tcp_store protocol, version 2. Every message is a frame: a big-endian u32 payload length,
// then the payload. A request's payload is a command byte and its fields; a reply's is a status
// byte and its fields. One connection carries one request at a time (the client pools
// connections), and its first request is a hello:
//
//   hello  magic:u32 version:u32 world_size:u32 -> ok version:u32 world_size:u32 | rejected msg:str
//   set    key:str value:bytes              -> ok | failed message:str
//   get    timeout_ms:u64 key:str           -> ok value:bytes | timed_out | failed message:str
//   add    key:str delta:i64                -> ok value:i64 | failed message:str
//   check  n:u32 keys:str*n                 -> ok all_set:u8 | failed message:str
//   wait   timeout_ms:u64 n:u32 keys:str*n  -> ok | timed_out n:u32 missing:str*n | failed msg:str
//
// get and wait block on the server, which replies `timed_out` itself when the timeout passes,
// so the connection stays in step and can be reused; a timeout_ms of 2^63 - 1 or more waits
// forever. `failed` answers a request that breaks a limit (the connection stays usable);
// `rejected message:str` may answer any request, and then the server closes the connection
// (a peer that does not speak this protocol, a refused hello, a server out of resources).
// Version 1 had no hello.
enum class tcp_cmd : std::uint8_t { set = 1, get = 2, add = 3, check = 4, wait = 5, hello = 6 };
enum class tcp_status : std::uint8_t { ok = 0, timed_out = 1, failed = 2, rejected = 3 };
/// The hello's first field: "ccgs". Anything else is not a tcp_store client.
inline constexpr std::uint32_t tcp_store_magic = 0x63636773;
/// The protocol version this ccgraph speaks; a server and a client of another refuse each other.
inline constexpr std::uint32_t tcp_store_protocol_version = 2;

/// Sets TCP_NODELAY: requests and replies are small, and Nagle's algorithm with delayed acks
/// would add tens of milliseconds to each.
inline void set_nodelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Milliseconds from now until `deadline` for poll(): rounded up (so a wait never ends early),
/// 0 once passed, capped to what an int holds; -1 (no limit) for time_point::max(), a deadline
/// that waits forever.
inline int poll_ms_until(std::chrono::steady_clock::time_point deadline) {
  if (deadline == std::chrono::steady_clock::time_point::max()) return -1;
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<std::int64_t>(ms, std::numeric_limits<int>::max()));
}


/// The host of a socket address as text: "a.b.c.d", or an IPv6 address with its zone
/// ("fe80::1%eth0"). An IPv4-mapped IPv6 address (an IPv4 peer of a dual-stack socket) reads as
/// the IPv4 address it is.
inline std::string address_host(const sockaddr& a) {
  char buf[INET6_ADDRSTRLEN + 64] = {};  // room for a zone (an interface name) after the '%'
  if (a.sa_family == AF_INET6) {
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(a);
    if (IN6_IS_ADDR_V4MAPPED(&a6.sin6_addr))
      return ::inet_ntop(AF_INET, a6.sin6_addr.s6_addr + 12, buf, sizeof buf) ? buf : "?";
  } else if (a.sa_family != AF_INET) {
    return "?";
  }
  const socklen_t len = a.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  return ::getnameinfo(&a, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0 ? buf : "?";
}
inline std::string address_host(const sockaddr_storage& a) {
  return address_host(reinterpret_cast<const sockaddr&>(a));
}

/// The port of an IPv4 or IPv6 socket address.
inline int address_port(const sockaddr_storage& a) {
  return ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(a).sin6_port
                                       : reinterpret_cast<const sockaddr_in&>(a).sin_port);
}

/// "host:port", or "[host]:port" when the host is an IPv6 address (its colons would run into
/// the port's): how messages name an endpoint.
inline std::string endpoint_text(std::string_view host, int port) {
  return host.find(':') == std::string_view::npos ? concat(host, ":", port)
                                                  : concat("[", host, "]:", port);
}
inline std::string endpoint_text(const sockaddr_storage& a) {
  return endpoint_text(address_host(a), address_port(a));
}

/// "IPv4" or "IPv6": which family an address is, for messages.
inline const char* family_name(int family) { return family == AF_INET6 ? "IPv6" : "IPv4"; }

/// Bytes of buffers every connection may hold without drawing on
/// tcp_store_limits::max_buffered_bytes: small requests always get through.
inline constexpr std::size_t tcp_free_bytes_per_connection = std::size_t{64} << 10;

}  // namespace detail

/// What a tcp_store server accepts from its peers: bounds on what any client, well-behaved or
/// not, can make it store, buffer or compute. A request that breaks a limit is answered with an
/// error naming it (the client's call throws it) and the connection stays usable; a peer that
/// does not speak the protocol, or needs more buffer than is left, gets an error and is
/// disconnected. The key, value and keys-per-request limits may be lowered, not raised (clients
/// check the defaults before sending).
struct tcp_store_limits {
  /// Longest key, in bytes.
  std::size_t max_key_bytes = detail::store_max_key_bytes;
  /// Largest value, in bytes; with max_key_bytes it bounds a request's size.
  std::size_t max_value_bytes = detail::store_max_value_bytes;
  /// Most keys one check or wait may name.
  std::size_t max_keys_per_request = detail::store_max_keys_per_request;
  /// Most connections at once; one more is answered with an error and closed.
  std::size_t max_connections = 16384;
  /// Bytes of buffers (requests being received, replies being sent, keys of blocked waits) the
  /// server holds for all connections together, beyond the first 64 KiB of each. A connection
  /// that needs more than is left is answered with an error and closed, and a reply that does
  /// not fit is replaced by an error. Peak memory for connections is at most this plus
  /// max_connections x 64 KiB.
  std::size_t max_buffered_bytes = std::size_t{1} << 30;
  /// Bytes of keys and values the table may hold; a set or add beyond it fails.
  std::size_t max_table_bytes = std::size_t{1} << 30;
};

/// Settings of a tcp_store.
struct tcp_store_options {
  /// How long get(), wait() and connecting block: positive, milliseconds::max() waits forever.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  /// On the server: how long its destruction keeps serving the ranks still connected (>= 0).
  std::chrono::milliseconds shutdown_grace = std::chrono::seconds(10);
  /// On the server: listen on every interface (::, dual-stack, so IPv4 peers reach it too; or
  /// 0.0.0.0 where this machine has no IPv6) instead of only on the address `host` resolves
  /// to. make_store_from_env sets it for CCGRAPH_STORE_BIND=all.
  bool bind_all_interfaces = false;
  /// On the server: what it accepts from its peers.
  tcp_store_limits limits{};
};

/// What a tcp_store server holds and has refused: for monitoring, and for tests of its bounds.
struct tcp_store_stats {
  std::size_t connections = 0;          ///< clients connected now
  std::size_t buffered_bytes = 0;       ///< bytes of buffers held for the connections now
  std::size_t peak_buffered_bytes = 0;  ///< the most buffered_bytes has been
  std::size_t table_bytes = 0;          ///< bytes of keys and values stored
  std::size_t refused_requests = 0;     ///< requests answered with an error for breaking a limit
  std::size_t dropped_connections = 0;  ///< connections closed for a protocol error or a limit
  std::size_t accept_errors = 0;        ///< accept() failures (out of descriptors or memory)
};

namespace detail {

/// The tcp_store server: an in-memory table served to many clients by one background thread
/// that poll()s the listening socket, every client socket and a wake-up pipe. All its state but
/// the pipe's write end and the published statistics belongs to that thread, so nothing is
/// locked.
///
/// What a peer can make it do is bounded (tcp_store_limits): a request is read only up to the
/// frame limit, a connection's next request only once its last reply is sent (a client that
/// does not read its replies stops being read, and TCP holds the rest), the keys of a check are
/// looked up where they lie in the request, those of a blocked wait are kept as they came, and
/// each is looked up once for the whole wait (keys are never removed).
class tcp_store_server {
 public:
  /// Listens at `bind_addr` (port 0: a free port the kernel picks) and starts the serving
  /// thread. The IPv6 wildcard (::) listens dual-stack, on IPv6 and IPv4 alike; where this
  /// machine has no IPv6 sockets it becomes the IPv4 wildcard (0.0.0.0). Throws error naming
  /// the address and its family when it cannot be bound. `world_size` is what every client's
  /// hello must say. `shutdown_grace` bounds how long the destructor keeps serving connected
  /// clients.
  tcp_store_server(const sockaddr_storage& bind_addr, int world_size,
                   const tcp_store_limits& limits, std::chrono::milliseconds shutdown_grace)
      : grace_(shutdown_grace),
        world_size_(static_cast<std::uint32_t>(world_size)),
        limits_(limits),
        max_frame_(tcp_max_frame_bytes(limits.max_key_bytes, limits.max_value_bytes)),
        addr_(bind_addr) {
    listen_ = open_listener(addr_);
    const std::string where = concat("port ", address_port(addr_), " of ", address_host(addr_),
                                     " (", family_name(addr_.ss_family), ")");
    if (!listen_)
      CCGRAPH_THROW(error, "tcp_store: socket() for the server on ", where,
                    " failed: ", errno_message(errno));
    // A restarted job can bind its port again while the last job's connections sit in
    // TIME_WAIT.
    int one = 1;
    (void)::setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const socklen_t addr_len =
        addr_.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    if (::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&addr_), addr_len) != 0) {
      const int e = errno;
      CCGRAPH_THROW(error, "tcp_store: bind to ", where, " failed: ", errno_message(e),
                    e == EADDRINUSE ? " (another process uses it: pick another MASTER_PORT, or "
                                      "port 0 for a free one)"
                    : e == EADDRNOTAVAIL
                        ? " (MASTER_ADDR is not an address of this machine: run rank 0 where "
                          "MASTER_ADDR points, or set CCGRAPH_STORE_BIND=all to listen on every "
                          "interface)"
                    : e == EINVAL && addr_.ss_family == AF_INET6
                        ? " (a link-local IPv6 address needs its interface: fe80::1%eth0)"
                        : "");
    }
    if (::listen(listen_.get(), SOMAXCONN) != 0)
      CCGRAPH_THROW(error, "tcp_store: listen on ", where, " failed: ", errno_message(errno));
    socklen_t len = sizeof addr_;
    if (::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&addr_), &len) != 0)
      CCGRAPH_THROW(error, "tcp_store: getsockname on ", where, " failed: ", errno_message(errno));
    // Spent when accept() runs out of descriptors (see shed_pending).
    reserve_ = unique_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    int p[2];
    if (::pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0)
      CCGRAPH_THROW(error, "tcp_store: pipe() for the server on ", where,
                    " failed: ", errno_message(errno));
    wake_rd_ = unique_fd(p[0]);
    wake_wr_ = unique_fd(p[1]);
    thread_ = std::thread([this] { run(); });
  }

  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;

  /// Stops taking new connections, then serves the connected clients until each has hung up,
  /// every one left is blocked in a get/wait that no one connected can release, or the grace
  /// passes; then closes every socket (a client still connected sees its connection close).
  /// Lingering matters at the end of a job: the server's rank may leave a barrier first, while
  /// a peer's request for the same barrier is still on its way, and must answer it.
  ~tcp_store_server() {
    const char b = 1;
    // One byte in an empty pipe cannot block; the thread wakes from poll() and starts to stop.
    while (::write(wake_wr_.get(), &b, 1) < 0 && errno == EINTR) {
    }
    if (thread_.joinable()) thread_.join();
  }

  /// The port it listens on (the real one when constructed with 0).
  int port() const noexcept { return address_port(addr_); }
  /// The address it listens on (:: or 0.0.0.0 for every interface).
  const sockaddr_storage& address() const noexcept { return addr_; }

  /// Its statistics, as of its last turn through the serving loop.
  tcp_store_stats stats() const {
    tcp_store_stats s;
    s.connections = stat_connections_.load(std::memory_order_relaxed);
    s.buffered_bytes = stat_buffered_.load(std::memory_order_relaxed);
    s.peak_buffered_bytes = stat_peak_.load(std::memory_order_relaxed);
    s.table_bytes = stat_table_.load(std::memory_order_relaxed);
    s.refused_requests = stat_refused_.load(std::memory_order_relaxed);
    s.dropped_connections = stat_dropped_.load(std::memory_order_relaxed);
    s.accept_errors = stat_accept_errors_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  using clock = std::chrono::steady_clock;

  /// One connected client: its socket, what it sent that is not handled yet, what it has yet
  /// to receive, and the get or wait it is blocked in, if any.
  struct client {
    explicit client(unique_fd f) : fd(std::move(f)) {}
    unique_fd fd;
    std::vector<std::uint8_t> in;  // received; its first in_pos bytes are handled
    std::size_t in_pos = 0;
    std::vector<std::uint8_t> out;  // to send; its first out_pos bytes are sent
    std::size_t out_pos = 0;
    std::size_t held = 0;     // capacity of the buffers above and wait_keys, as last accounted
    std::size_t charged = 0;  // the part of `held` beyond tcp_free_bytes_per_connection
    bool greeted = false;     // its hello was accepted
    bool hangup = false;      // close once `out` is sent (it broke the protocol)
    bool closed = false;
    bool waiting = false;
    tcp_cmd wait_cmd = tcp_cmd::wait;
    std::vector<std::uint8_t> wait_keys;  // the keys, as in the request: (u32 length, bytes)*
    std::size_t wait_next = 0;            // offset in wait_keys of the first key not yet set
    clock::time_point deadline{};
  };

  /// Heterogeneous lookup: keys in requests are looked up where they lie, without a copy.
  struct key_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };

  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      // poll() failing: stop serving. Closing every socket below makes each client's call
      // fail with "connection closed" instead of hanging until its timeout; the log says why.
      detail::log(log_level::error, "store", "the tcp_store server stops serving: ", e.what());
    } catch (...) {
      detail::log(log_level::error, "store", "the tcp_store server stops serving: unknown exception");
    }
    clients_.clear();
    listen_.reset();
  }

  void loop() {
    std::vector<pollfd> fds;
    bool stopping = false;  // the destructor asked: no new clients, serve the connected ones
    clock::time_point stop_by{};
    for (;;) {
      fds.clear();
      // While stopping, the wake-up pipe (still readable) and the closed listener are left
      // out; after accept() ran out of descriptors, the listener rests a moment.
      const bool listening = !stopping && clock::now() >= accept_resume_;
      if (!stopping) fds.push_back({wake_rd_.get(), POLLIN, 0});
      if (listening) fds.push_back({listen_.get(), POLLIN, 0});
      const std::size_t first_client = fds.size();
      for (const auto& c : clients_) fds.push_back({c->fd.get(), interest(*c), 0});
      if (::poll(fds.data(), fds.size(), next_deadline_ms(stopping, stop_by)) < 0) {
        if (errno == EINTR) continue;
        CCGRAPH_THROW(error, "tcp_store: poll() failed: ", errno_message(errno));
      }
      const bool accept = listening && (fds[1].revents & POLLIN);
      if (!stopping && fds[0].revents != 0) {
        // Requests that came with the stop are still read and answered below.
        stopping = true;
        stop_by = deadline_after(clock::now(), grace_);
        listen_.reset();  // refuses new connections from here on
      }
      const std::size_t polled = clients_.size();  // accept_some() appends after these
      for (std::size_t i = 0; i < polled; ++i) {
        const short re = fds[i + first_client].revents;
        client& c = *clients_[i];
        if (re & POLLIN) {
          read_from(c);  // to the end of the stream, if it ended: then the client is closed
        } else if (re & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
          c.closed = true;  // hung up while not being read
        }
        if ((re & POLLOUT) && !c.closed) flush(c);
      }
      if (accept && listen_) accept_some();
      serve_requests();
      expire_waits();
      for (auto& c : clients_)
        if (c->closed) forget(*c);
      std::erase_if(clients_, [](const std::unique_ptr<client>& c) { return c->closed; });
      publish_stats();
      if (stopping && (clock::now() >= stop_by || none_can_progress())) return;
    }
  }

  /// What poll() watches on a client: its hang-up always; input while its buffer has room (a
  /// request can be at most max_frame_ bytes; beyond that TCP holds what it sends); output
  /// while a reply is not sent.
  short interest(const client& c) const {
    short ev = POLLRDHUP;
    if (!c.hangup && c.in.size() - c.in_pos < in_cap()) ev = static_cast<short>(ev | POLLIN);
    if (c.out_pos < c.out.size()) ev = static_cast<short>(ev | POLLOUT);
    return ev;
  }

  /// The most unhandled input a connection may hold: one whole request.
  std::size_t in_cap() const noexcept { return max_frame_ + 4; }

  /// Whether no connected client can make progress: none is left, or each is blocked in a
  /// get/wait (new connections are refused, so no one could set their keys) with its reply
  /// sent.
  bool none_can_progress() const {
    return std::all_of(clients_.begin(), clients_.end(), [](const std::unique_ptr<client>& c) {
      return c->waiting && c->out_pos >= c->out.size();
    });
  }

  /// poll()'s timeout: until the earliest blocked get/wait times out, the grace ends (while
  /// stopping) or the listener may accept again, or forever (-1).
  int next_deadline_ms(bool stopping, clock::time_point stop_by) const {
    std::optional<clock::time_point> first;
    const auto consider = [&](clock::time_point t) {
      if (!first || t < *first) first = t;
    };
    if (stopping) consider(stop_by);
    if (!stopping && accept_resume_ > clock::now()) consider(accept_resume_);
    for (const auto& c : clients_)
      if (c->waiting && !c->closed) consider(c->deadline);
    return first ? poll_ms_until(*first) : -1;
  }

  /// Accepts the pending connections, at most 64 per turn so that a flood of them cannot
  /// starve the connected clients.
  void accept_some() {
    for (int k = 0; k < 64; ++k) {
      const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int e = errno;
        if (e == EINTR || e == ECONNABORTED) continue;
        if (e == EAGAIN || e == EWOULDBLOCK) return;
        ++accept_errors_;
        // Out of descriptors or memory: the connection stays pending, and poll() would report
        // it again at once, forever (a busy loop). Accept it on the reserve descriptor and
        // close it; when even that fails, stop listening for a moment.
        if ((e == EMFILE || e == ENFILE) && shed_pending()) continue;
        accept_resume_ = clock::now() + std::chrono::milliseconds(100);
        return;
      }
      unique_fd owned(fd);
      if (clients_.size() >= limits_.max_connections) {
        refuse_connection(fd, concat("tcp_store: the server has ", clients_.size(),
                                     " connections, its limit (tcp_store_limits::max_connections)"));
        continue;
      }
      set_nodelay(fd);
      clients_.push_back(std::make_unique<client>(std::move(owned)));
    }
  }

  /// Frees the reserve descriptor to accept one pending connection and close it. True when a
  /// connection was shed (or none was pending any more).
  bool shed_pending() {
    if (!reserve_) {
      reserve_ = unique_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      return false;
    }
    reserve_.reset();
    const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    const int e = errno;
    if (fd >= 0) {
      unique_fd owned(fd);
      refuse_connection(fd, "tcp_store: the server is out of file descriptors (see ulimit -n)");
    }
    reserve_ = unique_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return fd >= 0 || e == EAGAIN || e == EWOULDBLOCK;
  }

  /// Tells a connection it is refused (best effort: one non-blocking send) before it is closed.
  void refuse_connection(int fd, const std::string& why) {
    const std::vector<std::uint8_t> f = failed_frame(why, tcp_status::rejected);
    (void)::send(fd, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ++dropped_;
  }

  /// The bytes client `c`'s buffers may grow by before the connections together hold more than
  /// max_buffered_bytes beyond their free allowance.
  std::size_t room_for(const client& c) const noexcept {
    const std::size_t others = charged_ - c.charged;
    const std::size_t budget =
        limits_.max_buffered_bytes > others ? limits_.max_buffered_bytes - others : 0;
    const std::size_t allowed = tcp_free_bytes_per_connection + budget;
    return allowed > c.held ? allowed - c.held : 0;
  }

  /// Brings the totals up to date with `c`'s buffers; called after each change to them.
  void account(client& c) {
    const std::size_t held = c.in.capacity() + c.out.capacity() + c.wait_keys.capacity();
    const std::size_t charged =
        held > tcp_free_bytes_per_connection ? held - tcp_free_bytes_per_connection : 0;
    held_total_ = held_total_ - c.held + held;
    charged_ = charged_ - c.charged + charged;
    c.held = held;
    c.charged = charged;
    peak_held_ = std::max(peak_held_, held_total_);
  }

  /// Takes a closed client out of the totals.
  void forget(client& c) {
    held_total_ -= c.held;
    charged_ -= c.charged;
    c.held = c.charged = 0;
  }

  /// Frees a buffer that is done with, keeping a small one for the next request.
  static void release(std::vector<std::uint8_t>& v) {
    if (v.capacity() > tcp_free_bytes_per_connection) {
      std::vector<std::uint8_t>().swap(v);
    } else {
      v.clear();
    }
  }

  /// Reads what the socket has, up to one whole request beyond what is buffered (requests
  /// arrive in pieces: they wait in `in` until complete). End of stream or an error closes the
  /// client; needing more buffer than the limits leave closes it with an error.
  void read_from(client& c) {
    if (c.in_pos > 0) {
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_pos));
      c.in_pos = 0;
    }
    for (;;) {
      if (c.closed || c.hangup || c.in.size() >= in_cap()) break;
      std::size_t want = std::min<std::size_t>(in_cap() - c.in.size(), 65536);
      if (c.in.size() + want > c.in.capacity()) {
        // Grow geometrically, but only as far as the request needs and the budget allows.
        const std::size_t grown = std::max(c.in.size() + want, 2 * c.in.capacity());
        const std::size_t cap =
            std::min({grown, in_cap(), c.in.capacity() + room_for(c)});
        if (cap <= c.in.size()) {
          reject(c, concat("tcp_store: the server is out of buffer space (",
                           held_total_, " bytes held for ", clients_.size(),
                           " connections; tcp_store_limits::max_buffered_bytes is ",
                           limits_.max_buffered_bytes, ")"));
          break;
        }
        c.in.reserve(cap);
        account(c);
        want = std::min(want, cap - c.in.size());
      }
      const std::size_t old = c.in.size();
      c.in.resize(old + want);
      const ssize_t r = ::recv(c.fd.get(), c.in.data() + old, want, 0);
      c.in.resize(old + static_cast<std::size_t>(std::max<ssize_t>(r, 0)));
      if (r > 0) continue;
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c.closed = true;  // 0: the client hung up; otherwise a reset
      break;
    }
    account(c);
  }

  /// Sends what the socket takes now; the rest goes when poll() reports POLLOUT.
  void flush(client& c) {
    while (c.out_pos < c.out.size()) {
      const ssize_t r = ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos,
                               MSG_NOSIGNAL);  // a vanished client must not SIGPIPE the job
      if (r > 0) {
        c.out_pos += static_cast<std::size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return account(c);
      c.closed = true;
      return account(c);
    }
    release(c.out);
    c.out_pos = 0;
    if (c.hangup) c.closed = true;
    account(c);
  }

  /// Queues `frame` for `c` and sends what the socket takes. A reply the buffer budget cannot
  /// hold is replaced by an error saying so.
  void reply(client& c, std::vector<std::uint8_t> frame) {
    if (c.closed) return;
    if (frame.capacity() > room_for(c) && frame.size() > tcp_free_bytes_per_connection) {
      ++refused_;
      frame = failed_frame(concat("tcp_store: the server is out of buffer space for a reply of ",
                                  frame.size(), " bytes (tcp_store_limits::max_buffered_bytes is ",
                                  limits_.max_buffered_bytes, ")"));
    }
    if (c.out.empty()) {
      c.out = std::move(frame);
    } else {
      c.out.insert(c.out.end(), frame.begin(), frame.end());
    }
    flush(c);
  }

  static std::vector<std::uint8_t> status_frame(tcp_status s) {
    byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(s));
    return std::move(w).finish();
  }

  static std::vector<std::uint8_t> failed_frame(std::string_view message,
                                                tcp_status status = tcp_status::failed) {
    byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(status));
    w.str(message.substr(0, 4096));
    return std::move(w).finish();
  }

  /// Answers a request that breaks a limit; the connection stays in step.
  void refuse(client& c, std::string_view why) {
    ++refused_;
    reply(c, failed_frame(why));
  }

  /// Answers a peer that broke the protocol, then closes its connection once that is sent.
  void reject(client& c, std::string_view why) {
    if (c.hangup || c.closed) return;
    ++dropped_;
    c.waiting = false;
    release(c.wait_keys);
    c.hangup = true;
    reply(c, failed_frame(why, tcp_status::rejected));
  }

  /// Handles every complete request of every client not blocked in a get/wait and with its
  /// last reply sent; repeats while that makes progress, since a set can release a client that
  /// has more requests queued.
  void serve_requests() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (std::size_t i = 0; i < clients_.size(); ++i) {
        client& c = *clients_[i];
        while (!c.closed && !c.hangup && !c.waiting && c.out.empty()) {
          const std::size_t avail = c.in.size() - c.in_pos;
          if (avail < 4) break;
          const std::size_t len = load_u32(c.in.data() + c.in_pos);
          if (len == 0 || len > max_frame_) {
            reject(c, concat("tcp_store: a request of ", len,
                             " bytes is not allowed (the server's limit is ", max_frame_,
                             " bytes; is the peer a tcp_store client?)"));
            break;
          }
          if (avail - 4 < len) break;
          byte_reader rd(c.in.data() + c.in_pos + 4, len);
          try {
            handle(c, rd);
          } catch (const std::exception& e) {
            reject(c, e.what());  // malformed, or the server ran out of memory for it
          }
          c.in_pos += 4 + len;
          progress = true;
        }
        if (c.in_pos == c.in.size()) {
          release(c.in);
          c.in_pos = 0;
        }
        account(c);
      }
    }
  }

  bool has(std::string_view key) const { return data_.find(key) != data_.end(); }

  /// The key at `pos` of a key list in wire format, and where the next one starts. Only for
  /// lists already validated (wait_keys).
  static std::pair<std::string_view, std::size_t> key_at(const std::vector<std::uint8_t>& keys,
                                                         std::size_t pos) {
    const std::size_t n = load_u32(keys.data() + pos);
    return {std::string_view(reinterpret_cast<const char*>(keys.data() + pos + 4), n), pos + 4 + n};
  }

  /// Whether every key `c` waits for is set. Keys are never removed, so the ones found set
  /// are not looked at again: a whole wait costs one lookup per key plus one per wake-up.
  bool all_set(client& c) const {
    while (c.wait_next < c.wait_keys.size()) {
      const auto [key, next] = key_at(c.wait_keys, c.wait_next);
      if (!has(key)) return false;
      c.wait_next = next;
    }
    return true;
  }

  /// Reads one key of a request and checks it against the limit; nullopt (after refusing the
  /// request) when it is too long.
  std::optional<std::string_view> read_key(client& c, byte_reader& rd, const char* call) {
    const std::string_view key = rd.view();
    if (key.size() <= limits_.max_key_bytes) return key;
    refuse(c, concat(call, ": key of ", key.size(), " bytes is longer than the server's limit of ",
                     limits_.max_key_bytes, " bytes"));
    return std::nullopt;
  }

  /// Reads the `n` keys of a check or wait and checks them against the limits; nullopt (after
  /// refusing the request) when one breaks them. Returns whether all are set.
  std::optional<bool> read_keys(client& c, byte_reader& rd, std::size_t n, const char* call) {
    if (n > limits_.max_keys_per_request) {
      refuse(c, concat(call, ": ", n, " keys in one request, more than the server's limit of ",
                       limits_.max_keys_per_request));
      return std::nullopt;
    }
    bool all = true;
    for (std::size_t i = 0; i < n; ++i) {
      const std::string_view key = rd.view();
      if (key.size() > limits_.max_key_bytes) {
        refuse(c, concat(call, ": key of ", key.size(),
                         " bytes is longer than the server's limit of ", limits_.max_key_bytes,
                         " bytes"));
        return std::nullopt;
      }
      all = all && has(key);
    }
    rd.expect_end();
    return all;
  }

  /// Stores `value` under `key` unless the table would outgrow its limit (then refuses).
  bool store_value(client& c, std::string_view key, const std::uint8_t* value, std::size_t n,
                   const char* call) {
    auto it = data_.find(key);
    const std::size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
    const std::size_t now = table_bytes_ - old + key.size() + n;
    if (now > limits_.max_table_bytes) {
      refuse(c, concat(call, ": the server's table would hold ", now,
                       " bytes, more than its limit of ", limits_.max_table_bytes, " bytes"));
      return false;
    }
    if (it == data_.end()) {
      data_.emplace(std::string(key), std::vector<std::uint8_t>(value, value + n));
    } else {
      it->second.assign(value, value + n);
    }
    table_bytes_ = now;
    return true;
  }

  void hello(client& c, byte_reader& rd) {
    if (rd.u32() != tcp_store_magic)
      CCGRAPH_THROW(error, "tcp_store: the first request on a connection must be a hello; "
                           "is the peer a tcp_store client?");
    const std::uint32_t version = rd.u32();
    const std::uint32_t world_size = rd.u32();
    rd.expect_end();
    if (version != tcp_store_protocol_version)
      return reject(c, concat("tcp_store: the client speaks protocol version ", version,
                              ", this server version ", tcp_store_protocol_version,
                              " (are the ranks built with different ccgraph versions?)"));
    if (!poison_.empty()) return reject(c, poison_);
    if (world_size != world_size_) {
      // The job is misconfigured: its barriers would count the wrong number of ranks. Every
      // rank learns it at once, instead of at a timeout minutes later.
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      const std::string from =
          ::getpeername(c.fd.get(), reinterpret_cast<sockaddr*>(&peer), &len) == 0
              ? concat(" from ", endpoint_text(peer))
              : std::string();
      poison_ = concat("tcp_store: a rank", from, " joined with world_size ", world_size,
                       " but this store serves world_size ", world_size_,
                       "; every rank must be started with the same WORLD_SIZE (the store refuses "
                       "every request from now on)");
      reject(c, concat("tcp_store: this rank joins with world_size ", world_size,
                       " but the store serves world_size ", world_size_,
                       "; every rank must be started with the same WORLD_SIZE"));
      for (auto& other : clients_)
        if (other->waiting) reject(*other, poison_);
      return;
    }
    c.greeted = true;
    byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(tcp_status::ok));
    w.u32(tcp_store_protocol_version);
    w.u32(world_size_);
    reply(c, std::move(w).finish());
  }

  void handle(client& c, byte_reader& rd) {
    const auto cmd = static_cast<tcp_cmd>(rd.u8());
    if (!c.greeted) {
      if (cmd != tcp_cmd::hello)
        CCGRAPH_THROW(error, "tcp_store: the first request on a connection must be a hello "
                             "(protocol version ", tcp_store_protocol_version,
                      "); is the peer a tcp_store client of this ccgraph version?");
      return hello(c, rd);
    }
    if (!poison_.empty()) return reject(c, poison_);
    switch (cmd) {
      case tcp_cmd::hello:
        CCGRAPH_THROW(error, "tcp_store: a second hello on one connection");
      case tcp_cmd::set: {
        const auto key = read_key(c, rd, "tcp_store::set");
        if (!key) return;
        const std::string_view value = rd.view();
        rd.expect_end();
        if (value.size() > limits_.max_value_bytes)
          return refuse(c, concat("tcp_store::set: value of ", value.size(),
                                  " bytes is larger than the server's limit of ",
                                  limits_.max_value_bytes, " bytes"));
        if (!store_value(c, *key, reinterpret_cast<const std::uint8_t*>(value.data()),
                         value.size(), "tcp_store::set"))
          return;
        // Reply before waking the waiters: a waiter (rank 0 leaving a barrier) may stop this
        // server as soon as it is woken, and the setter must have its reply by then.
        reply(c, status_frame(tcp_status::ok));
        wake_waiters();
        return;
      }
      case tcp_cmd::get: {
        const std::uint64_t timeout_ms = rd.u64();
        const std::size_t start = rd.pos();
        const auto key = read_key(c, rd, "tcp_store::get");
        if (!key) return;
        rd.expect_end();
        if (auto it = data_.find(*key); it != data_.end()) return reply(c, value_frame(it->second));
        return block(c, tcp_cmd::get, rd.data() + start, rd.pos() - start, timeout_ms);
      }
      case tcp_cmd::add: {
        const auto key = read_key(c, rd, "tcp_store::add");
        if (!key) return;
        const std::int64_t delta = rd.i64();
        rd.expect_end();
        auto it = data_.find(*key);
        std::int64_t value = 0;
        try {
          value = counter_add(std::string(*key), it == data_.end() ? nullptr : &it->second, delta);
        } catch (const error& e) {
          return refuse(c, e.what());
        }
        const std::vector<std::uint8_t> text = counter_bytes(value);
        if (!store_value(c, *key, text.data(), text.size(), "tcp_store::add")) return;
        byte_writer w(true);
        w.u8(static_cast<std::uint8_t>(tcp_status::ok));
        w.i64(value);
        reply(c, std::move(w).finish());
        wake_waiters();
        return;
      }
      case tcp_cmd::check: {
        const auto all = read_keys(c, rd, rd.u32(), "tcp_store::check");
        if (!all) return;
        byte_writer w(true);
        w.u8(static_cast<std::uint8_t>(tcp_status::ok));
        w.u8(*all ? 1 : 0);
        return reply(c, std::move(w).finish());
      }
      case tcp_cmd::wait: {
        const std::uint64_t timeout_ms = rd.u64();
        const std::size_t n = rd.u32();
        const std::size_t start = rd.pos();
        const auto all = read_keys(c, rd, n, "tcp_store::wait");
        if (!all) return;
        if (*all) return reply(c, status_frame(tcp_status::ok));
        return block(c, tcp_cmd::wait, rd.data() + start, rd.pos() - start, timeout_ms);
      }
    }
    CCGRAPH_THROW(error, "tcp_store: unknown command ", static_cast<int>(cmd));
  }

  static std::vector<std::uint8_t> value_frame(const std::vector<std::uint8_t>& value) {
    byte_writer w(true);
    w.reserve(9 + value.size());
    w.u8(static_cast<std::uint8_t>(tcp_status::ok));
    w.bytes(value);
    return std::move(w).finish();
  }

  /// Holds `c`'s get/wait until its keys (`n` bytes at `keys`, in wire format) are set or
  /// `timeout_ms` passes (2^63 - 1 or more: never).
  void block(client& c, tcp_cmd cmd, const std::uint8_t* keys, std::size_t n,
             std::uint64_t timeout_ms) {
    const auto limit = std::chrono::milliseconds(static_cast<std::int64_t>(
        std::min<std::uint64_t>(timeout_ms, std::numeric_limits<std::int64_t>::max())));
    c.waiting = true;
    c.wait_cmd = cmd;
    c.wait_keys.assign(keys, keys + n);
    c.wait_next = 0;
    c.deadline = deadline_after(clock::now(), limit);
    account(c);
  }

  /// Ends `c`'s get/wait with `frame`.
  void unblock(client& c, std::vector<std::uint8_t> frame) {
    c.waiting = false;
    reply(c, std::move(frame));
    release(c.wait_keys);
    c.wait_next = 0;
    account(c);
  }

  /// Answers every blocked get/wait whose keys are all set now.
  void wake_waiters() {
    for (auto& cp : clients_) {
      client& c = *cp;
      if (!c.waiting || c.closed || !all_set(c)) continue;
      if (c.wait_cmd == tcp_cmd::get) {
        unblock(c, value_frame(data_.find(key_at(c.wait_keys, 0).first)->second));
      } else {
        unblock(c, status_frame(tcp_status::ok));
      }
    }
  }

  /// Answers `timed_out` to every blocked get/wait whose deadline has passed.
  void expire_waits() {
    const auto now = clock::now();
    for (auto& cp : clients_) {
      client& c = *cp;
      if (!c.waiting || c.closed || c.deadline > now) continue;
      byte_writer w(true);
      w.u8(static_cast<std::uint8_t>(tcp_status::timed_out));
      if (c.wait_cmd == tcp_cmd::wait) {
        std::uint32_t missing = 0;
        for (std::size_t p = c.wait_next; p < c.wait_keys.size();) {
          const auto [key, next] = key_at(c.wait_keys, p);
          if (!has(key)) ++missing;
          p = next;
        }
        w.u32(missing);
        for (std::size_t p = c.wait_next; p < c.wait_keys.size();) {
          const auto [key, next] = key_at(c.wait_keys, p);
          if (!has(key)) w.str(key);
          p = next;
        }
      }
      unblock(c, std::move(w).finish());
    }
  }

  void publish_stats() {
    stat_connections_.store(clients_.size(), std::memory_order_relaxed);
    stat_buffered_.store(held_total_, std::memory_order_relaxed);
    stat_peak_.store(peak_held_, std::memory_order_relaxed);
    stat_table_.store(table_bytes_, std::memory_order_relaxed);
    stat_refused_.store(refused_, std::memory_order_relaxed);
    stat_dropped_.store(dropped_, std::memory_order_relaxed);
    stat_accept_errors_.store(accept_errors_, std::memory_order_relaxed);
  }

  /// A socket for listening at `addr`, or an empty fd (errno set). Makes the IPv6 wildcard
  /// dual-stack, whatever net.ipv6.bindv6only says; where that fails, or the machine has no
  /// IPv6 sockets, turns `addr` into the IPv4 wildcard on the same port and opens that instead.
  static unique_fd open_listener(sockaddr_storage& addr) {
    const auto open = [](int family) {
      return unique_fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    };
    auto& a6 = reinterpret_cast<sockaddr_in6&>(addr);
    if (addr.ss_family != AF_INET6 || !IN6_IS_ADDR_UNSPECIFIED(&a6.sin6_addr))
      return open(addr.ss_family);
    unique_fd fd = open(AF_INET6);
    int zero = 0;
    if (fd && ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0) return fd;
    const int port = address_port(addr);
    detail::log(log_level::debug, "store", "no dual-stack IPv6 socket (", errno_message(errno),
                "); listening on IPv4 only");
    addr = sockaddr_storage{};
    auto& a4 = reinterpret_cast<sockaddr_in&>(addr);
    a4.sin_family = AF_INET;
    a4.sin_port = htons(static_cast<std::uint16_t>(port));
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    return open(AF_INET);
  }

  std::chrono::milliseconds grace_;
  std::uint32_t world_size_;
  tcp_store_limits limits_;
  std::size_t max_frame_;
  sockaddr_storage addr_{};
  unique_fd listen_;
  unique_fd reserve_;  // a descriptor to give up when accept() runs out of them
  unique_fd wake_rd_;
  unique_fd wake_wr_;
  // Owned by the serving thread (it starts after they are built and is joined before they go).
  std::unordered_map<std::string, std::vector<std::uint8_t>, key_hash, std::equal_to<>> data_;
  std::vector<std::unique_ptr<client>> clients_;
  std::string poison_;  // set when a rank joined with another world size: every request fails
  clock::time_point accept_resume_{};
  std::size_t table_bytes_ = 0;
  std::size_t held_total_ = 0;  // capacity of every client's buffers
  std::size_t charged_ = 0;     // the part of it beyond each client's free allowance
  std::size_t peak_held_ = 0;
  std::size_t refused_ = 0;
  std::size_t dropped_ = 0;
  std::size_t accept_errors_ = 0;
  // Published copies for stats(), read from other threads.
  std::atomic<std::size_t> stat_connections_{0}, stat_buffered_{0}, stat_peak_{0},
      stat_table_{0}, stat_refused_{0}, stat_dropped_{0}, stat_accept_errors_{0};
  std::thread thread_;  // last: started once everything it uses exists
};

}  // namespace detail

/// A store served over TCP by rank 0, the way c10d's TCPStore is: the server (`is_server`,
/// normally rank 0) listens on `port` at the first address `host` resolves to, IPv4 or IPv6
/// (127.0.0.1 and ::1 stay loopback; tcp_store_options::bind_all_interfaces listens on every
/// interface, dual-stack) and serves the table from a background thread; every rank, the
/// server's included, is a client. Clients connect to `host` (an IPv4 address, an IPv6 address
/// plain or in brackets as URLs write it, `::1` or `[::1]`, or a host name), trying each address
/// it resolves to, and retry until timeout() passes, so the server may start after them. Each
/// connection begins with a hello carrying the protocol version and the world size: a rank
/// whose world size differs from the server's is refused (its constructor throws, naming both),
/// and the server then fails every request, so every rank of the misconfigured job learns it at
/// once. Construction does not wait for the other
/// ranks: use barrier() for that.
///
/// Each call takes a connection from a small pool (opening one when none is free), so threads
/// sharing one tcp_store never queue behind a blocked get. The server stops when its tcp_store
/// is destroyed; do that last (end the job with a barrier), since the other ranks' calls fail
/// once it is gone. It lingers for the ranks still connected (see ~tcp_store), so a rank that
/// leaves the final barrier first does not cut off a peer's request for it.
class tcp_store final : public store {
 public:
  /// Connects to (and, when `is_server`, first starts) the store at `host`:`port`. Port 0 on
  /// the server picks a free port (see port()). `world_size` is the number of ranks that will
  /// use the store; every rank must give the same. Throws timeout_error naming host:port when
  /// no server answers within the timeout, and error naming the address when the server cannot
  /// bind it, or naming both world sizes when they differ.
  tcp_store(std::string host, int port, bool is_server, int world_size, const tcp_store_options& opt)
      : store(opt.timeout),
        host_(std::move(host)),
        port_(port),
        is_server_(is_server),
        world_size_(world_size) {
    CCGRAPH_CHECK(!host_.empty(), "tcp_store: host must not be empty");
    bare_host_ = bare_host(host_);
    CCGRAPH_CHECK(world_size >= 1, "tcp_store: world_size must be >= 1, got ", world_size);
    if (is_server) {
      CCGRAPH_CHECK(port >= 0 && port <= 65535,
                    "tcp_store: the server's port must be in [0, 65535] (0: pick a free one), got ",
                    port);
      CCGRAPH_CHECK(opt.shutdown_grace.count() >= 0,
                    "tcp_store: shutdown_grace must be >= 0 ms, got ", opt.shutdown_grace.count());
      check_limits(opt.limits);
      server_ = std::make_unique<detail::tcp_store_server>(
          bind_address(opt.bind_all_interfaces), world_size, opt.limits, opt.shutdown_grace);
      port_ = server_->port();
      // The server's own client goes to where it listens; to loopback when that is everywhere
      // (`host` may name an address this machine reaches itself by only through a detour).
      // 127.0.0.1 for the IPv6 wildcard too: it is dual-stack, and IPv4 loopback is there even
      // where IPv6 is switched off (sysctl disable_ipv6) and ::1 is not.
      const sockaddr_storage& a = server_->address();
      connect_host_ = is_wildcard(a) ? "127.0.0.1" : detail::address_host(a);
    } else {
      CCGRAPH_CHECK(port >= 1 && port <= 65535,
                    "tcp_store: a client's port must be in [1, 65535], got ", port,
                    " (port 0, 'pick a free port', is for the server only)");
      connect_host_ = bare_host_;
    }
    // Connect now, as c10d does: a missing server shows up here, not at some later get().
    idle_.push_back(connect("tcp_store", detail::deadline_after(clock::now(), this->timeout())));
    detail::log(log_level::info, "store", is_server ? "serving" : "joined", " ", describe(), " (world_size ",
                world_size, ")");
  }

  /// tcp_store(host, port, is_server, world_size, {timeout, shutdown_grace}).
  tcp_store(std::string host, int port, bool is_server, int world_size,
            std::chrono::milliseconds timeout = std::chrono::seconds(300),
            std::chrono::milliseconds shutdown_grace = std::chrono::seconds(10))
      : tcp_store(std::move(host), port, is_server, world_size,
                  tcp_store_options{timeout, shutdown_grace, false, {}}) {}

  /// Closes this rank's connections, then (on the server) stops the server: it takes no new
  /// connections but answers the ranks still connected until they hang up, until each is
  /// blocked in a get/wait no one can release, or for at most `shutdown_grace`.
  ~tcp_store() override = default;

  /// The host clients connect to, as given.
  const std::string& host() const noexcept { return host_; }
  /// The port: on a server constructed with port 0, the one it picked.
  int port() const noexcept { return port_; }
  /// Whether this rank runs the server.
  bool is_server() const noexcept { return is_server_; }
  /// The number of ranks using the store, as given.
  int world_size() const noexcept { return world_size_; }
  /// On the server, where it listens ("127.0.0.1:29500", "[::1]:29500"; "[::]:29500" for
  /// every interface, or "0.0.0.0:29500" where this machine has no IPv6); empty on other ranks.
  std::string listen_address() const {
    return server_ ? detail::endpoint_text(server_->address()) : std::string();
  }
  /// On the server, what it holds and has refused; nullopt on other ranks.
  std::optional<tcp_store_stats> server_stats() const {
    if (!server_) return std::nullopt;
    return server_->stats();
  }

  /// "host:port" ("[host]:port" for an IPv6 address, bracketed or not), as given (the real
  /// port when the server picked it).
  std::string describe() const override { return detail::endpoint_text(bare_host_, port_); }

  /// store::set: one request; the server wakes the ranks blocked on `key`.
  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    detail::check_store_entry("tcp_store::set", key, value.size());
    detail::byte_writer w(true);
    w.reserve(16 + key.size() + value.size());
    w.u8(static_cast<std::uint8_t>(detail::tcp_cmd::set));
    w.str(key);
    w.bytes(value);
    auto reply = request("tcp_store::set", std::move(w).finish(), timeout());
    detail::byte_reader rd(reply);
    expect_ok("tcp_store::set", rd);
  }

  /// store::get: the server holds the request until `key` is set or the timeout passes.
  std::vector<std::uint8_t> get(const std::string& key) override {
    detail::check_store_entry("tcp_store::get", key, 0);
    const auto t = timeout();
    detail::byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(detail::tcp_cmd::get));
    w.u64(static_cast<std::uint64_t>(t.count()));
    w.str(key);
    auto reply = request("tcp_store::get", std::move(w).finish(), with_grace(t));
    detail::byte_reader rd(reply);
    if (status_of("tcp_store::get", rd) == detail::tcp_status::timed_out)
      CCGRAPH_THROW(timeout_error, "tcp_store::get: key '", key, "' was not set within ",
                    detail::timeout_text(t), " (store ", describe(), ")");
    return rd.bytes();
  }

  /// store::check: one request, answered at once.
  bool check(const std::vector<std::string>& keys) override {
    detail::byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(detail::tcp_cmd::check));
    put_keys("tcp_store::check", w, keys);
    auto reply = request("tcp_store::check", std::move(w).finish(), timeout());
    detail::byte_reader rd(reply);
    expect_ok("tcp_store::check", rd);
    return rd.u8() != 0;
  }

  /// store::wait: the server holds the request until every key is set or the timeout passes.
  void wait(const std::vector<std::string>& keys) override {
    const auto t = timeout();
    detail::byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(detail::tcp_cmd::wait));
    w.u64(static_cast<std::uint64_t>(t.count()));
    put_keys("tcp_store::wait", w, keys);
    auto reply = request("tcp_store::wait", std::move(w).finish(), with_grace(t));
    detail::byte_reader rd(reply);
    if (status_of("tcp_store::wait", rd) == detail::tcp_status::timed_out) {
      const std::vector<std::string> missing = rd.strs(rd.u32());
      CCGRAPH_THROW(timeout_error, "tcp_store::wait: ", missing.size(), " of ", keys.size(),
                    " keys not set within ", detail::timeout_text(t), ": ",
                    detail::quote_keys(missing), " (store ", describe(), ")");
    }
  }

  /// store::add: atomic because the one server thread applies every request in turn.
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    detail::check_store_entry("tcp_store::add", key, 0);
    detail::byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(detail::tcp_cmd::add));
    w.str(key);
    w.i64(delta);
    auto reply = request("tcp_store::add", std::move(w).finish(), timeout());
    detail::byte_reader rd(reply);
    expect_ok("tcp_store::add", rd);
    return rd.i64();
  }

 private:
  using clock = std::chrono::steady_clock;

  /// How much longer than a get/wait's own timeout a client waits for the server's reply: the
  /// server answers `timed_out` itself, so this only bounds a server that stopped answering.
  static constexpr std::chrono::milliseconds reply_grace{5000};

  /// `t` plus reply_grace; forever stays forever.
  static std::chrono::milliseconds with_grace(std::chrono::milliseconds t) {
    return detail::waits_forever(t) ? t : t + reply_grace;
  }

  static void check_limits(const tcp_store_limits& l) {
    CCGRAPH_CHECK(l.max_key_bytes <= detail::store_max_key_bytes &&
                      l.max_value_bytes <= detail::store_max_value_bytes &&
                      l.max_keys_per_request <= detail::store_max_keys_per_request,
                  "tcp_store_limits: max_key_bytes (", l.max_key_bytes, "), max_value_bytes (",
                  l.max_value_bytes, ") and max_keys_per_request (", l.max_keys_per_request,
                  ") may be lowered, not raised above ", detail::store_max_key_bytes, ", ",
                  detail::store_max_value_bytes, " and ", detail::store_max_keys_per_request);
    CCGRAPH_CHECK(l.max_connections >= 1 && l.max_keys_per_request >= 1,
                  "tcp_store_limits: max_connections (", l.max_connections,
                  ") and max_keys_per_request (", l.max_keys_per_request, ") must be >= 1");
  }

  /// `host` without the brackets of "[::1]", the way URLs and torchrun write an IPv6 address;
  /// an error for an unmatched bracket. An IPv6 literal (it has a colon, which no host name has)
  /// must parse as one, so a typo fails at once instead of after the timeout.
  static std::string bare_host(const std::string& host) {
    std::string h = host;
    if (h.front() == '[' || h.back() == ']') {
      CCGRAPH_CHECK(h.size() > 2 && h.front() == '[' && h.back() == ']', "tcp_store: host '", host,
                    "' (MASTER_ADDR) has an unmatched bracket; write an IPv6 address as ::1 or "
                    "[::1], without a port");
      h = h.substr(1, h.size() - 2);
    }
    if (h.find(':') != std::string::npos) {
      addrinfo* found = nullptr;
      const int rc = resolve(h, nullptr, found);
      CCGRAPH_CHECK(rc == 0, "tcp_store: host '", host,
                    "' (MASTER_ADDR) is not a valid IPv6 address: ",
                    rc == EAI_SYSTEM ? detail::errno_message(errno) : std::string(::gai_strerror(rc)));
      ::freeaddrinfo(found);
    }
    return h;
  }

  /// getaddrinfo() for a TCP endpoint at `host` (no brackets), IPv4 and IPv6 alike; an IPv6
  /// literal is parsed only, never looked up by name. Returns its status; `found` on success.
  static int resolve(const std::string& host, const char* service, addrinfo*& found) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = (service ? AI_NUMERICSERV : 0) |
                     (host.find(':') != std::string::npos ? AI_NUMERICHOST : 0);
    return ::getaddrinfo(host.c_str(), service, &hints, &found);
  }

  /// Whether `a` is the wildcard address, 0.0.0.0 or ::.
  static bool is_wildcard(const sockaddr_storage& a) {
    if (a.ss_family == AF_INET6)
      return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr);
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr == htonl(INADDR_ANY);
  }

  /// Where the server listens: every interface (the dual-stack IPv6 wildcard; the server falls
  /// back to IPv4's where there is no IPv6), or the first address `host` resolves to, of
  /// either family.
  sockaddr_storage bind_address(bool all) const {
    sockaddr_storage a{};
    if (all) {
      auto& a6 = reinterpret_cast<sockaddr_in6&>(a);
      a6.sin6_family = AF_INET6;
      a6.sin6_port = htons(static_cast<std::uint16_t>(port_));
      a6.sin6_addr = in6addr_any;
      return a;
    }
    addrinfo* found = nullptr;
    const int rc = resolve(bare_host_, nullptr, found);
    if (rc != 0)
      CCGRAPH_THROW(error, "tcp_store: the server cannot resolve its host '", host_,
                    "' (MASTER_ADDR) to an address to listen on: ",
                    rc == EAI_SYSTEM ? detail::errno_message(errno) : std::string(::gai_strerror(rc)));
    const std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);
    std::memcpy(&a, list->ai_addr, std::min<std::size_t>(list->ai_addrlen, sizeof a));
    if (a.ss_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6&>(a).sin6_port = htons(static_cast<std::uint16_t>(port_));
    } else {
      reinterpret_cast<sockaddr_in&>(a).sin_port = htons(static_cast<std::uint16_t>(port_));
    }
    return a;
  }

  static void put_keys(const char* call, detail::byte_writer& w,
                       const std::vector<std::string>& keys) {
    CCGRAPH_CHECK(keys.size() <= detail::store_max_keys_per_request, call, ": ", keys.size(),
                  " keys in one request, more than the limit of ",
                  detail::store_max_keys_per_request);
    for (const auto& k : keys) detail::check_store_entry(call, k, 0);
    w.u32(static_cast<std::uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
  }

  /// The reply's status; `failed` becomes an error carrying the server's message.
  detail::tcp_status status_of(const char* call, detail::byte_reader& rd) const {
    const auto status = static_cast<detail::tcp_status>(rd.u8());
    if (status == detail::tcp_status::ok || status == detail::tcp_status::timed_out) return status;
    if (status == detail::tcp_status::failed || status == detail::tcp_status::rejected)
      CCGRAPH_THROW(error, call, ": ", rd.str(), " (store ", describe(), ")");
    CCGRAPH_THROW(error, call, ": unexpected reply status ", static_cast<int>(status), " from ",
                  describe());
  }

  void expect_ok(const char* call, detail::byte_reader& rd) const {
    if (status_of(call, rd) != detail::tcp_status::ok)
      CCGRAPH_THROW(error, call, ": unexpected reply status from ", describe());
  }

  /// Sends one request frame and returns the reply's payload (status byte first), waiting at
  /// most `limit` for the exchange. The connection goes back to the pool only after a complete
  /// exchange: one that failed halfway is out of step with the server, so it is closed.
  std::vector<std::uint8_t> request(const char* call, const std::vector<std::uint8_t>& frame,
                                    std::chrono::milliseconds limit) {
    detail::unique_fd fd = acquire(call);
    std::vector<std::uint8_t> payload =
        exchange(call, fd.get(), frame, detail::deadline_after(clock::now(), limit), limit);
    // After `rejected` the server closes the connection: it is not reused.
    if (payload[0] != static_cast<std::uint8_t>(detail::tcp_status::rejected)) {
      std::lock_guard lk(mu_);
      idle_.push_back(std::move(fd));
    }
    return payload;
  }

  /// One request and its reply on `fd`, by `deadline`.
  std::vector<std::uint8_t> exchange(const char* call, int fd, const std::vector<std::uint8_t>& frame,
                                     clock::time_point deadline, std::chrono::milliseconds limit) const {
    send_all(call, fd, frame.data(), frame.size(), deadline, limit);
    std::uint8_t header[4];
    recv_all(call, fd, header, 4, deadline, limit);
    const std::size_t len = detail::load_u32(header);
    if (len == 0 || len > detail::store_max_frame_bytes)
      CCGRAPH_THROW(error, call, ": malformed reply from ", describe(), " (length ", len,
                    "): is a tcp_store server listening there?");
    std::vector<std::uint8_t> payload(len);
    recv_all(call, fd, payload.data(), len, deadline, limit);
    return payload;
  }

  /// An idle pooled connection, or a new one.
  detail::unique_fd acquire(const char* call) {
    {
      std::lock_guard lk(mu_);
      if (!idle_.empty()) {
        detail::unique_fd fd = std::move(idle_.back());
        idle_.pop_back();
        return fd;
      }
    }
    return connect(call, detail::deadline_after(clock::now(), timeout()));
  }

  /// Connects to the server and says hello, retrying every failure to reach it (refused: the
  /// server is not up yet; unresolvable: its name is not published yet; closed during the
  /// hello: it is out of descriptors or stopping) with a growing pause until `deadline`. The
  /// server's refusal of the hello (another world size or protocol version) is an error at
  /// once.
  detail::unique_fd connect(const char* call, clock::time_point deadline) const {
    const std::string service = std::to_string(port_);
    auto pause = std::chrono::milliseconds(10);
    std::string last_error;
    for (;;) {
      addrinfo* found = nullptr;
      const int rc = resolve(connect_host_, service.c_str(), found);
      if (rc != 0) {
        last_error =
            detail::concat("getaddrinfo: ", rc == EAI_SYSTEM ? detail::errno_message(errno)
                                                             : std::string(::gai_strerror(rc)));
      } else {
        const std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);
        for (const addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
          auto fd = try_connect(*ai, deadline, last_error);
          if (fd && hello(call, fd.get(), deadline, last_error)) return fd;
        }
      }
      const auto now = clock::now();
      if (now >= deadline)
        CCGRAPH_THROW(timeout_error, call, ": could not connect to ", describe(), " within ",
                      detail::timeout_text(timeout()), " (last error: ", last_error,
                      "); is the server (rank 0) running and MASTER_ADDR/MASTER_PORT right?");
      detail::log(log_level::debug, "store", call, ": no connection to ", describe(), " yet (", last_error,
                  "); retrying in ", pause.count(), " ms");
      std::this_thread::sleep_for(std::min<clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    }
  }

  /// The hello on a new connection: true when the server accepts it; false (with `last_error`
  /// set) when the connection failed on the way; an error when the server refuses this rank.
  bool hello(const char* call, int fd, clock::time_point deadline, std::string& last_error) const {
    detail::byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(detail::tcp_cmd::hello));
    w.u32(detail::tcp_store_magic);
    w.u32(detail::tcp_store_protocol_version);
    w.u32(static_cast<std::uint32_t>(world_size_));
    std::vector<std::uint8_t> reply;
    try {
      reply = exchange(call, fd, std::move(w).finish(), deadline, timeout());
    } catch (const timeout_error&) {
      throw;
    } catch (const error& e) {
      last_error = e.what();
      return false;
    }
    detail::byte_reader rd(reply);
    const auto status = static_cast<detail::tcp_status>(rd.u8());
    if (status == detail::tcp_status::failed || status == detail::tcp_status::rejected)
      CCGRAPH_THROW(error, call, ": the store at ", describe(), " refused this rank: ", rd.str());
    CCGRAPH_CHECK(status == detail::tcp_status::ok, call, ": unexpected hello reply status ",
                  static_cast<int>(status), " from ", describe());
    const std::uint32_t version = rd.u32();
    const std::uint32_t served = rd.u32();
    // The server checks both too; this also catches a server that does not.
    CCGRAPH_CHECK(version == detail::tcp_store_protocol_version, call, ": the store at ",
                  describe(), " speaks protocol version ", version, ", this rank version ",
                  detail::tcp_store_protocol_version);
    CCGRAPH_CHECK(served == static_cast<std::uint32_t>(world_size_), call,
                  ": this rank joins with world_size ", world_size_, " but the store at ",
                  describe(), " serves world_size ", served);
    return true;
  }

  /// One non-blocking connect, bounded by `deadline`; an empty fd (and `last_error` set) when
  /// it fails.
  static detail::unique_fd try_connect(const addrinfo& ai, clock::time_point deadline,
                                       std::string& last_error) {
    detail::unique_fd fd(
        ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol));
    if (!fd) {
      last_error = detail::concat("socket: ", detail::errno_message(errno));
      return {};
    }
    if (::connect(fd.get(), ai.ai_addr, ai.ai_addrlen) != 0) {
      if (errno != EINPROGRESS && errno != EINTR) {
        last_error = detail::concat("connect: ", detail::errno_message(errno));
        return {};
      }
      pollfd p{fd.get(), POLLOUT, 0};
      int n = 0;
      while (((n = ::poll(&p, 1, detail::poll_ms_until(deadline))) < 0 && errno == EINTR) ||
             (n == 0 && clock::now() < deadline)) {  // poll() waits at most ~24 days at once
      }
      if (n <= 0) {
        last_error = "connect: no answer";
        return {};
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        last_error = detail::concat("connect: ", detail::errno_message(err));
        return {};
      }
    }
    detail::set_nodelay(fd.get());
    return fd;
  }

  /// Waits until `fd` is ready for `events`, or throws timeout_error at `deadline`.
  void await(const char* call, int fd, short events, clock::time_point deadline,
             std::chrono::milliseconds limit) const {
    for (;;) {
      pollfd p{fd, events, 0};
      const int n = ::poll(&p, 1, detail::poll_ms_until(deadline));
      if (n > 0) return;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        CCGRAPH_THROW(error, call, ": poll() on the connection to ", describe(),
                      " failed: ", detail::errno_message(errno));
      if (clock::now() < deadline) continue;  // poll() waits at most ~24 days at once
      CCGRAPH_THROW(timeout_error, call, ": no reply from ", describe(), " within ",
                    detail::timeout_text(limit));
    }
  }

  void send_all(const char* call, int fd, const std::uint8_t* p, std::size_t n,
                clock::time_point deadline, std::chrono::milliseconds limit) const {
    std::size_t off = 0;
    while (off < n) {
      const ssize_t r = ::send(fd, p + off, n - off, MSG_NOSIGNAL);
      if (r > 0) {
        off += static_cast<std::size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        await(call, fd, POLLOUT, deadline, limit);
        continue;
      }
      CCGRAPH_THROW(error, call, ": sending to ", describe(),
                    " failed: ", detail::errno_message(errno),
                    " (has the server, rank 0, exited?)");
    }
  }

  void recv_all(const char* call, int fd, std::uint8_t* p, std::size_t n,
                clock::time_point deadline, std::chrono::milliseconds limit) const {
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::recv(fd, p + got, n - got, 0);
      if (r > 0) {
        got += static_cast<std::size_t>(r);
        continue;
      }
      if (r == 0)
        CCGRAPH_THROW(error, call, ": the server at ", describe(),
                      " closed the connection (has rank 0 exited or destroyed its tcp_store?)");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        await(call, fd, POLLIN, deadline, limit);
        continue;
      }
      CCGRAPH_THROW(error, call, ": receiving from ", describe(),
                    " failed: ", detail::errno_message(errno));
    }
  }

  std::string host_;
  std::string bare_host_;     // host_ without the brackets of an IPv6 address
  std::string connect_host_;  // where this rank connects: bare_host_, or the server's own address
  int port_;
  bool is_server_;
  int world_size_;
  std::unique_ptr<detail::tcp_store_server> server_;  // destroyed after the connections below
  std::mutex mu_;                                     // guards idle_
  std::vector<detail::unique_fd> idle_;
};

/// A store in one file on a filesystem every rank sees (NFS, Lustre, a local disk for one
/// machine), for clusters where ranks cannot reach each other over TCP before NCCL is up.
///
/// Layout: a 16-byte header (the magic "ccgstore", a big-endian u32 format version, the u32
/// world size), then an append-only log of records (as c10d's FileStore), each a big-endian
/// u32 key length, the key, a u32 value length and the value; the last record of a key wins.
/// Every operation opens the file and holds flock() on it, shared to read and exclusive to
/// append, which is what makes add() atomic across processes and, on NFS, what makes every
/// rank see the others' appends (taking the lock revalidates the client's cache). Each
/// file_store reads only the records appended since its last look. get() and wait() poll with
/// a short sleep (1 ms, doubling to 20 ms).
///
/// The first file_store creates the file atomically (written under a temporary name, then
/// linked into place), so no rank ever sees it half made. A file that exists without the
/// header (another program's file, a wrong path) is an error naming the path and what it
/// holds, and is never modified or removed. The file is removed when the last of `world_size`
/// file_stores on it is destroyed (counted in the file itself, like c10d), and only if the path
/// still names the file they opened; a file left by a job that crashed holds that job's keys,
/// so give every job a fresh path.
class file_store final : public store {
 public:
  /// Opens the store file at `path`, or creates it (its directory must exist). `world_size` is
  /// the number of file_stores (one per rank) that will use it; a file made for another world
  /// size is an error. Throws error naming the path when it cannot be opened or created, or is
  /// not a store file.
  file_store(std::string path, int world_size,
             std::chrono::milliseconds timeout = std::chrono::seconds(300))
      : store(timeout), path_(std::move(path)), world_size_(world_size) {
    CCGRAPH_CHECK(!path_.empty(), "file_store: path must not be empty");
    CCGRAPH_CHECK(world_size >= 1, "file_store: world_size must be >= 1, got ", world_size,
                  " (store ", path_, ")");
    std::lock_guard lk(mu_);
    detail::unique_fd fd = open_or_create();
    lock(fd.get(), LOCK_EX, "file_store");
    refresh_locked("file_store", fd.get());
    add_locked("file_store", fd.get(), users_key, 1);
  }

  /// Counts this file_store out; the last one of world_size removes the file.
  ~file_store() override {
    try {
      std::lock_guard lk(mu_);
      with_file("~file_store", LOCK_EX, [&](int fd) {
        refresh_locked("~file_store", fd);
        const std::int64_t finished = add_locked("~file_store", fd, finished_key, 1);
        const std::int64_t users = add_locked("~file_store", fd, users_key, -1);
        // Unlinked under the lock, so nobody appends to a file that is already gone; and only
        // while the path still names the file this store opened.
        struct stat st {};
        if (finished >= world_size_ && users == 0 && ::stat(path_.c_str(), &st) == 0 &&
            st.st_dev == dev_ && st.st_ino == ino_)
          ::unlink(path_.c_str());
      });
    } catch (const std::exception& e) {
      // A destructor must not throw; at worst the file stays behind, which the log says.
      detail::log(log_level::error, "store", "~file_store: could not clean up ", path_, ": ", e.what());
    } catch (...) {
      detail::log(log_level::error, "store", "~file_store: could not clean up ", path_);
    }
  }

  /// The store file.
  const std::string& path() const noexcept { return path_; }
  /// The number of ranks using the store, as given.
  int world_size() const noexcept { return world_size_; }

  /// The file's path, as given.
  std::string describe() const override { return path_; }

  /// store::set: appends a record under the exclusive lock.
  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    detail::check_store_entry("file_store::set", key, value.size());
    std::lock_guard lk(mu_);
    with_file("file_store::set", LOCK_EX, [&](int fd) {
      refresh_locked("file_store::set", fd);
      append_locked("file_store::set", fd, key, value);
    });
  }

  /// store::get: re-reads new records until `key` shows up or the timeout passes.
  std::vector<std::uint8_t> get(const std::string& key) override {
    const auto t = timeout();
    std::vector<std::uint8_t> value;
    poll_until(
        t,
        [&] {
          refresh("file_store::get");
          std::lock_guard lk(mu_);
          auto it = cache_.find(key);
          if (it == cache_.end()) return false;
          value = it->second;
          return true;
        },
        [&] {
          CCGRAPH_THROW(timeout_error, "file_store::get: key '", key, "' was not set within ",
                        detail::timeout_text(t), " (store ", path_, ")");
        });
    return value;
  }

  /// store::check: one read of the new records.
  bool check(const std::vector<std::string>& keys) override {
    refresh("file_store::check");
    std::lock_guard lk(mu_);
    return missing_locked(keys).empty();
  }

  /// store::wait: re-reads new records until every key shows up or the timeout passes.
  void wait(const std::vector<std::string>& keys) override {
    const auto t = timeout();
    poll_until(
        t, [&] { return check(keys); },
        [&] {
          std::vector<std::string> missing;
          {
            std::lock_guard lk(mu_);
            missing = missing_locked(keys);
          }
          CCGRAPH_THROW(timeout_error, "file_store::wait: ", missing.size(), " of ", keys.size(),
                        " keys not set within ", detail::timeout_text(t), ": ",
                        detail::quote_keys(missing), " (store ", path_, ")");
        });
  }

  /// store::add: read, add and append under one exclusive lock, so atomic across processes.
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    detail::check_store_entry("file_store::add", key, 0);
    std::lock_guard lk(mu_);
    return with_file("file_store::add", LOCK_EX, [&](int fd) {
      refresh_locked("file_store::add", fd);
      return add_locked("file_store::add", fd, key, delta);
    });
  }

 private:
  using clock = std::chrono::steady_clock;

  // Bookkeeping keys for removing the file once every rank is done with it.
  static constexpr const char* users_key = "__ccgraph/file_store/users";
  static constexpr const char* finished_key = "__ccgraph/file_store/finished";

  // The header: what makes a file ours.
  static constexpr char magic[8] = {'c', 'c', 'g', 's', 't', 'o', 'r', 'e'};
  static constexpr std::uint32_t format_version = 1;
  static constexpr std::size_t header_bytes = 16;

  /// Calls `done()` until it returns true, sleeping 1 ms, then doubling up to 20 ms, between
  /// tries; once `limit` has passed (after one last try) calls `fail()`, which throws.
  template <class Done, class Fail>
  static void poll_until(std::chrono::milliseconds limit, Done&& done, Fail&& fail) {
    const auto deadline = detail::deadline_after(clock::now(), limit);
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      if (done()) return;
      const auto now = clock::now();
      if (now >= deadline) fail();
      std::this_thread::sleep_for(std::min<clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
  }

  /// The header of a file this ccgraph makes for world_size_ ranks.
  std::array<std::uint8_t, header_bytes> header() const {
    std::array<std::uint8_t, header_bytes> h{};
    std::memcpy(h.data(), magic, sizeof magic);
    for (int i = 0; i < 4; ++i) {
      h[static_cast<std::size_t>(8 + i)] = static_cast<std::uint8_t>(format_version >> (24 - 8 * i));
      h[static_cast<std::size_t>(12 + i)] =
          static_cast<std::uint8_t>(static_cast<std::uint32_t>(world_size_) >> (24 - 8 * i));
    }
    return h;
  }

  /// Opens the store file, creating it when it does not exist, and checks that it is one:
  /// a regular file with this ccgraph's header for world_size_ ranks. Remembers its identity
  /// (device and inode): every later open must find the same file. Requires mu_.
  detail::unique_fd open_or_create() {
    for (int attempt = 0; attempt < 100; ++attempt) {
      // O_NONBLOCK: opening a FIFO or a device someone named by mistake must not block.
      detail::unique_fd fd(::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
      if (fd) {
        verify(fd.get());
        return fd;
      }
      if (errno != ENOENT)
        CCGRAPH_THROW(error, "file_store: cannot open the store file '", path_,
                      "': ", detail::errno_message(errno));
      if (auto made = create()) return std::move(*made);
      // Another rank created it between our open and link: open theirs.
    }
    CCGRAPH_THROW(error, "file_store: the store file '", path_,
                  "' keeps appearing and disappearing; is another job using this path?");
  }

  /// Creates the store file: header written (and flushed, for NFS) under a temporary name in
  /// the same directory, then linked to the path, which fails if the path exists. So the path
  /// never names a file without its header. nullopt when another rank's file won the race.
  std::optional<detail::unique_fd> create() {
    std::string tmp = path_ + ".tmp-XXXXXX";
    detail::unique_fd fd(::mkostemp(tmp.data(), O_CLOEXEC));
    if (!fd)
      CCGRAPH_THROW(error, "file_store: cannot create the store file '", path_,
                    "' (a temporary file next to it failed: ", detail::errno_message(errno), ")");
    struct remove_tmp {
      const std::string& name;
      ~remove_tmp() { ::unlink(name.c_str()); }
    } cleanup{tmp};
    const auto h = header();
    if (::pwrite(fd.get(), h.data(), h.size(), 0) != static_cast<ssize_t>(h.size()) ||
        ::fsync(fd.get()) != 0)
      CCGRAPH_THROW(error, "file_store: writing the header of the store file '", path_,
                    "' failed: ", detail::errno_message(errno));
    if (::link(tmp.c_str(), path_.c_str()) != 0) {
      const int e = errno;
      if (e == EEXIST) return std::nullopt;
      CCGRAPH_THROW(error, "file_store: cannot create the store file '", path_,
                    "': ", detail::errno_message(e),
                    e == EPERM || e == ENOTSUP ? " (the filesystem needs hard links)" : "");
    }
    verify(fd.get());
    return std::optional<detail::unique_fd>(std::move(fd));
  }

  /// Checks that `fd` is a store file of this format for world_size_ ranks and remembers its
  /// identity; anything else is an error naming the path and what was found, and the file is
  /// left as it was.
  void verify(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0)
      CCGRAPH_THROW(error, "file_store: fstat on '", path_, "' failed: ", detail::errno_message(errno));
    CCGRAPH_CHECK(S_ISREG(st.st_mode), "file_store: '", path_,
                  "' exists and is not a regular file; it was left unchanged (give "
                  "CCGRAPH_STORE_FILE a fresh path)");
    std::array<std::uint8_t, header_bytes> got{};
    std::size_t n = 0;
    while (n < got.size()) {
      const ssize_t r = ::pread(fd, got.data() + n, got.size() - n, static_cast<off_t>(n));
      if (r > 0) {
        n += static_cast<std::size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) break;
      CCGRAPH_THROW(error, "file_store: reading '", path_, "' failed: ", detail::errno_message(errno));
    }
    if (n < header_bytes || std::memcmp(got.data(), magic, sizeof magic) != 0) {
      std::string start;
      for (std::size_t i = 0; i < n; ++i) {
        static constexpr char hex[] = "0123456789abcdef";
        if (i) start += ' ';
        start += hex[got[i] >> 4];
        start += hex[got[i] & 15];
      }
      CCGRAPH_THROW(error, "file_store: '", path_, "' exists but is not a file_store file (",
                    st.st_size, " bytes",
                    n ? detail::concat(", starting ", start) : std::string(),
                    "); it was left unchanged (give CCGRAPH_STORE_FILE a fresh path)");
    }
    const std::uint32_t version = detail::load_u32(got.data() + 8);
    const std::uint32_t ws = detail::load_u32(got.data() + 12);
    CCGRAPH_CHECK(version == format_version, "file_store: '", path_,
                  "' is a file_store file of format version ", version, ", this ccgraph reads version ",
                  format_version, "; it was left unchanged");
    CCGRAPH_CHECK(ws == static_cast<std::uint32_t>(world_size_), "file_store: '", path_,
                  "' was made for world_size ", ws, " but this rank joins with world_size ",
                  world_size_, "; every rank must be started with the same WORLD_SIZE");
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    offset_ = header_bytes;
    cache_.clear();
  }

  void lock(int fd, int op, const char* call) const {
    while (::flock(fd, op) != 0) {
      if (errno == EINTR) continue;
      CCGRAPH_THROW(error, call, ": flock on '", path_, "' failed: ", detail::errno_message(errno));
    }
  }

  /// Opens the file, takes flock(`op`) on it, checks it is still the file this store opened,
  /// and calls `f(fd)`. Closing the descriptor drops the lock (and on NFS, flushes what was
  /// written). Each call opens its own descriptor: flock() locks conflict between
  /// descriptors, so threads of one process exclude each other as processes do. Requires mu_.
  template <class F>
  std::invoke_result_t<F&, int> with_file(const char* call, int op, F&& f) {
    detail::unique_fd fd(::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
    if (!fd) {
      const int e = errno;
      CCGRAPH_THROW(error, call, ": cannot open the store file '", path_,
                    "': ", detail::errno_message(e),
                    e == ENOENT ? " (it was removed while in use)" : "");
    }
    lock(fd.get(), op, call);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
      CCGRAPH_THROW(error, call, ": fstat on '", path_, "' failed: ", detail::errno_message(errno));
    CCGRAPH_CHECK(st.st_dev == dev_ && st.st_ino == ino_, call, ": '", path_,
                  "' is no longer the store file this file_store opened (it was replaced while "
                  "in use); it was left unchanged");
    return f(fd.get());
  }

  /// Reads the records appended since the last look, under a shared lock.
  void refresh(const char* call) {
    std::lock_guard lk(mu_);
    with_file(call, LOCK_SH, [&](int fd) { refresh_locked(call, fd); });
  }

  /// Reads the complete records past offset_ into cache_. An incomplete record at the end (its
  /// writer is appending, or died doing so) is left for later. Requires mu_ and a lock on
  /// `fd`, a file verified as ours.
  void refresh_locked(const char* call, int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0)
      CCGRAPH_THROW(error, call, ": fstat on '", path_, "' failed: ", detail::errno_message(errno));
    const auto size = static_cast<std::uint64_t>(st.st_size);
    // Only a torn record past every reader's offset is ever cut off: shorter means someone
    // else truncated the file.
    CCGRAPH_CHECK(size >= offset_, call, ": the store file '", path_, "' shrank from ", offset_,
                  " to ", size, " bytes while in use (did another program write to it?)");
    if (size == offset_) return;
    std::vector<std::uint8_t> buf(static_cast<std::size_t>(size - offset_));
    std::size_t got = 0;
    while (got < buf.size()) {
      const ssize_t r =
          ::pread(fd, buf.data() + got, buf.size() - got, static_cast<off_t>(offset_ + got));
      if (r > 0) {
        got += static_cast<std::size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) break;
      CCGRAPH_THROW(error, call, ": reading '", path_, "' failed: ", detail::errno_message(errno));
    }
    std::size_t pos = 0;
    for (;;) {
      if (got - pos < 4) break;
      const std::size_t klen = detail::load_u32(buf.data() + pos);
      if (klen > detail::store_max_key_bytes) corrupt(call, pos, "key", klen);
      if (got - pos - 4 < klen + 4) break;
      const std::size_t vlen = detail::load_u32(buf.data() + pos + 4 + klen);
      if (vlen > detail::store_max_value_bytes) corrupt(call, pos, "value", vlen);
      if (got - pos - 8 - klen < vlen) break;
      const auto* k = reinterpret_cast<const char*>(buf.data() + pos + 4);
      const auto* v = buf.data() + pos + 8 + klen;
      cache_[std::string(k, klen)] = std::vector<std::uint8_t>(v, v + vlen);
      pos += 8 + klen + vlen;
    }
    offset_ += pos;
  }

  [[noreturn]] void corrupt(const char* call, std::size_t pos, const char* what,
                            std::size_t len) const {
    CCGRAPH_THROW(error, call, ": the store file '", path_, "' is corrupt: the record at offset ",
                  offset_ + pos, " claims a ", what, " of ", len, " bytes, more than the limit");
  }

  /// Appends one record. Requires mu_, an exclusive lock on `fd` and a refresh under it.
  void append_locked(const char* call, int fd, const std::string& key,
                     const std::vector<std::uint8_t>& value) {
    // What is left past offset_ after a refresh under the exclusive lock is a record whose
    // writer died halfway: cut it off, or every later record would be read as garbage. (The
    // file is ours: verify() saw its header and with_file() its identity.)
    struct stat st {};
    if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) > offset_ &&
        ::ftruncate(fd, static_cast<off_t>(offset_)) != 0)
      CCGRAPH_THROW(error, call, ": truncating a torn record in '", path_,
                    "' failed: ", detail::errno_message(errno));
    detail::byte_writer w(false);
    w.str(key);
    w.bytes(value);
    const std::vector<std::uint8_t> rec = std::move(w).finish();
    std::size_t put = 0;
    while (put < rec.size()) {
      const ssize_t r =
          ::pwrite(fd, rec.data() + put, rec.size() - put, static_cast<off_t>(offset_ + put));
      if (r > 0) {
        put += static_cast<std::size_t>(r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      CCGRAPH_THROW(error, call, ": writing key '", key, "' to '", path_,
                    "' failed: ", detail::errno_message(errno));
    }
    offset_ += rec.size();
    cache_[key] = value;
  }

  /// add() under the lock: read-modify-append. Requires what append_locked() does.
  std::int64_t add_locked(const char* call, int fd, const std::string& key, std::int64_t delta) {
    auto it = cache_.find(key);
    std::int64_t value = 0;
    try {
      value = detail::counter_add(key, it == cache_.end() ? nullptr : &it->second, delta);
    } catch (const error& e) {
      CCGRAPH_THROW(error, call, ": ", e.what(), " (store ", path_, ")");
    }
    append_locked(call, fd, key, detail::counter_bytes(value));
    return value;
  }

  std::vector<std::string> missing_locked(const std::vector<std::string>& keys) const {
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!cache_.count(k)) missing.push_back(k);
    return missing;
  }

  std::string path_;
  int world_size_;
  std::mutex mu_;  // guards the cache below, shared by the threads using this file_store
  std::unordered_map<std::string, std::vector<std::uint8_t>> cache_;
  std::uint64_t offset_ = header_bytes;  // end of the last complete record read
  dev_t dev_ = 0;  // the file this store opened: every later open must find it
  ino_t ino_ = 0;
};

/// Blocks until all `world_size` ranks have called barrier() with the same `name` (rank is this
/// caller's), through `s`. A name can be reused: each round counts on. Throws timeout_error
/// naming the barrier and how many ranks arrived when they do not all come within s.timeout().
///
/// Built on add() and wait(), as c10d's store barrier: each rank adds 1 to a counter; the last
/// to arrive sets this round's "done" key, the others wait for it. The last does not wait
/// itself: with a tcp_store, a released rank 0 may stop the server at once.
inline void barrier(store& s, const std::string& name, int rank, int world_size) {
  CCGRAPH_CHECK(world_size >= 1, "barrier '", name, "': world_size must be >= 1, got ", world_size);
  CCGRAPH_CHECK(rank >= 0 && rank < world_size, "barrier '", name, "': rank ", rank,
                " is out of range for world_size ", world_size);
  const std::string prefix = "__ccgraph/barrier/" + name + "/";
  const std::string counter = prefix + "arrived";
  const std::int64_t arrived = s.add(counter, 1);
  const std::int64_t round = (arrived - 1) / world_size;
  const std::string done = prefix + "done/" + std::to_string(round);
  if (arrived % world_size == 0) {
    s.set(done, {1});
    detail::log(log_level::debug, "store", "barrier '", name, "': rank ", rank, " arrived last of ", world_size);
    return;
  }
  try {
    s.wait({done});
  } catch (const timeout_error& e) {
    std::string count = "?";
    try {
      count = std::to_string(s.add(counter, 0) - round * world_size);
    } catch (const std::exception&) {
      // The count only improves the message; the timeout is the error.
    }
    CCGRAPH_THROW(timeout_error, "barrier '", name, "': rank ", rank, " waited ",
                  detail::timeout_text(s.timeout()), " but only ", count, " of ", world_size,
                  " ranks arrived (", e.what(), ")");
  }
}

/// The variables one launcher sets for a process's place in the job (`local_world_size` null:
/// the launcher has no plain one).
struct launcher_env {
  const char* launcher;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

/// The launchers env_config::from_env reads, in order: the first whose rank variable is set
/// gives the rank, world size and local rank. RANK (torchrun, scripts/ccgraph-launch, or set by
/// hand) wins, so a job can always say it explicitly; MPI before Slurm, since mpirun inside a
/// Slurm allocation leaves Slurm's variables describing the allocation, not the ranks.
inline constexpr launcher_env launcher_envs[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

/// Where this process sits in the job, read from the environment a launcher sets: torchrun's
/// (and scripts/ccgraph-launch's) variables, Open MPI's or MPICH's under mpirun / mpiexec, or
/// Slurm's under srun (launcher_envs).
struct env_config {
  int rank = 0;                           ///< RANK: this process's rank in the job
  int world_size = 1;                     ///< WORLD_SIZE: the number of ranks
  int local_rank = 0;                     ///< LOCAL_RANK: the rank on this machine (its GPU)
  int local_world_size = 1;               ///< LOCAL_WORLD_SIZE: ranks on this machine
  std::string master_addr = "127.0.0.1";  ///< MASTER_ADDR: where rank 0's tcp_store listens
  int master_port = 29500;                ///< MASTER_PORT: its port
  std::string launcher = "torchrun";      ///< whose variables gave the rank (launcher_envs)

  /// Reads the rank and world size (required), the local rank (default: the rank) and local world
  /// size (default: the world size) from the first launcher of launcher_envs whose rank variable
  /// is set (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID), and MASTER_ADDR (default
  /// 127.0.0.1) and MASTER_PORT (default 29500), which every launcher needs (mpirun and srun
  /// set neither: on one machine the defaults do; across machines set MASTER_ADDR to rank 0's
  /// host). A variable that is missing, not an integer or out of range gives an error naming it
  /// and its value.
  static env_config from_env() {
    return from_env([](const char* name) -> std::optional<std::string> {
      if (const char* v = std::getenv(name)) return std::string(v);
      return std::nullopt;
    });
  }

  /// from_env() reading the variables through `lookup` (nullopt: unset) instead of the
  /// process environment: for tests, and for configurations held elsewhere.
  static env_config from_env(const std::function<std::optional<std::string>(const char*)>& lookup) {
    constexpr const char* call = "env_config::from_env";
    const launcher_env* l = nullptr;
    for (const launcher_env& e : launcher_envs) {
      if (lookup(e.rank)) {
        l = &e;
        break;
      }
    }
    CCGRAPH_CHECK(l != nullptr || lookup("WORLD_SIZE"), call,
                  ": RANK is not set; start one process per rank with a launcher that sets RANK, "
                  "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                  "(scripts/ccgraph-launch -n N program, or torchrun), or under mpirun (Open MPI, "
                  "MPICH) or srun (Slurm), whose variables are read too");
    if (!l) l = &launcher_envs[0];  // WORLD_SIZE without RANK: say that RANK is missing
    const auto required = [&](const char* name) {
      const auto v = lookup(name);
      CCGRAPH_CHECK(v.has_value(), call, ": ", name,
                    " is not set; start one process per rank with a launcher that sets RANK, "
                    "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                    "(scripts/ccgraph-launch -n N program, or torchrun)",
                    l == &launcher_envs[0] ? "" : detail::concat(", or the ", l->launcher, " variables ",
                                                                 l->rank, " and ", l->world_size));
      return parse(name, *v);
    };
    const auto in_range = [&](const char* name, long long v, long long lo, long long hi,
                              const std::string& bounds) {
      CCGRAPH_CHECK(v >= lo && v <= hi, call, ": ", name, "=", v, " must be in ", bounds);
      return static_cast<int>(v);
    };
    env_config c;
    c.launcher = l->launcher;
    c.world_size = in_range(l->world_size, required(l->world_size), 1, std::numeric_limits<int>::max(),
                            "[1, 2147483647]");
    c.rank = in_range(l->rank, required(l->rank), 0, c.world_size - 1,
                      detail::concat("[0, ", l->world_size, "=", c.world_size, ")"));
    // Slurm's tasks per node may read "2(x3)" (uneven nodes): only a plain number is used.
    const auto lws = lookup(l->local_world_size);
    const bool plain_lws = lws && (l != &launcher_envs[3] || (!lws->empty() && lws->find_first_not_of(
                                                                  "0123456789") == std::string::npos));
    c.local_world_size =
        plain_lws ? in_range(l->local_world_size, parse(l->local_world_size, *lws), 1, c.world_size,
                             detail::concat("[1, ", l->world_size, "=", c.world_size, "]"))
                  : c.world_size;
    const std::string local_bounds =
        detail::concat("[0, ", plain_lws ? l->local_world_size : l->world_size, "=", c.local_world_size, ")");
    if (const auto lr = lookup(l->local_rank)) {
      c.local_rank =
          in_range(l->local_rank, parse(l->local_rank, *lr), 0, c.local_world_size - 1, local_bounds);
    } else {
      CCGRAPH_CHECK(c.rank < c.local_world_size, call, ": ", l->local_rank, " is not set, so it defaults to ",
                    l->rank, "=", c.rank, ", which must be in ", local_bounds, "; set ", l->local_rank, " too");
      c.local_rank = c.rank;
    }
    if (const auto a = lookup("MASTER_ADDR")) {
      CCGRAPH_CHECK(!a->empty(), call,
                    ": MASTER_ADDR is set but empty; set it to rank 0's "
                    "host name or IP address, or unset it for 127.0.0.1");
      c.master_addr = *a;
    }
    if (const auto p = lookup("MASTER_PORT"))
      c.master_port = in_range("MASTER_PORT", parse("MASTER_PORT", *p), 1, 65535, "[1, 65535]");
    return c;
  }

 private:
  /// The integer value of environment variable `name`, or an error naming it and the text.
  static long long parse(const char* name, const std::string& text) {
    return detail::parse_env_integer(name, text, std::numeric_limits<std::int64_t>::min(),
                                     std::numeric_limits<std::int64_t>::max(), "an integer");
  }
};

/// The store a process of a launched job rendezvouses through: a file_store at
/// $CCGRAPH_STORE_FILE when that is set (and not empty), else a tcp_store at
/// cfg.master_addr:cfg.master_port served by rank 0, which listens where MASTER_ADDR points, or
/// on every interface when $CCGRAPH_STORE_BIND is `all` (`master_addr`, the default, or `all`).
/// Blocking calls time out after $CCGRAPH_STORE_TIMEOUT_S seconds (a positive number, fractions
/// allowed) when set, else 300 s. A variable with any other value is an error naming it.
inline std::unique_ptr<store> make_store_from_env(const env_config& cfg) {
  const std::chrono::milliseconds timeout =
      detail::env_seconds("CCGRAPH_STORE_TIMEOUT_S", std::chrono::seconds(300));
  const bool bind_all =
      detail::env_choice<bool>("CCGRAPH_STORE_BIND", {{"master_addr", false}, {"all", true}});
  if (const auto f = detail::env_text("CCGRAPH_STORE_FILE")) {
    if (bind_all)
      detail::log(log_level::warn, "store", "CCGRAPH_STORE_BIND=all is ignored: CCGRAPH_STORE_FILE is set, so ",
                  "ranks meet through the file ", *f, ", not over TCP");
    detail::log(log_level::info, "store", "rank ", cfg.rank, " of ", cfg.world_size, " meets through the file ", *f);
    return std::make_unique<file_store>(*f, cfg.world_size, timeout);
  }
  tcp_store_options opt;
  opt.timeout = timeout;
  opt.bind_all_interfaces = bind_all;
  return std::make_unique<tcp_store>(cfg.master_addr, cfg.master_port, cfg.rank == 0,
                                     cfg.world_size, opt);
}

}  // namespace ccgraph
