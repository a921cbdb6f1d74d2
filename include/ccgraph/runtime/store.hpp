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

#include <ccgraph/core/error.hpp>
#include <ccgraph/core/timeout.hpp>

namespace ccgraph {

/// A key-value store shared by the ranks of one job, used to rendezvous: one rank sets a key
/// (an NCCL unique id, an address), the others get it. Keys are strings, values are bytes.
/// Blocking calls (get, wait) give up after timeout() with a timeout_error that names the keys,
/// the store and the timeout. Every member may be called from several threads at once.
class store {
 public:
  /// A store whose blocking calls wait at most `timeout` (positive).
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

  /// Changes the timeout of later calls (calls already blocked keep theirs); must be positive.
  void set_timeout(std::chrono::milliseconds timeout) {
    CCGRAPH_CHECK(timeout.count() > 0, "store::set_timeout: the timeout must be positive, got ",
                  timeout.count(), " ms");
    // Atomic: one thread may change the timeout while others are in get().
    timeout_ms_.store(static_cast<std::int64_t>(timeout.count()), std::memory_order_relaxed);
  }

 private:
  std::atomic<std::int64_t> timeout_ms_;
};

namespace detail {

/// Longest key a store accepts (bounds what a peer can make the server allocate).
inline constexpr std::size_t store_max_key_bytes = std::size_t{1} << 20;
/// Largest value a store accepts.
inline constexpr std::size_t store_max_value_bytes = std::size_t{1} << 30;
/// Largest tcp_store message: a value plus its key and header, or a long list of keys.
inline constexpr std::size_t store_max_frame_bytes = (std::size_t{1} << 31) - 1;

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

// The tcp_store protocol. Every message is a frame: a big-endian u32 payload length, then the
// payload. A request's payload is a command byte and its fields; a reply's is a status byte and
// its fields. One connection carries one request at a time (the client pools connections).
//
//   set    key:str value:bytes              -> ok
//   get    timeout_ms:u64 key:str           -> ok value:bytes | timed_out
//   add    key:str delta:i64                -> ok value:i64 | failed message:str
//   check  n:u32 keys:str*n                 -> ok all_set:u8
//   wait   timeout_ms:u64 n:u32 keys:str*n  -> ok | timed_out n:u32 missing:str*n
//
// get and wait block on the server, which replies `timed_out` itself when the timeout passes,
// so the connection stays in step and can be reused.
enum class tcp_cmd : std::uint8_t { set = 1, get = 2, add = 3, check = 4, wait = 5 };
enum class tcp_status : std::uint8_t { ok = 0, timed_out = 1, failed = 2 };

/// Sets TCP_NODELAY: requests and replies are small, and Nagle's algorithm with delayed acks
/// would add tens of milliseconds to each.
inline void set_nodelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// Milliseconds from now until `deadline` for poll(): rounded up (so a wait never ends early),
/// 0 once passed, capped to what an int holds.
inline int poll_ms_until(std::chrono::steady_clock::time_point deadline) {
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<std::int64_t>(ms, std::numeric_limits<int>::max()));
}

/// The tcp_store server: an in-memory table served to many clients by one background thread
/// that poll()s the listening socket, every client socket and a wake-up pipe. All its state but
/// the pipe's write end belongs to that thread, so nothing is shared and nothing is locked.
class tcp_store_server {
 public:
  /// Listens on `port` (0: a free port the kernel picks) on every IPv4 interface and starts the
  /// serving thread. Throws error naming the call and the port when the port cannot be bound.
  /// `shutdown_grace` bounds how long the destructor keeps serving connected clients.
  explicit tcp_store_server(int port, std::chrono::milliseconds shutdown_grace)
      : grace_(shutdown_grace) {
    listen_ = unique_fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!listen_)
      CCGRAPH_THROW(error, "tcp_store: socket() for the server on port ", port,
                    " failed: ", errno_message(errno));
    // A restarted job can bind its port again while the last job's connections sit in
    // TIME_WAIT.
    int one = 1;
    (void)::setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);  // as c10d: clients may come from any interface
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      const int e = errno;
      CCGRAPH_THROW(error, "tcp_store: bind to port ", port, " failed: ", errno_message(e),
                    e == EADDRINUSE ? " (another process uses it: pick another MASTER_PORT, or "
                                      "port 0 for a free one)"
                                    : "");
    }
    if (::listen(listen_.get(), SOMAXCONN) != 0)
      CCGRAPH_THROW(error, "tcp_store: listen on port ", port, " failed: ", errno_message(errno));
    socklen_t len = sizeof addr;
    if (::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      CCGRAPH_THROW(error, "tcp_store: getsockname on port ", port,
                    " failed: ", errno_message(errno));
    port_ = ntohs(addr.sin_port);
    int p[2];
    if (::pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0)
      CCGRAPH_THROW(error, "tcp_store: pipe() for the server on port ", port_,
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
  int port() const noexcept { return port_; }

 private:
  using clock = std::chrono::steady_clock;

  /// One connected client: its socket, what it sent that is not handled yet, what it has yet
  /// to receive, and the get or wait it is blocked in, if any.
  struct client {
    explicit client(unique_fd f) : fd(std::move(f)) {}
    unique_fd fd;
    std::vector<std::uint8_t> in;
    std::size_t in_pos = 0;
    std::vector<std::uint8_t> out;
    std::size_t out_pos = 0;
    bool closed = false;
    bool waiting = false;
    tcp_cmd wait_cmd = tcp_cmd::wait;
    std::vector<std::string> wait_keys;
    clock::time_point deadline{};
  };

  void run() {
    try {
      loop();
    } catch (...) {
      // Out of memory or poll() failing: stop serving. Closing every socket below makes each
      // client's call fail with "connection closed" instead of hanging until its timeout.
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
      // While stopping, the wake-up pipe (still readable) and the closed listener are left out.
      const std::size_t first_client = stopping ? 0 : 2;
      if (!stopping) {
        fds.push_back({wake_rd_.get(), POLLIN, 0});
        fds.push_back({listen_.get(), POLLIN, 0});
      }
      for (const auto& c : clients_) {
        short ev = POLLIN;  // also while a client waits: that is how its hang-up is seen
        if (c->out_pos < c->out.size()) ev = static_cast<short>(ev | POLLOUT);
        fds.push_back({c->fd.get(), ev, 0});
      }
      if (::poll(fds.data(), fds.size(), next_deadline_ms(stopping, stop_by)) < 0) {
        if (errno == EINTR) continue;
        CCGRAPH_THROW(error, "tcp_store: poll() failed: ", errno_message(errno));
      }
      const bool accept = !stopping && (fds[1].revents & POLLIN);
      if (!stopping && fds[0].revents != 0) {
        // Requests that came with the stop are still read and answered below.
        stopping = true;
        stop_by = clock::now() + grace_;
        listen_.reset();  // refuses new connections from here on
      }
      const std::size_t polled = clients_.size();  // accept_all() appends after these
      for (std::size_t i = 0; i < polled; ++i) {
        const short re = fds[i + first_client].revents;
        client& c = *clients_[i];
        if (re & (POLLIN | POLLHUP | POLLERR)) read_from(c);
        if ((re & POLLOUT) && !c.closed) flush(c);
      }
      if (accept && listen_) accept_all();
      serve_requests();
      expire_waits();
      std::erase_if(clients_, [](const std::unique_ptr<client>& c) { return c->closed; });
      if (stopping && (clock::now() >= stop_by || none_can_progress())) return;
    }
  }

  /// Whether no connected client can make progress: none is left, or each is blocked in a
  /// get/wait (new connections are refused, so no one could set their keys) with its reply
  /// sent.
  bool none_can_progress() const {
    return std::all_of(clients_.begin(), clients_.end(), [](const std::unique_ptr<client>& c) {
      return c->waiting && c->out_pos >= c->out.size();
    });
  }

  /// poll()'s timeout: until the earliest blocked get/wait times out (or, while stopping, the
  /// grace ends), or forever (-1).
  int next_deadline_ms(bool stopping, clock::time_point stop_by) const {
    std::optional<clock::time_point> first;
    if (stopping) first = stop_by;
    for (const auto& c : clients_)
      if (c->waiting && !c->closed && (!first || c->deadline < *first)) first = c->deadline;
    return first ? poll_ms_until(*first) : -1;
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN: none left. EMFILE and the like: try again on the next wake-up.
      }
      set_nodelay(fd);
      clients_.push_back(std::make_unique<client>(unique_fd(fd)));
    }
  }

  /// Reads everything the socket has (requests may arrive in pieces: they wait in `in` until
  /// complete). End of stream or an error closes the client.
  void read_from(client& c) {
    std::uint8_t buf[65536];
    for (;;) {
      const ssize_t r = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (r > 0) {
        c.in.insert(c.in.end(), buf, buf + r);
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.closed = true;  // 0: the client hung up; otherwise a reset
      return;
    }
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
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.closed = true;
      return;
    }
    c.out.clear();
    c.out_pos = 0;
  }

  void reply(client& c, std::vector<std::uint8_t> frame) {
    if (c.closed) return;
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

  /// Handles every complete request of every client not blocked in a get/wait; repeats while
  /// that makes progress, since a set can release a client that has more requests queued.
  void serve_requests() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (std::size_t i = 0; i < clients_.size(); ++i) {
        client& c = *clients_[i];
        while (!c.closed && !c.waiting) {
          const std::size_t avail = c.in.size() - c.in_pos;
          if (avail < 4) break;
          const std::size_t len = load_u32(c.in.data() + c.in_pos);
          if (len > store_max_frame_bytes || len == 0) {
            c.closed = true;  // not our protocol
            break;
          }
          if (avail - 4 < len) break;
          byte_reader rd(c.in.data() + c.in_pos + 4, len);
          try {
            handle(c, rd);
          } catch (const std::exception&) {
            c.closed = true;  // a malformed request: drop this client, serve the others
          }
          c.in_pos += 4 + len;
          progress = true;
        }
        if (c.in_pos == c.in.size()) {
          c.in.clear();
          c.in_pos = 0;
        } else if (c.in_pos > 0) {
          c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_pos));
          c.in_pos = 0;
        }
      }
    }
  }

  bool has_all(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& k) { return data_.count(k) != 0; });
  }

  void handle(client& c, byte_reader& rd) {
    switch (static_cast<tcp_cmd>(rd.u8())) {
      case tcp_cmd::set: {
        std::string key = rd.str();
        data_[std::move(key)] = rd.bytes();
        // Reply before waking the waiters: a waiter (rank 0 leaving a barrier) may stop this
        // server as soon as it is woken, and the setter must have its reply by then.
        reply(c, status_frame(tcp_status::ok));
        wake_waiters();
        return;
      }
      case tcp_cmd::get: {
        const std::uint64_t timeout_ms = rd.u64();
        std::string key = rd.str();
        if (auto it = data_.find(key); it != data_.end()) {
          reply(c, value_frame(it->second));
        } else {
          block(c, tcp_cmd::get, {std::move(key)}, timeout_ms);
        }
        return;
      }
      case tcp_cmd::add: {
        std::string key = rd.str();
        const std::int64_t delta = rd.i64();
        auto it = data_.find(key);
        std::int64_t value = 0;
        try {
          value = counter_add(key, it == data_.end() ? nullptr : &it->second, delta);
        } catch (const error& e) {
          byte_writer w(true);
          w.u8(static_cast<std::uint8_t>(tcp_status::failed));
          w.str(e.what());
          reply(c, std::move(w).finish());
          return;
        }
        data_[std::move(key)] = counter_bytes(value);
        byte_writer w(true);
        w.u8(static_cast<std::uint8_t>(tcp_status::ok));
        w.i64(value);
        reply(c, std::move(w).finish());
        wake_waiters();
        return;
      }
      case tcp_cmd::check: {
        const std::vector<std::string> keys = rd.strs(rd.u32());
        byte_writer w(true);
        w.u8(static_cast<std::uint8_t>(tcp_status::ok));
        w.u8(has_all(keys) ? 1 : 0);
        reply(c, std::move(w).finish());
        return;
      }
      case tcp_cmd::wait: {
        const std::uint64_t timeout_ms = rd.u64();
        std::vector<std::string> keys = rd.strs(rd.u32());
        if (has_all(keys)) {
          reply(c, status_frame(tcp_status::ok));
        } else {
          block(c, tcp_cmd::wait, std::move(keys), timeout_ms);
        }
        return;
      }
    }
    CCGRAPH_THROW(error, "tcp_store: unknown command");
  }

  static std::vector<std::uint8_t> value_frame(const std::vector<std::uint8_t>& value) {
    byte_writer w(true);
    w.u8(static_cast<std::uint8_t>(tcp_status::ok));
    w.bytes(value);
    return std::move(w).finish();
  }

  void block(client& c, tcp_cmd cmd, std::vector<std::string> keys, std::uint64_t timeout_ms) {
    // Capped at ~30 years so that adding it to now() cannot overflow.
    const std::uint64_t capped = std::min<std::uint64_t>(timeout_ms, std::uint64_t{1} << 40);
    c.waiting = true;
    c.wait_cmd = cmd;
    c.wait_keys = std::move(keys);
    c.deadline = clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(capped));
  }

  /// Answers every blocked get/wait whose keys are all set now.
  void wake_waiters() {
    for (auto& cp : clients_) {
      client& c = *cp;
      if (!c.waiting || c.closed || !has_all(c.wait_keys)) continue;
      c.waiting = false;
      if (c.wait_cmd == tcp_cmd::get) {
        reply(c, value_frame(data_.at(c.wait_keys.front())));
      } else {
        reply(c, status_frame(tcp_status::ok));
      }
      c.wait_keys.clear();
    }
  }

  /// Answers `timed_out` to every blocked get/wait whose deadline has passed.
  void expire_waits() {
    const auto now = clock::now();
    for (auto& cp : clients_) {
      client& c = *cp;
      if (!c.waiting || c.closed || c.deadline > now) continue;
      c.waiting = false;
      byte_writer w(true);
      w.u8(static_cast<std::uint8_t>(tcp_status::timed_out));
      if (c.wait_cmd == tcp_cmd::wait) {
        std::vector<std::string> missing;
        for (const auto& k : c.wait_keys)
          if (!data_.count(k)) missing.push_back(k);
        w.u32(static_cast<std::uint32_t>(missing.size()));
        for (const auto& k : missing) w.str(k);
      }
      reply(c, std::move(w).finish());
      c.wait_keys.clear();
    }
  }

  std::chrono::milliseconds grace_;
  unique_fd listen_;
  unique_fd wake_rd_;
  unique_fd wake_wr_;
  int port_ = 0;
  // Owned by the serving thread (it starts after they are built and is joined before they go).
  std::unordered_map<std::string, std::vector<std::uint8_t>> data_;
  std::vector<std::unique_ptr<client>> clients_;
  std::thread thread_;  // last: started once everything it uses exists
};

}  // namespace detail

/// A store served over TCP by rank 0, the way c10d's TCPStore is: the server (`is_server`,
/// normally rank 0) listens on `port` on every IPv4 interface and serves the table from a
/// background thread; every rank, the server's included, is a client. Clients connect to
/// `host` (an IPv4 address or a hostname) and retry until timeout() passes, so the server may
/// start after them. Construction does not wait for the other ranks: use barrier() for that.
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
  /// use the store. Throws timeout_error naming host:port when no server answers in `timeout`,
  /// and error naming the port when the server cannot bind it. On the server, `shutdown_grace`
  /// bounds how long its destruction keeps serving ranks still connected (see ~tcp_store).
  tcp_store(std::string host, int port, bool is_server, int world_size,
            std::chrono::milliseconds timeout = std::chrono::seconds(300),
            std::chrono::milliseconds shutdown_grace = std::chrono::seconds(10))
      : store(timeout),
        host_(std::move(host)),
        port_(port),
        is_server_(is_server),
        world_size_(world_size) {
    CCGRAPH_CHECK(!host_.empty(), "tcp_store: host must not be empty");
    CCGRAPH_CHECK(world_size >= 1, "tcp_store: world_size must be >= 1, got ", world_size);
    if (is_server) {
      CCGRAPH_CHECK(port >= 0 && port <= 65535,
                    "tcp_store: the server's port must be in [0, 65535] (0: pick a free one), got ",
                    port);
      CCGRAPH_CHECK(shutdown_grace.count() >= 0,
                    "tcp_store: shutdown_grace must be >= 0 ms, got ", shutdown_grace.count());
      server_ = std::make_unique<detail::tcp_store_server>(port, shutdown_grace);
      port_ = server_->port();
    } else {
      CCGRAPH_CHECK(port >= 1 && port <= 65535,
                    "tcp_store: a client's port must be in [1, 65535], got ", port,
                    " (port 0, 'pick a free port', is for the server only)");
    }
    // Connect now, as c10d does: a missing server shows up here, not at some later get().
    idle_.push_back(connect("tcp_store", clock::now() + this->timeout()));
  }

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

  /// "host:port", as given (the real port when the server picked it).
  std::string describe() const override { return detail::concat(host_, ":", port_); }

  /// store::set: one request; the server wakes the ranks blocked on `key`.
  void set(const std::string& key, const std::vector<std::uint8_t>& value) override {
    detail::check_store_entry("tcp_store::set", key, value.size());
    detail::byte_writer w(true);
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
    auto reply = request("tcp_store::get", std::move(w).finish(), t + reply_grace);
    detail::byte_reader rd(reply);
    if (static_cast<detail::tcp_status>(rd.u8()) == detail::tcp_status::timed_out)
      CCGRAPH_THROW(timeout_error, "tcp_store::get: key '", key, "' was not set within ", t.count(),
                    " ms (store ", describe(), ")");
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
    auto reply = request("tcp_store::wait", std::move(w).finish(), t + reply_grace);
    detail::byte_reader rd(reply);
    if (static_cast<detail::tcp_status>(rd.u8()) == detail::tcp_status::timed_out) {
      const std::vector<std::string> missing = rd.strs(rd.u32());
      CCGRAPH_THROW(timeout_error, "tcp_store::wait: ", missing.size(), " of ", keys.size(),
                    " keys not set within ", t.count(), " ms: ", detail::quote_keys(missing),
                    " (store ", describe(), ")");
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

  static void put_keys(const char* call, detail::byte_writer& w,
                       const std::vector<std::string>& keys) {
    for (const auto& k : keys) detail::check_store_entry(call, k, 0);
    w.u32(static_cast<std::uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
  }

  void expect_ok(const char* call, detail::byte_reader& rd) const {
    const auto status = static_cast<detail::tcp_status>(rd.u8());
    if (status == detail::tcp_status::ok) return;
    if (status == detail::tcp_status::failed)
      CCGRAPH_THROW(error, call, ": ", rd.str(), " (store ", describe(), ")");
    CCGRAPH_THROW(error, call, ": unexpected reply status ", static_cast<int>(status), " from ",
                  describe());
  }

  /// Sends one request frame and returns the reply's payload (status byte first), waiting at
  /// most `limit` for the exchange. The connection goes back to the pool only after a complete
  /// exchange: one that failed halfway is out of step with the server, so it is closed.
  std::vector<std::uint8_t> request(const char* call, const std::vector<std::uint8_t>& frame,
                                    std::chrono::milliseconds limit) {
    detail::unique_fd fd = acquire(call);
    const auto deadline = clock::now() + limit;
    send_all(call, fd.get(), frame.data(), frame.size(), deadline, limit);
    std::uint8_t header[4];
    recv_all(call, fd.get(), header, 4, deadline, limit);
    const std::size_t len = detail::load_u32(header);
    if (len == 0 || len > detail::store_max_frame_bytes)
      CCGRAPH_THROW(error, call, ": malformed reply from ", describe(), " (length ", len,
                    "): is a tcp_store server listening there?");
    std::vector<std::uint8_t> payload(len);
    recv_all(call, fd.get(), payload.data(), len, deadline, limit);
    std::lock_guard lk(mu_);
    idle_.push_back(std::move(fd));
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
    return connect(call, clock::now() + timeout());
  }

  /// Connects to the server, retrying every failure (refused: the server is not up yet;
  /// unresolvable: its name is not published yet) with a growing pause until `deadline`.
  detail::unique_fd connect(const char* call, clock::time_point deadline) const {
    // The server's own client uses the loopback address: it listens on every interface, and
    // `host` may name an address this machine reaches itself by only through a detour.
    const std::string target = is_server_ ? std::string("127.0.0.1") : host_;
    const std::string service = std::to_string(port_);
    auto pause = std::chrono::milliseconds(10);
    std::string last_error;
    for (;;) {
      addrinfo hints{};
      hints.ai_family = AF_INET;
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_NUMERICSERV;
      addrinfo* found = nullptr;
      const int rc = ::getaddrinfo(target.c_str(), service.c_str(), &hints, &found);
      if (rc != 0) {
        last_error =
            detail::concat("getaddrinfo: ", rc == EAI_SYSTEM ? detail::errno_message(errno)
                                                             : std::string(::gai_strerror(rc)));
      } else {
        const std::unique_ptr<addrinfo, void (*)(addrinfo*)> list(found, ::freeaddrinfo);
        for (const addrinfo* ai = list.get(); ai; ai = ai->ai_next) {
          if (auto fd = try_connect(*ai, deadline, last_error)) return fd;
        }
      }
      const auto now = clock::now();
      if (now >= deadline)
        CCGRAPH_THROW(timeout_error, call, ": could not connect to ", describe(), " within ",
                      timeout().count(), " ms (last error: ", last_error,
                      "); is the server (rank 0) running and MASTER_ADDR/MASTER_PORT right?");
      std::this_thread::sleep_for(std::min<clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    }
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
      while ((n = ::poll(&p, 1, detail::poll_ms_until(deadline))) < 0 && errno == EINTR) {
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
      CCGRAPH_THROW(timeout_error, call, ": no reply from ", describe(), " within ", limit.count(),
                    " ms");
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
    } catch (...) {
      // A destructor must not throw; at worst the file stays behind.
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
                  s.timeout().count(), " ms but only ", count, " of ", world_size,
                  " ranks arrived (", e.what(), ")");
  }
}

/// Where this process sits in the job, read from the environment a launcher sets (the variables
/// torchrun and scripts/ccgraph-launch set).
struct env_config {
  int rank = 0;                           ///< RANK: this process's rank in the job
  int world_size = 1;                     ///< WORLD_SIZE: the number of ranks
  int local_rank = 0;                     ///< LOCAL_RANK: the rank on this machine (its GPU)
  int local_world_size = 1;               ///< LOCAL_WORLD_SIZE: ranks on this machine
  std::string master_addr = "127.0.0.1";  ///< MASTER_ADDR: where rank 0's tcp_store listens
  int master_port = 29500;                ///< MASTER_PORT: its port

  /// Reads RANK and WORLD_SIZE (required), LOCAL_RANK (default RANK), LOCAL_WORLD_SIZE
  /// (default WORLD_SIZE), MASTER_ADDR (default 127.0.0.1) and MASTER_PORT (default 29500).
  /// A variable that is missing, not an integer or out of range gives an error naming it and
  /// its value.
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
    const auto required = [&](const char* name) {
      const auto v = lookup(name);
      CCGRAPH_CHECK(v.has_value(), call, ": ", name,
                    " is not set; start one process per rank with a launcher that sets RANK, "
                    "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                    "(scripts/ccgraph-launch -n N program, or torchrun)");
      return parse(name, *v);
    };
    const auto in_range = [&](const char* name, long long v, long long lo, long long hi,
                              const std::string& bounds) {
      CCGRAPH_CHECK(v >= lo && v <= hi, call, ": ", name, "=", v, " must be in ", bounds);
      return static_cast<int>(v);
    };
    env_config c;
    c.world_size = in_range("WORLD_SIZE", required("WORLD_SIZE"), 1,
                            std::numeric_limits<int>::max(), "[1, 2147483647]");
    c.rank = in_range("RANK", required("RANK"), 0, c.world_size - 1,
                      detail::concat("[0, WORLD_SIZE=", c.world_size, ")"));
    const auto lws = lookup("LOCAL_WORLD_SIZE");
    c.local_world_size =
        lws ? in_range("LOCAL_WORLD_SIZE", parse("LOCAL_WORLD_SIZE", *lws), 1, c.world_size,
                       detail::concat("[1, WORLD_SIZE=", c.world_size, "]"))
            : c.world_size;
    const std::string local_bounds =
        detail::concat("[0, LOCAL_WORLD_SIZE=", c.local_world_size, ")");
    if (const auto lr = lookup("LOCAL_RANK")) {
      c.local_rank =
          in_range("LOCAL_RANK", parse("LOCAL_RANK", *lr), 0, c.local_world_size - 1, local_bounds);
    } else {
      CCGRAPH_CHECK(c.rank < c.local_world_size, call,
                    ": LOCAL_RANK is not set, so it defaults to RANK=", c.rank,
                    ", which must be in ", local_bounds, "; set LOCAL_RANK too");
      c.local_rank = c.rank;
    }
    if (const auto a = lookup("MASTER_ADDR")) {
      CCGRAPH_CHECK(!a->empty(), call,
                    ": MASTER_ADDR is set but empty; set it to rank 0's "
                    "host name or IPv4 address, or unset it for 127.0.0.1");
      c.master_addr = *a;
    }
    if (const auto p = lookup("MASTER_PORT"))
      c.master_port = in_range("MASTER_PORT", parse("MASTER_PORT", *p), 1, 65535, "[1, 65535]");
    return c;
  }

 private:
  /// The integer value of environment variable `name`, or an error naming it and the text.
  static long long parse(const char* name, const std::string& text) {
    long long v = 0;
    const char* last = text.data() + text.size();
    const auto [end, ec] = std::from_chars(text.data(), last, v);
    CCGRAPH_CHECK(!text.empty() && ec == std::errc() && end == last, "env_config::from_env: ", name,
                  "='", text, "' is not an integer");
    return v;
  }
};

/// The store a process of a launched job rendezvouses through: a file_store at
/// $CCGRAPH_STORE_FILE when that is set (and not empty), else a tcp_store at
/// cfg.master_addr:cfg.master_port served by rank 0. Blocking calls time out after
/// $CCGRAPH_STORE_TIMEOUT_S seconds (a positive number, fractions allowed) when set, else 300 s.
inline std::unique_ptr<store> make_store_from_env(const env_config& cfg) {
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  if (const char* s = std::getenv("CCGRAPH_STORE_TIMEOUT_S"); s && *s) {
    const std::string text(s);
    double v = 0;
    const char* last = text.data() + text.size();
    const auto [end, ec] = std::from_chars(text.data(), last, v);
    CCGRAPH_CHECK(ec == std::errc() && end == last && std::isfinite(v) && v > 0 && v <= 1e9,
                  "make_store_from_env: CCGRAPH_STORE_TIMEOUT_S='", text,
                  "' must be a positive number of seconds");
    timeout = std::chrono::milliseconds(
        std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(v * 1000))));
  }
  if (const char* f = std::getenv("CCGRAPH_STORE_FILE"); f && *f)
    return std::make_unique<file_store>(f, cfg.world_size, timeout);
  return std::make_unique<tcp_store>(cfg.master_addr, cfg.master_port, cfg.rank == 0,
                                     cfg.world_size, timeout);
}

}  // namespace ccgraph
