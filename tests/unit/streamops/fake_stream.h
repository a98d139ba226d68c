// A stream without a GPU: a CPU thread runs what was enqueued, in order.
// A write stores the value (release); a wait polls the word (acquire) until
// it reaches the value, cyclic GEQ as cuStreamWaitValue32 compares; host
// functions stand in for kernels. Every wait is bounded (`stuck()` says
// which one gave up).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/streamops/engine.h"

namespace ufab::streamops {

class FakeStream final : public Stream {
 public:
  explicit FakeStream(std::chrono::milliseconds limit = std::chrono::seconds(10)) : limit_(limit) {
    thread_ = std::thread([this] { run(); });
  }
  ~FakeStream() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Status write_value(uint32_t* word, uint32_t value) override {
    if (refuse_) return fail(EIO, "the fake stream refuses (a CUDA error)");
    return push([word, value](bool) {
      std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release);
      return true;
    });
  }
  Status wait_value(uint32_t* word, uint32_t value) override {
    if (refuse_) return fail(EIO, "the fake stream refuses (a CUDA error)");
    return push([word, value](bool) {
      return static_cast<int32_t>(std::atomic_ref<uint32_t>(*word).load(std::memory_order_acquire) - value) >= 0;
    });
  }
  // A "kernel": runs on the stream's thread when the stream gets there.
  void host(std::function<void()> fn) {
    (void)push([fn = std::move(fn)](bool) {
      fn();
      return true;
    });
  }
  // Blocks the stream until open() (a kernel that runs long).
  void gate() {
    (void)push([this](bool) { return gate_open_.load(); });
  }
  void open() { gate_open_ = true; }
  // Waits (bounded) until everything enqueued has run; false on a timeout.
  bool synchronize(std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return queue_.empty() && !busy_; });
  }
  void refuse(bool r) { refuse_ = r; }
  std::string stuck() const {
    std::lock_guard lock(mu_);
    return stuck_;
  }

 private:
  Status push(std::function<bool(bool)> op) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
    return {};
  }
  void run() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      auto op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      auto until = std::chrono::steady_clock::now() + limit_;
      bool ok = false;
      while (!(ok = op(false)) && std::chrono::steady_clock::now() < until && !stop_) std::this_thread::yield();
      lock.lock();
      if (!ok && stuck_.empty()) stuck_ = "a stream wait gave up after its time limit";
      busy_ = false;
      cv_.notify_all();
    }
  }
  const std::chrono::milliseconds limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<bool(bool)>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::string stuck_;
  std::atomic<bool> gate_open_{false};
  std::atomic<bool> refuse_{false};
  std::thread thread_;
};

}  // namespace ufab::streamops
