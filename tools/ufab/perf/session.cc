#include "tools/ufab/perf/session.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "core/roce/gid.h"

namespace ufab::cli::perf {
namespace {

using std::chrono::milliseconds;

constexpr uint32_t kClockEvery = 64;
// How long a waiter busy-polls before it lets others have the core.
constexpr int64_t kSpinNs = 50'000;

// What a peer may do to our buffer and QPs in each test.
rdma::AccessFlags remote_access(Verb verb) {
  switch (verb) {
    case Verb::kWrite: return rdma::kRemoteWrite;
    case Verb::kRead: return rdma::kRemoteRead;
    case Verb::kAtomic: return rdma::kRemoteAtomic;
    case Verb::kSend: return rdma::kRemoteWrite;  // as perftest's INIT
  }
  return 0;
}

// READs and atomics we let the peer have outstanding at us; perftest sends
// its device's maximum and uses ours as its initiator depth.
uint16_t out_reads(Verb verb) { return verb == Verb::kRead || verb == Verb::kAtomic ? 16 : 1; }

uint32_t mtu_enum(uint32_t mtu) {
  uint32_t e = 1;
  while ((128u << e) < mtu) ++e;
  return e;
}

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

std::vector<uint64_t> test_sizes(const Config& cfg) {
  if (!cfg.all_sizes) return {cfg.size};
  std::vector<uint64_t> out;
  for (uint64_t s = 2; s <= kAllSizesMax; s *= 2) out.push_back(s);
  return out;
}

Status with_progress(rdma::Device& dev, const std::function<Status()>& fn) {
  if (auto s = dev.start_progress_thread(); !s) return s;
  Status result = fn();
  dev.stop_progress_thread();
  return result;
}

Status Session::open_device() {
  auto dev = rdma::Device::open(cfg_.device, {.ip = cfg_.ip, .params = cfg_.params});
  if (!dev) return std::unexpected(dev.error());
  dev_ = std::move(*dev);
  if (cfg_.mtu > dev_->active_mtu()) {
    return fail(EINVAL, "-m " + std::to_string(cfg_.mtu) + " exceeds the active MTU " +
                            std::to_string(dev_->active_mtu()) + " of " + cfg_.device + "; use -m " +
                            std::to_string(dev_->active_mtu()) + " or less");
  }
  auto pd = dev_->alloc_pd();
  if (!pd) return std::unexpected(pd.error().context("allocating a PD"));
  pd_.emplace(std::move(*pd));

  area_ = round_up(std::max<uint64_t>(cfg_.size, kCycleBuffer), kCacheLine);
  const uint64_t total = 2 * uint64_t(cfg_.qps) * area_;
  // A memfd mapped MAP_SHARED and kept open: a provider that maps its
  // peers' shared regions (shm) then copies straight into this buffer
  // instead of through the kernel. Heap memory where there is no memfd.
  if (int fd = memfd_create("ufab-perf", MFD_CLOEXEC); fd >= 0) {
    void* p = MAP_FAILED;
    if (ftruncate(fd, off_t(total)) == 0) p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      memory_ = {static_cast<uint8_t*>(p), [fd, total](uint8_t* q) {
                   munmap(q, total);
                   ::close(fd);
                 }};
    } else {
      ::close(fd);
    }
  }
  if (!memory_) {
    void* mem = nullptr;
    if (int rc = posix_memalign(&mem, kCycleBuffer, total); rc != 0) {
      return fail(rc, "allocating the " + std::to_string(total) + "-byte buffer");
    }
    memory_ = {static_cast<uint8_t*>(mem), [](uint8_t* q) { std::free(q); }};
  }
  buffer_ = memory_.get();
  // write-lat polls the last byte of what arrives, so its buffer starts
  // zeroed; the other tests send perftest's random bytes.
  if (cfg_.verb == Verb::kWrite && cfg_.kind == Kind::kLatency) {
    std::memset(buffer_, 0, total);
  } else {
    std::mt19937_64 rng(std::random_device{}());
    for (uint64_t i = 0; i < total; i += 8) {
      uint64_t r = rng();
      std::memcpy(buffer_ + i, &r, std::min<uint64_t>(8, total - i));
    }
  }
  auto mr = pd_->register_mr(buffer_, total, rdma::kLocalWrite | remote_access(cfg_.verb));
  if (!mr) return std::unexpected(mr.error().context("registering the " + std::to_string(total) + "-byte buffer"));
  mr_.emplace(std::move(*mr));

  auto cq = dev_->create_cq(cfg_.tx_depth * cfg_.qps + 16);
  if (!cq) return std::unexpected(cq.error().context("creating the send CQ"));
  send_cq_ = std::move(*cq);
  if (cfg_.verb == Verb::kSend) {
    auto rcq = dev_->create_cq(cfg_.rx_depth * cfg_.qps + 16);
    if (!rcq) return std::unexpected(rcq.error().context("creating the receive CQ"));
    recv_cq_ = std::move(*rcq);
  }
  for (uint32_t i = 0; i < cfg_.qps; ++i) {
    auto qp = pd_->create_qp({.type = rdma::QpType::kRc,
                              .send_cq = send_cq_.get(),
                              .recv_cq = recv_cq_ ? recv_cq_.get() : send_cq_.get(),
                              .caps = {.max_send_wr = cfg_.tx_depth,
                                       .max_recv_wr = cfg_.verb == Verb::kSend ? cfg_.rx_depth : 1,
                                       .max_send_sge = 1,
                                       .max_recv_sge = 1,
                                       .max_inline_data = cfg_.inline_size}});
    if (!qp) return std::unexpected(qp.error().context("creating RC QP " + std::to_string(i)));
    rdma::QpAttr a;
    a.state = rdma::QpState::kInit;
    a.access_flags = remote_access(cfg_.verb);
    if (auto s = (*qp)->modify(a, rdma::kAttrState | rdma::kAttrPkeyIndex | rdma::kAttrPort | rdma::kAttrAccessFlags);
        !s) {
      return std::unexpected(s.error().context("moving QP " + std::to_string(i) + " to INIT"));
    }
    qps_.push_back(std::move(*qp));
  }
  remote_.resize(cfg_.qps);
  return {};
}

Status Session::open_channel() {
  const uint32_t mtu = cfg_.mtu ? cfg_.mtu : dev_->active_mtu();
  return with_progress(*dev_, [&]() -> Status {
    if (cfg_.server()) {
      auto listener = exchange::TcpChannel::listen(cfg_.port);
      if (!listener) return std::unexpected(listener.error().context("listening for the client"));
      // Not in perftest's output; scripts wait for it before they start a
      // perftest client, which does not retry its connect.
      std::fprintf(stderr, "perf: waiting for a client on TCP port %u\n", unsigned(listener->port()));
      std::fflush(stderr);
      auto ch = exchange::PerftestChannel::accept(*listener, cfg_.timeout);
      if (!ch) return std::unexpected(ch.error().context("waiting for the client on TCP port " +
                                                         std::to_string(listener->port())));
      channel_.emplace(std::move(*ch));
    } else {
      auto ch = exchange::PerftestChannel::connect(cfg_.server_host, cfg_.port, cfg_.timeout);
      if (!ch) return std::unexpected(ch.error());
      channel_.emplace(std::move(*ch));
    }
    auto agreed = channel_->hello(kCycleBuffer, kCacheLine, mtu_enum(mtu), cfg_.timeout);
    if (!agreed) return std::unexpected(agreed.error());
    path_mtu_ = 128u << agreed->mtu_enum;
    // perftest walks its requests through the larger of the two page sizes
    // from our vaddr; our areas are sized for 4 KiB pages.
    if (agreed->cycle_buffer > area_) {
      return fail(ENOTSUP, "the peer's cycle buffer (page size) is " + std::to_string(agreed->cycle_buffer) +
                               " bytes; ufab perf sizes its buffer for " + std::to_string(kCycleBuffer) +
                               "-byte pages: use -s " + std::to_string(agreed->cycle_buffer) + " or more");
    }
    return {};
  });
}

Status Session::open() {
  if (auto s = open_device(); !s) return s;
  return open_channel();
}

exchange::PerftestKeys Session::my_keys(uint32_t i) const {
  exchange::PerftestKeys k;
  k.lid = 0;
  k.out_reads = out_reads(cfg_.verb);
  auto local = qps_[i]->local();
  k.qpn = local.qpn;
  k.psn = local.psn;
  k.rkey = mr_->rkey();
  k.vaddr = reinterpret_cast<uintptr_t>(remote_area(i));
  k.gid = roce::gid_from_ipv4(dev_->ip());
  return k;
}

Status Session::swap_keys(bool first_only) {
  return with_progress(*dev_, [&]() -> Status {
    for (uint32_t i = 0; i < (first_only ? 1 : cfg_.qps); ++i) {
      auto k = channel_->swap_keys(my_keys(i), cfg_.timeout);
      if (!k) return std::unexpected(k.error());
      remote_[i] = *k;
    }
    return {};
  });
}

Status Session::connect() {
  for (uint32_t i = 0; i < cfg_.qps; ++i) {
    const exchange::PerftestKeys& peer = remote_[i];
    auto ip = roce::ipv4_from_gid(peer.gid);
    if (!ip) {
      return fail(EPROTO, "the peer's GID " + roce::gid_to_text(peer.gid) +
                              " is not an IPv4-mapped address (::ffff:a.b.c.d): ufab speaks RoCEv2 over IPv4; give "
                              "perftest the -x index of its ::ffff:a.b.c.d GID whose type is \"RoCE v2\"");
    }
    rdma::QpAttr a;
    a.state = rdma::QpState::kRtr;
    a.path_mtu = path_mtu_;
    a.dest_qpn = peer.qpn;
    a.rq_psn = peer.psn;
    a.max_dest_rd_atomic = uint8_t(out_reads(cfg_.verb));
    a.min_rnr_timer = 12;
    a.av.dest_ip = *ip;
    // perftest asks for hop limit 255; the kernel puts its route's TTL (64)
    // on the wire, and so do we.
    a.av.hop_limit = 64;
    if (auto s = qps_[i]->modify(a, rdma::kAttrState | rdma::kAttrAv | rdma::kAttrPathMtu | rdma::kAttrDestQpn |
                                        rdma::kAttrRqPsn | rdma::kAttrMaxDestRdAtomic | rdma::kAttrMinRnrTimer);
        !s) {
      return std::unexpected(s.error().context("moving QP " + std::to_string(i) + " to RTR"));
    }
    a.state = rdma::QpState::kRts;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = qps_[i]->local().psn;
    // The peer's responder depth is our initiator depth, as in perftest,
    // within what ufab allows.
    a.max_rd_atomic = uint8_t(std::clamp<uint32_t>(peer.out_reads, 1, 16));
    if (auto s = qps_[i]->modify(a, rdma::kAttrState | rdma::kAttrTimeout | rdma::kAttrRetryCnt |
                                        rdma::kAttrRnrRetry | rdma::kAttrSqPsn | rdma::kAttrMaxQpRdAtomic);
        !s) {
      return std::unexpected(s.error().context("moving QP " + std::to_string(i) + " to RTS"));
    }
  }
  return {};
}

Status Session::close() {
  return with_progress(*dev_, [&]() -> Status { return channel_->close(my_keys(0), cfg_.timeout); });
}

Result<exchange::PerftestBwReport> Session::swap_bw_report(const exchange::PerftestBwReport& mine) {
  Result<exchange::PerftestBwReport> theirs = std::unexpected(Error(ENOTCONN, "no report"));
  auto s = with_progress(*dev_, [&]() -> Status {
    theirs = channel_->swap_bw_report(mine, cfg_.timeout);
    return theirs ? Status{} : std::unexpected(theirs.error());
  });
  if (!s) return std::unexpected(s.error());
  return theirs;
}

namespace {
constexpr char kResultLine[] = "---------------------------------------------------------------------------------------\n";
}

void Session::print_rule() const { std::fputs(kResultLine, out()); }

void Session::print_banner(const char* title) const {
  FILE* out = this->out();
  std::fputs(kResultLine, out);
  std::fprintf(out, "                    %s\n", title);
  std::fprintf(out, " Dual-port       : OFF\t\tDevice         : %s\n", cfg_.device.c_str());
  std::fprintf(out, " Number of qps   : %u\t\tTransport type : IB\n", cfg_.qps);
  std::fprintf(out, " Connection type : RC\t\tUsing SRQ      : OFF\n");
  std::fprintf(out, " PCIe relax order: OFF\n");
  std::fprintf(out, " ibv_wr* API     : OFF\n");
  if (!cfg_.server()) std::fprintf(out, " TX depth        : %u\n", cfg_.tx_depth);
  if (cfg_.verb == Verb::kSend && cfg_.server()) std::fprintf(out, " RX depth        : %u\n", cfg_.rx_depth);
  if (cfg_.kind == Kind::kBandwidth) std::fprintf(out, " CQ Moderation   : %u\n", cfg_.cq_mod);
  std::fprintf(out, " Mtu             : %u[B]\n", path_mtu_);
  std::fprintf(out, " Link type       : Ethernet\n");
  std::fprintf(out, " GID index       : 0\n");
  if (cfg_.verb == Verb::kRead || cfg_.verb == Verb::kAtomic) {
    std::fprintf(out, " Outstand reads  : %u\n", unsigned(out_reads(cfg_.verb)));
  } else {
    std::fprintf(out, " Max inline data : %u[B]\n", cfg_.inline_size);
  }
  std::fprintf(out, " rdma_cm QPs\t : OFF\n");
  std::fprintf(out, " Data ex. method : Ethernet\n");
  std::fputs(kResultLine, out);
}

void Session::print_addresses(bool remote) const {
  FILE* out = this->out();
  auto line = [&](const char* side, const exchange::PerftestKeys& k) {
    // perftest's "%#04x"-style fields: zero prints without 0x.
    auto hex = [](uint64_t v, int width) {
      char b[32];
      std::snprintf(b, sizeof b, "%#0*llx", width, static_cast<unsigned long long>(v));
      return std::string(b);
    };
    std::fprintf(out, " %s address: LID %s QPN %s PSN %s", side, hex(k.lid, 4).c_str(), hex(k.qpn, 6).c_str(),
                 hex(k.psn, 6).c_str());
    if (cfg_.verb == Verb::kRead) std::fprintf(out, " OUT %s", hex(k.out_reads, 4).c_str());
    if (cfg_.verb == Verb::kRead || cfg_.verb == Verb::kWrite) {
      std::fprintf(out, " RKey %s VAddr %s", hex(k.rkey, 8).c_str(), hex(k.vaddr, 16).c_str());
    }
    std::fprintf(out, "\n GID: %s\n", roce::gid_to_perftest_text(k.gid).c_str());
  };
  for (uint32_t i = 0; i < cfg_.qps; ++i) {
    if (remote) {
      line("remote", remote_[i]);
    } else {
      line("local", my_keys(i));
    }
  }
}

Result<std::optional<rdma::WorkCompletion>> Session::wait_completion(rdma::CompletionQueue& cq,
                                                                     const std::string& what,
                                                                     const std::function<bool()>& stop) {
  rdma::WorkCompletion wc;
  const int64_t deadline = now_ns() + int64_t(cfg_.timeout.count()) * 1'000'000;
  // Busy-poll for kSpinNs, then wait on the CQ (the provider spins a
  // little more, then sleeps on the NIC), so two processes sharing a core
  // (one VM, an oversubscribed host) take turns instead of each spinning
  // out its time slice. The clock is read every kClockEvery empty polls: a
  // clock read costs as much as a poll of a shared-memory CQ.
  const int64_t spin_end = now_ns() + kSpinNs;
  bool spinning = true;
  for (uint32_t polls = 0;; ++polls) {
    auto n = spinning ? cq.poll({&wc, 1}) : cq.wait({&wc, 1}, std::chrono::milliseconds(1));
    if (!n) return std::unexpected(n.error().context(what));
    if (*n == 1) break;
    if (stop && stop()) return std::nullopt;
    if ((!spinning || polls % kClockEvery == 0) && now_ns() > deadline) {
      return fail(ETIMEDOUT, "no completion for " + std::to_string(cfg_.timeout.count() / 1000) + " s while waiting for " +
                                 what + "; is the peer still running with the same test and options? (" +
                                 counters() + ")");
    }
    if (spinning && polls % kClockEvery == 0 && now_ns() > spin_end) spinning = false;
  }
  if (wc.status != rdma::WcStatus::kSuccess) {
    return fail(EIO, std::string("completion with error ") + rdma::wc_status_name(wc.status) + " (" +
                         std::to_string(int(wc.status)) + ") for " + what + (wc.error.empty() ? "" : ": " + wc.error) +
                         " (" + counters() + ")");
  }
  return std::optional(wc);
}

Status Session::wait_byte(const uint8_t* byte, uint8_t value, const std::string& what,
                          const std::function<bool()>& stop) {
  const int64_t deadline = now_ns() + int64_t(cfg_.timeout.count()) * 1'000'000;
  const int64_t spin_end = now_ns() + kSpinNs;
  // The transport writes this memory from dev.progress() on this thread.
  for (uint32_t polls = 0; *reinterpret_cast<const volatile uint8_t*>(byte) != value; ++polls) {
    if (stop && stop()) return {};
    // The deadline holds even while the transport is busy (retransmitting
    // to a peer that is gone, with retry_cnt 7 = forever).
    dev_->progress();
    // Past the spin, yield now and then: no CQ says when a WRITE lands, so
    // this is how a poller that shares its core lets the peer run.
    if (polls % kClockEvery != 0) continue;
    const int64_t now = now_ns();
    if (now > spin_end) std::this_thread::yield();
    if (now > deadline) {
      return fail(ETIMEDOUT, "nothing arrived for " + std::to_string(cfg_.timeout.count() / 1000) + " s while waiting for " +
                                 what + "; is the peer still running with the same -s and -n? (" + counters() + ")");
    }
  }
  return {};
}

void Session::linger(milliseconds how_long) {
  for (const int64_t until = now_ns() + int64_t(how_long.count()) * 1'000'000; now_ns() < until;) {
    if (dev_->progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

DurationClock::DurationClock(uint32_t duration_s)
    : start_(now_ns()), margin_ns_(int64_t(duration_s / 4) * 1'000'000'000), duration_ns_(int64_t(duration_s) * 1'000'000'000) {}

DurationClock::State DurationClock::state() {
  const int64_t t = now_ns() - start_;
  if (t < margin_ns_) return State::kWarmup;
  if (sample_start_ == 0) sample_start_ = now_ns();
  if (t < duration_ns_ - margin_ns_) return State::kSample;
  if (sample_end_ == 0) sample_end_ = now_ns();
  return t < duration_ns_ ? State::kTail : State::kEnd;
}

std::string Session::counters() const { return rdma::to_string(dev_->stats()); }

}  // namespace ufab::cli::perf
