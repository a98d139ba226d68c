// What the stream-ordered operations GPU test and benchmark share: GPU 0's
// primary context, the kernels (PTX loaded with cuModuleLoadData), pinned
// host buffers a kernel writes and reads, and two connected RC QPs (soft-RoCE
// over the software NIC, or shm) with those buffers registered.
#pragma once

#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "core/gpu/cuda.h"
#include "tests/gpu/kernels/stream_kernels_ptx.h"
#include "ufab/stream.h"
#include "ufab/rdma.h"

namespace ufab::gpu_test {

using gpu::Allocation;
using gpu::Driver;

struct Gpu {
  const Driver* d = nullptr;
  std::optional<gpu::PrimaryContext> ctx;
  void* fill = nullptr;   // ufab_fill(p, n, seed)
  void* check = nullptr;  // ufab_check(p, n, seed, bad)
  void* spin = nullptr;   // ufab_spin(ns, done)

  // Empty on success, else why not.
  std::string open() {
    auto dr = Driver::get();
    if (!dr) return dr.error().message();
    d = *dr;
    auto c = gpu::PrimaryContext::retain(*d, 0);
    if (!c) return c.error().message();
    ctx.emplace(std::move(*c));
    for (auto [slot, name] : {std::pair{&fill, "ufab_fill"}, {&check, "ufab_check"}, {&spin, "ufab_spin"}}) {
      auto f = d->module_function(kStreamKernelsPtx, name);
      if (!f) return f.error().message();
      *slot = *f;
    }
    return "";
  }
  Status launch_fill(void* stream, void* p, unsigned long long n, unsigned seed) const {
    void* args[] = {&p, &n, &seed};
    return d->launch(fill, blocks(n), 256, stream, args);
  }
  Status launch_check(void* stream, void* p, unsigned long long n, unsigned seed, unsigned* bad) const {
    void* args[] = {&p, &n, &seed, &bad};
    return d->launch(check, blocks(n), 256, stream, args);
  }
  Status launch_spin(void* stream, unsigned long long ns, unsigned* done) const {
    void* args[] = {&ns, &done};
    return d->launch(spin, 1, 32, stream, args);
  }
  static unsigned blocks(unsigned long long n) { return static_cast<unsigned>(std::min<unsigned long long>((n + 255) / 256, 1024)); }
  // Bounded wait for a stream; false when it did not finish in time.
  bool idle_within(void* stream, std::chrono::milliseconds limit) const {
    auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      auto r = d->stream_idle(stream);
      if (!r || *r) return r.has_value();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return false;
  }
};

// Two connected RC QPs, each with a pinned host buffer of `bytes`
// registered (local write, remote read/write).
struct QpPair {
  ufab_device* dev[2] = {};
  ufab_pd* pd[2] = {};
  ufab_cq* cq[2] = {};
  ufab_qp* qp[2] = {};
  ufab_mr* mr[2] = {};
  std::optional<Allocation> buf[2];

  // Empty on success, else why not. provider: "swnic" or "shm".
  // progress_thread: swnic devices get their progress threads (else the
  // pollers and ufab's stream watcher drive them).
  std::string open(const Driver& d, const std::string& provider, const std::string& tag, size_t bytes,
                   uint32_t depth = 256, bool progress_thread = true) {
    const char* ips[2] = {"10.79.0.1", "10.79.0.2"};
    for (int i = 0; i < 2; ++i) {
      ufab_device_opts o{};
      o.size = sizeof o;
      o.ip = ips[i];
      o.progress_thread = progress_thread ? 1 : 0;
      std::string name = provider == "swnic" ? "swnic:st" + std::to_string(getpid()) + tag + ":" + std::to_string(i)
                                             : "shm:st" + std::to_string(getpid()) + tag;
      if (ufab_device_open(name.c_str(), provider == "swnic" ? &o : nullptr, &dev[i]) < 0) return ufab_last_error();
      if (ufab_pd_alloc(dev[i], &pd[i]) < 0 || ufab_cq_create(dev[i], depth * 2, &cq[i]) < 0) return ufab_last_error();
      ufab_qp_init_attr init{};
      init.qp_type = UFAB_QPT_RC;
      init.send_cq = cq[i];
      init.recv_cq = cq[i];
      init.cap = {.max_send_wr = depth, .max_recv_wr = depth, .max_send_sge = 2, .max_recv_sge = 2,
                  .max_inline_data = 64};
      if (ufab_qp_create(pd[i], &init, &qp[i]) < 0) return ufab_last_error();
      auto a = Allocation::allocate(d, 0, Allocation::Kind::kPinnedHost, bytes);
      if (!a) return a.error().message();
      buf[i].emplace(std::move(*a));
      if (ufab_mr_reg(pd[i], buf[i]->data(), bytes,
                      UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_REMOTE_READ, &mr[i]) < 0) {
        return ufab_last_error();
      }
    }
    ufab_conn c[2];
    for (int i = 0; i < 2; ++i) {
      if (ufab_qp_local(qp[i], &c[i]) < 0) return ufab_last_error();
    }
    for (int i = 0; i < 2; ++i) {
      if (ufab_qp_connect(qp[i], &c[1 - i], nullptr) < 0) return ufab_last_error();
    }
    return "";
  }
  ~QpPair() {
    for (int i = 0; i < 2; ++i) {
      if (mr[i]) ufab_mr_dereg(mr[i]);
      if (qp[i]) ufab_qp_destroy(qp[i]);
      if (cq[i]) ufab_cq_destroy(cq[i]);
      if (pd[i]) ufab_pd_free(pd[i]);
      if (dev[i]) ufab_device_close(dev[i]);
    }
  }
  uint8_t* data(int i) const { return static_cast<uint8_t*>(buf[i]->data()); }
  ufab_sge sge(int i, size_t off, size_t len) const {
    return {.addr = reinterpret_cast<uintptr_t>(data(i) + off), .length = static_cast<uint32_t>(len),
            .lkey = ufab_mr_lkey(mr[i])};
  }
  // A WRITE_WITH_IMM of [off, off + len) from side i to the same place at the peer.
  ufab_send_wr write_imm(int i, ufab_sge* s, size_t off, uint32_t imm, bool signaled) const {
    ufab_send_wr wr{};
    wr.wr_id = imm;
    wr.opcode = UFAB_WR_RDMA_WRITE_WITH_IMM;
    wr.sg_list = s;
    wr.num_sge = 1;
    wr.imm_data = imm;
    wr.send_flags = signaled ? UFAB_SEND_SIGNALED : 0;
    wr.remote_addr = reinterpret_cast<uintptr_t>(data(1 - i) + off);
    wr.rkey = ufab_mr_rkey(mr[1 - i]);
    return wr;
  }
};

}  // namespace ufab::gpu_test
