// bench/progress.hpp: one line on the terminal saying how far a long run has got, rewritten in
// place ("\r") and erased before the run prints anything else to the same stream. Nothing at
// all when that stream is not a terminal (a file, a pipe, CI's log), so recorded output stays
// exactly the tables.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace bench {

/// Progress through `total` steps of a long run, on `out` (stderr by default) when it is a
/// terminal: "[k/total, 12 s, ~40 s left] what". A run that prints its results to stdout as it
/// goes passes `unless_stdout_is_a_terminal`: then the line shows only while stdout goes to a
/// file (`bench_gpu > results.md`), where it cannot land in the middle of a printed row.
class progress {
 public:
  explicit progress(std::size_t total, std::FILE* out = stderr, bool unless_stdout_is_a_terminal = false)
      : total_(total), out_(out),
        tty_(out != nullptr && isatty(fileno(out)) != 0 && !(unless_stdout_is_a_terminal && isatty(fileno(stdout)) != 0)),
        start_(std::chrono::steady_clock::now()) {}
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress() { clear(); }

  /// True when the line is shown (the stream is a terminal).
  bool shown() const { return tty_; }

  /// Starts the next step, described by `what` (replacing the line). The estimate of what is
  /// left assumes the remaining steps take as long as the finished ones did on average.
  void step(const std::string& what) {
    ++done_;
    if (!tty_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::string line = "[" + std::to_string(done_) + "/" + std::to_string(total_) + ", " + seconds(s);
    if (done_ > 1 && done_ <= total_)
      line += ", ~" + seconds(s / static_cast<double>(done_ - 1) * static_cast<double>(total_ - done_ + 1)) + " left";
    line += "] " + what;
    if (line.size() > 100) line.resize(100);  // one terminal line: \r only rewrites the last
    std::fprintf(out_, "\r%s\033[K", line.c_str());
    std::fflush(out_);
    visible_ = true;
  }

  /// Erases the line (before printing anything else to the same stream).
  void clear() {
    if (!visible_) return;
    std::fprintf(out_, "\r\033[K");
    std::fflush(out_);
    visible_ = false;
  }

 private:
  static std::string seconds(double s) {
    if (s < 100) return std::to_string(static_cast<long>(s + 0.5)) + " s";
    return std::to_string(static_cast<long>(s / 60 + 0.5)) + " min";
  }

  std::size_t total_;
  std::size_t done_ = 0;
  std::FILE* out_;
  bool tty_;
  bool visible_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace bench
