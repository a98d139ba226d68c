// The multi-thread stress of the soft-RoCE lanes, shared by the host test
// (lanes_stress_test.cc: swnic ports) and the VM test
// (tests/vm/cases/stress_vm_test.cc: vfio-bound e1000e and virtio-net).
//
// `threads` threads, each with its own QP pair (one QP on each device), its
// own CQs and buffers. Each thread sends `total` SENDs a -> b
// (sequence-numbered, checked in order at b), with an RDMA READ of
// kReadBytes every kReadEvery-th message (checked byte for byte), and drives
// both of its QPs by polling its own CQs. Every wait has a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ufab/rdma.hpp"

namespace ufab::lanes_stress {

using Clock = std::chrono::steady_clock;

inline constexpr int kThreads = 8;
inline constexpr uint32_t kReadEvery = 64;    // one READ per this many SENDs
inline constexpr uint32_t kReadBytes = 2048;  // two packets at the 1024-byte path MTU

struct ThreadResult {
  uint32_t k = 0;
  uint32_t qpn_a = 0, qpn_b = 0;  // the thread's QP on device a, on device b
  uint64_t received = 0;          // SENDs that arrived in order (== total when all went well)
  uint64_t reads = 0;             // READs completed and checked
  std::string error;              // empty when the thread finished cleanly
};

struct Result {
  uint64_t total = 0;  // SENDs per thread asked for
  double seconds = 0;
  std::vector<ThreadResult> threads;
  rdma::DeviceStats a{}, b{};  // device counters right after the run
};

// UFAB_STRESS_MESSAGES, or `fallback` (10^5) when unset.
uint64_t messages_per_thread(uint64_t fallback = 100000);

// Runs the stress between two open devices; `limit` bounds the whole run
// (a thread past it stops with a "deadline" error). Prints one summary line
// (threads, time, rate, both devices' counters).
Result run(rdma::Device& a, rdma::ProtectionDomain& pd_a, rdma::Device& b, rdma::ProtectionDomain& pd_b,
           int threads, uint64_t total, Clock::duration limit);

// gtest expectations on a run: every thread without error, every SEND
// received in order, and at least half the READs it could post.
void expect_complete(const Result& r);

}  // namespace ufab::lanes_stress
