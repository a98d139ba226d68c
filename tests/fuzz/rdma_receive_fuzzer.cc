// libFuzzer target for the receive path of the RDMA transport: a ufab
// Device on swnic port 0, and the fuzz input sent into it frame by frame
// from the raw port 1, as a hostile peer at 10.0.0.2 would.
//
// Set up once per process (first call): the Device, two protection
// domains, memory regions of every access mix inside one arena with canary
// bytes between them (one region deregistered, one in the other PD), and a
// CQ. Per input: the arena is restored, a fresh RC QP (connected to
// 10.0.0.2 QPN kPeerQpn, receive PSN kPeerPsn, send PSN kOurPsn) and a
// fresh UD QP (Q_Key kQkey) are created, receives are posted on both, and
// the RC QP posts a READ, a FETCH_ADD, a WRITE, a SEND, a FLUSH and an
// ATOMIC_WRITE towards the peer, so responses in the input have requests
// to answer. The RC QP and the regions with every right also allow FLUSH
// GLOBAL, so FLUSH requests reach the flush itself. Then every frame of
// the input goes in, progress() runs a bounded number of times, the
// Device's frames are drained, completions polled, the QPs destroyed.
//
// Input: records of  flags(1) | length(2, big-endian) | frame(length)
// (at most kMaxFrames; a short last record takes what is left). Run-time
// values a corpus file cannot know are patched in when flags ask:
//   0x01  BTH DestQP := the RC QP          0x02  BTH DestQP := the UD QP
//   0x04  keys: in a RETH or AtomicETH, rkey byte 0 picks a region
//         (kRegion*, 7 = leave the rkey as is) and va := region start +
//         va (as a signed offset)
//   0x08  lengths and checksums: IPv4 total length, UDP length, IPv4
//         header checksum and the ICRC recomputed for the frame as given
//   0x10  addresses: Ethernet destination/source, IPv4 source/destination
//         := Device MAC, peer MAC, 10.0.0.2, 10.0.0.1
//   0x20  run progress() once before the next frame
// Patching happens in that order (the ICRC after everything else).
//
// Properties (a violation prints what failed and __builtin_trap()s):
//   - progress() never crashes, hangs or trips ASan/UBSan;
//   - canaries between regions never change;
//   - regions the peer may not write (REMOTE_READ only, another PD's, the
//     deregistered one, the local-only receive region outside the posted
//     receive buffers, the requester's buffer outside its READ/atomic
//     targets) never change;
//   - every frame the Device sends is well-formed ARP or RoCEv2 (full
//     parse, ICRC included) from 10.0.0.1 to 10.0.0.2.
//
// Build and run: tests/fuzz/run.sh [SECONDS] rdma_receive (clang 16, the
// whole transport and swnic built from source). The same file builds with
// gcc into //tests/fuzz:rdma_receive_corpus_test, which replays the seeds.
//
// Seeds: tests/fuzz/corpus/rdma_receive/, written by this file's generator
// mode (needs only core/roce):
//   g++ -std=c++2b -DRDMA_RECEIVE_MAKE_CORPUS -I. -o /tmp/rdma_seeds
//     tests/fuzz/rdma_receive_fuzzer.cc core/roce/{builder,headers,icrc,opcodes,parser}.cc
//   /tmp/rdma_seeds tests/fuzz/corpus/rdma_receive
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "core/roce/builder.h"
#include "core/roce/headers.h"
#include "core/roce/icrc.h"
#include "core/roce/opcodes.h"
#include "core/roce/parser.h"

namespace {

using namespace ufab;

constexpr uint32_t kDevIp = 0x0A000001;
constexpr uint32_t kPeerIp = 0x0A000002;
constexpr uint32_t kPeerQpn = 0x000123;
constexpr uint32_t kPeerPsn = 0x000100;  // what the RC QP expects first
constexpr uint32_t kOurPsn = 0x000800;   // the RC QP's first request PSN
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kMtu = 1024;
constexpr size_t kMaxFrames = 32;
constexpr size_t kMaxFrameBytes = 1900;  // fits a swnic frame buffer

enum Flag : uint8_t {
  kFixRcQp = 0x01,
  kFixUdQp = 0x02,
  kFixKeys = 0x04,
  kFixChecksums = 0x08,
  kFixAddresses = 0x10,
  kProgress = 0x20,
};

// Regions, by the index a patched rkey byte names.
enum RegionIndex : uint8_t {
  kRegionAll = 0,       // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC | FLUSH_GLOBAL
  kRegionReadOnly = 1,  // REMOTE_READ
  kRegionWrite = 2,     // LOCAL_WRITE | REMOTE_WRITE
  kRegionAtomic = 3,    // LOCAL_WRITE | REMOTE_ATOMIC
  kRegionOtherPd = 4,   // everything (as kRegionAll), other PD
  kRegionDead = 5,      // everything (as kRegionAll), deregistered
  kRegionRecv = 6,      // LOCAL_WRITE: receive buffers (its lkey as the "rkey")
  kRegionLocal = 7,     // LOCAL_WRITE: the requester's buffers; byte 7 also means "leave the rkey"
  kRegionCount = 8,
};
constexpr size_t kRegionBytes[kRegionCount] = {4096, 4096, 4096, 64, 4096, 4096, 4096, 2048};

// Receive buffers in kRegionRecv: RC at 0 and 256 (256 B each), UD at
// 1024 and 1536 (512 B each: 40 GRH bytes + a datagram).
constexpr uint32_t kRcRecvBytes = 256, kUdRecvBytes = 512;
constexpr size_t kRecvWritable = 2048;
// In kRegionLocal: READ target [0, 256), atomic result [512, 520), WRITE
// source [1024, 1088), SEND source [1100, 1132).
constexpr uint32_t kReadLen = 256, kAtomicAt = 512, kWriteAt = 1024, kWriteLen = 64, kSendAt = 1100, kSendLen = 32;

}  // namespace

#ifndef RDMA_RECEIVE_MAKE_CORPUS

#include <unistd.h>

#include <memory>
#include <optional>

#include "ufab/rdma.hpp"
#include "core/net/arp.h"
#include "core/nic_open.h"
#include "drivers/builtin.h"

namespace {

uint64_t load_be(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = v << 8 | p[i];
  return v;
}
void store_be(uint8_t* p, int n, uint64_t v) {
  for (int i = n - 1; i >= 0; --i, v >>= 8) p[i] = static_cast<uint8_t>(v);
}

// The patches of the flags above, on a frame of any length (fields past the
// end are left alone).
struct Patch {
  roce::MacAddr dev_mac{}, peer_mac{};
  uint32_t rc_qpn = 0, ud_qpn = 0;
  uint32_t rkey[kRegionCount] = {};
  uint64_t base[kRegionCount] = {};
};

void apply(uint8_t flags, const Patch& p, std::vector<uint8_t>& f) {
  const size_t n = f.size();
  constexpr size_t bth = roce::kBthOffset;
  if ((flags & kFixAddresses) && n >= 14) {
    std::memcpy(f.data(), p.dev_mac.data(), 6);
    std::memcpy(f.data() + 6, p.peer_mac.data(), 6);
  }
  if ((flags & kFixAddresses) && n >= 34) {
    store_be(f.data() + 26, 4, kPeerIp);
    store_be(f.data() + 30, 4, kDevIp);
  }
  if ((flags & (kFixRcQp | kFixUdQp)) && n >= bth + 8) {
    store_be(f.data() + bth + 5, 3, (flags & kFixRcQp) ? p.rc_qpn : p.ud_qpn);
  }
  if ((flags & kFixKeys) && n > bth) {
    const roce::OpcodeInfo* op = roce::opcode_info(f[bth]);
    size_t ext = bth + roce::kBthBytes;
    for (roce::ExtHeader h : {roce::kReth, roce::kAtomicEth}) {
      if (op == nullptr || !op->has(h)) continue;
      size_t at = ext + op->offset_of(h);  // va (8) then rkey (4) in both
      if (at + 12 > n) continue;
      uint8_t which = f[at + 11];
      if (which < kRegionLocal) {
        store_be(f.data() + at + 8, 4, p.rkey[which]);
        store_be(f.data() + at, 8, p.base[which] + load_be(f.data() + at, 8));
      }
    }
  }
  if ((flags & kFixChecksums) && n >= bth + roce::kBthBytes + roce::kIcrcBytes) {
    uint32_t total = static_cast<uint32_t>(n - 14);
    if (total <= 0xFFFF) {
      store_be(f.data() + 16, 2, total);
      store_be(f.data() + 38, 2, total - 20);
      store_be(f.data() + 24, 2, 0);
      store_be(f.data() + 24, 2, roce::ipv4_header_checksum(std::span<const uint8_t, 20>(f.data() + 14, 20)));
      uint32_t crc = roce::icrc_ipv4({f.data() + 14, n - 14 - roce::kIcrcBytes});
      for (int i = 0; i < 4; ++i) f[n - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
    }
  }
}

// Splits an input into (flags, frame) records.
template <typename F>
void for_each_record(std::span<const uint8_t> in, F&& f) {
  size_t at = 0;
  for (size_t k = 0; k < kMaxFrames && at + 3 <= in.size(); ++k) {
    uint8_t flags = in[at];
    size_t len = std::min<size_t>({size_t{in[at + 1]} << 8 | in[at + 2], in.size() - at - 3, kMaxFrameBytes});
    f(flags, in.subspan(at + 3, len));
    at += 3 + len;
  }
}


[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "rdma_receive_fuzzer: property violated: %s\n", what.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

void check(bool ok, const std::string& what) {
  if (!ok) violated(what);
}

struct Harness {
  static constexpr size_t kCanary = 192;

  std::unique_ptr<core::PluginRegistry> registry;
  std::unique_ptr<rdma::Device> dev;
  std::unique_ptr<core::Nic> peer;
  std::shared_ptr<dma::BufferPool> pool;
  roce::MacAddr peer_mac{}, dev_mac{};
  std::optional<rdma::ProtectionDomain> pd, pd2;
  std::unique_ptr<rdma::CompletionQueue> cq;
  std::vector<uint8_t> storage;
  uint8_t* arena = nullptr;
  size_t arena_len = 0;
  size_t offset[kRegionCount] = {};
  std::vector<uint8_t> initial;
  std::optional<rdma::MemoryRegion> mr[kRegionCount];
  Patch patch;
  uint64_t inputs = 0;
  // RDMA_RECEIVE_TRACE=1: print what the Device answers and completes, to
  // see what an input (a crash, a seed) does.
  bool trace = std::getenv("RDMA_RECEIVE_TRACE") != nullptr;

  uint8_t* at(size_t r, size_t off = 0) { return arena + offset[r] + off; }

  // Built on the first input; destroyed at a normal exit, which closes
  // both swnic ports and so removes the shared-memory segment (a crash
  // leaves /dev/shm/ufab-swnic-rfz<pid> behind).
  static Harness& get() {
    static Harness h;
    static bool ready = (h.init(), true);
    (void)ready;
    return h;
  }

  void init() {
    std::string link = "rfz" + std::to_string(::getpid());
    auto d = rdma::Device::open("swnic:" + link + ":0",
                                {.ip = "10.0.0.1", .params = {{"stale", "reset"}, {"ring", "256"}}, .progress_thread = false, .ring_size = 256});
    if (!d) violated("setup: Device::open: " + d.error().message());
    dev = std::move(*d);
    registry = std::make_unique<core::PluginRegistry>(core::default_registry(drivers::builtin_drivers()));
    auto nic = core::open_nic(*registry, "swnic:" + link + ":1");
    if (!nic) violated("setup: peer port: " + nic.error().message());
    peer = std::move(*nic);
    auto p = peer->create_pool(512);
    if (!p) violated("setup: pool: " + p.error().message());
    pool = *p;
    if (!peer->setup_rx_queue(0, 256, *pool) || !peer->setup_tx_queue(0, 256) || !peer->start()) {
      violated("setup: peer queues");
    }
    std::memcpy(peer_mac.data(), peer->info().mac, 6);
    dev_mac = peer_mac;
    dev_mac[5] = 0;  // swnic: the ports differ in the last byte only
    // Teach the Device our MAC (it learns from a request for its address).
    send(net::build_arp_request(peer_mac, net::Ipv4Address{kPeerIp}, net::Ipv4Address{kDevIp}));
    for (int i = 0; i < 16; ++i) pump();

    auto a = dev->alloc_pd(), b = dev->alloc_pd();
    if (!a || !b) violated("setup: alloc_pd");
    pd.emplace(std::move(*a));
    pd2.emplace(std::move(*b));
    auto c = dev->create_cq(4096);
    if (!c) violated("setup: create_cq");
    cq = std::move(*c);

    size_t len = kCanary;
    for (size_t r = 0; r < kRegionCount; ++r) {
      offset[r] = len;
      len += (kRegionBytes[r] + 63) / 64 * 64 + kCanary;
    }
    arena_len = len;
    storage.assign(len + 64, 0);
    arena = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63});
    for (size_t i = 0; i < arena_len; ++i) arena[i] = static_cast<uint8_t>(0xA5 ^ (i * 13));
    initial.assign(arena, arena + arena_len);

    using namespace rdma;
    const AccessFlags all = kLocalWrite | kRemoteAccess | kFlushGlobal;
    const AccessFlags access[kRegionCount] = {all, kRemoteRead, kLocalWrite | kRemoteWrite, kLocalWrite | kRemoteAtomic,
                                              all, all, kLocalWrite, kLocalWrite};
    for (size_t r = 0; r < kRegionCount; ++r) {
      auto m = (r == kRegionOtherPd ? *pd2 : *pd).register_mr(at(r), kRegionBytes[r], access[r]);
      if (!m) violated("setup: register_mr: " + m.error().message());
      mr[r].emplace(std::move(*m));
      patch.rkey[r] = mr[r]->rkey() != 0 ? mr[r]->rkey() : mr[r]->lkey();
      patch.base[r] = reinterpret_cast<uint64_t>(at(r));
    }
    if (!mr[kRegionDead]->deregister()) violated("setup: deregister");
    mr[kRegionDead].reset();
    patch.dev_mac = dev_mac;
    patch.peer_mac = peer_mac;
  }

  bool send(std::span<const uint8_t> frame) {
    ufab_buf* b = nullptr;
    if (frame.empty() || pool->alloc(&b, 1) != 1) return false;
    if (frame.size() > b->capacity - b->offset) {
      pool->free(&b, 1);
      return false;
    }
    std::memcpy(b->base + b->offset, frame.data(), frame.size());
    b->len = static_cast<uint32_t>(frame.size());
    if (peer->tx_burst(0, &b, 1) != 1) {
      pool->free(&b, 1);
      return false;
    }
    return true;
  }

  // One progress round, then everything the Device sent: checked, ARP
  // requests for 10.0.0.2 answered. Returns the Device's work count.
  int pump() {
    int work = dev->progress();
    ufab_buf* bufs[32];
    for (int guard = 0; guard < 16; ++guard) {
      int n = peer->rx_burst(0, bufs, 32);
      if (n <= 0) break;
      for (int i = 0; i < n; ++i) on_device_frame({bufs[i]->base + bufs[i]->offset, bufs[i]->len});
      pool->free(bufs, static_cast<uint32_t>(n));
      work += n;
    }
    return work;
  }

  void on_device_frame(std::span<const uint8_t> f) {
    check(f.size() >= 14, "the Device sent a runt frame");
    if (f[12] == 0x08 && f[13] == 0x06) {
      auto arp = net::parse_arp(f);
      check(arp.has_value(), "the Device sent a malformed ARP frame");
      if (arp->op == net::ArpOp::kRequest && arp->target_ip.value == kPeerIp) send(net::build_arp_reply(*arp, peer_mac));
      return;
    }
    roce::Packet p;
    roce::ParseError e = roce::parse_frame(f, p);
    if (e != roce::ParseError::kOk) violated(std::string("the Device sent a frame that does not parse: ") + roce::parse_error_text(e));
    check(p.ip.src == kDevIp && p.ip.dst == kPeerIp, "the Device sent RoCE from/to an unexpected address");
    check(p.op->transport == roce::Transport::kRc, "the Device sent a non-RC packet (it has no UD sends here)");
    if (trace) {
      std::fprintf(stderr, "  device -> %s psn %#x", roce::opcode_full_name(p.bth.opcode), p.bth.psn);
      if (p.has(roce::kAeth)) std::fprintf(stderr, " aeth %#x", p.ext.aeth.syndrome);
      if (p.has(roce::kAtomicAckEth)) std::fprintf(stderr, " orig %#llx", static_cast<unsigned long long>(p.ext.atomic_ack.original));
      std::fprintf(stderr, " %zu B\n", p.payload.size());
    }
  }

  std::unique_ptr<rdma::QueuePair> rc_qp() {
    using namespace rdma;
    auto q = pd->create_qp({.type = QpType::kRc, .send_cq = cq.get(), .recv_cq = cq.get(), .caps = {}, .sq_sig_all = true});
    if (!q) violated("create RC QP: " + q.error().message());
    auto& qp = **q;
    QpAttr a;
    a.state = QpState::kInit;
    a.access_flags = kRemoteAccess | kFlushGlobal;
    if (!qp.modify(a, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrAccessFlags)) violated("RC QP to INIT");
    a.state = QpState::kRtr;
    a.av.dest_ip = kPeerIp;
    a.path_mtu = kMtu;
    a.dest_qpn = kPeerQpn;
    a.rq_psn = kPeerPsn;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    if (!qp.modify(a, kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic | kAttrMinRnrTimer)) {
      violated("RC QP to RTR");
    }
    a.state = QpState::kRts;
    a.sq_psn = kOurPsn;
    a.timeout = 0;  // no retransmission timer: runs do not depend on time
    a.retry_cnt = 2;
    a.rnr_retry = 2;
    a.max_rd_atomic = 4;  // READ, FETCH_ADD, FLUSH, ATOMIC_WRITE
    if (!qp.modify(a, kAttrState | kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic)) {
      violated("RC QP to RTS");
    }
    return std::move(*q);
  }

  std::unique_ptr<rdma::QueuePair> ud_qp() {
    using namespace rdma;
    auto q = pd->create_qp({.type = QpType::kUd, .send_cq = cq.get(), .recv_cq = cq.get(), .caps = {}, .sq_sig_all = false});
    if (!q) violated("create UD QP: " + q.error().message());
    QpAttr t;
    t.qkey = kQkey;
    if (!(*q)->connect(ConnectionData{}, t)) violated("UD QP connect");
    return std::move(*q);
  }

  void post_recv(rdma::QueuePair& qp, uint64_t off, uint32_t len) {
    rdma::Sge s = mr[kRegionRecv]->sge(off, len);
    if (!qp.post_recv(rdma::RecvWr{.wr_id = off, .sgl = {&s, 1}})) violated("post_recv");
  }

  void post_send(rdma::QueuePair& qp, rdma::WrOpcode op, uint64_t off, uint32_t len) {
    rdma::Sge s = mr[kRegionLocal]->sge(off, len);
    rdma::SendWr wr;
    wr.wr_id = off;
    wr.opcode = op;
    wr.flags = rdma::kSendSignaled;
    wr.sgl = {&s, 1};
    wr.remote_addr = 0x10000;
    wr.rkey = 0x5A5A5A5A;
    wr.compare_add = 3;
    if (!qp.post_send(wr)) violated("post_send");
  }

  // A FLUSH (whole region) or an ATOMIC_WRITE towards the peer: no SGEs.
  void post_placement(rdma::QueuePair& qp, rdma::WrOpcode op, uint64_t wr_id) {
    rdma::SendWr wr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.flags = rdma::kSendSignaled;
    wr.remote_addr = 0x10000;
    wr.rkey = 0x5A5A5A5A;
    wr.atomic_value = 0x0123456789ABCDEFull;
    wr.flush_type = rdma::kFlushTypeGlobal;
    wr.flush_level = rdma::kFlushWholeRegion;
    if (!qp.post_send(wr)) violated("post_send " + std::string(rdma::wr_opcode_name(op)));
  }

  void drain_cq() {
    rdma::WorkCompletion wc[64];
    for (int i = 0; i < 256; ++i) {
      auto n = cq->poll(wc);
      if (n && *n == 0) return;  // an overflow error is fine: poll again
      for (size_t k = 0; trace && n && k < *n; ++k) {
        std::fprintf(stderr, "  completion wr_id %llu %s %s len %u %s\n", static_cast<unsigned long long>(wc[k].wr_id),
                     rdma::wc_opcode_name(wc[k].opcode), rdma::wc_status_name(wc[k].status), wc[k].byte_len,
                     wc[k].error.c_str());
      }
    }
  }

  // Bytes [from, to) of region r must still hold their initial content.
  void unchanged(size_t r, size_t from, size_t to, const char* what) {
    size_t a = offset[r] + from, b = offset[r] + to;
    if (std::memcmp(arena + a, initial.data() + a, b - a) != 0) {
      size_t i = a;
      while (arena[i] == initial[i]) ++i;
      violated(std::string(what) + ": byte " + std::to_string(i - offset[r]) + " changed");
    }
  }

  void check_memory() {
    // Canaries: before the first region, between regions, after the last.
    size_t prev_end = 0;
    for (size_t r = 0; r <= kRegionCount; ++r) {
      size_t start = r < kRegionCount ? offset[r] : arena_len;
      if (std::memcmp(arena + prev_end, initial.data() + prev_end, start - prev_end) != 0) {
        violated("canary " + std::string(r < kRegionCount ? "before region " + std::to_string(r) : "after the last region") +
                 " changed");
      }
      if (r < kRegionCount) prev_end = offset[r] + kRegionBytes[r];
    }
    unchanged(kRegionReadOnly, 0, kRegionBytes[kRegionReadOnly], "REMOTE_READ-only region");
    unchanged(kRegionOtherPd, 0, kRegionBytes[kRegionOtherPd], "region of another PD");
    unchanged(kRegionDead, 0, kRegionBytes[kRegionDead], "deregistered region");
    unchanged(kRegionRecv, kRecvWritable, kRegionBytes[kRegionRecv], "receive region outside the posted receives");
    unchanged(kRegionLocal, kReadLen, kAtomicAt, "requester region between READ and atomic targets");
    unchanged(kRegionLocal, kAtomicAt + 8, kRegionBytes[kRegionLocal], "requester region after the atomic target");
  }

  void run(std::span<const uint8_t> in) {
    ++inputs;
    if (trace) std::fprintf(stderr, "input %llu (%zu bytes)\n", static_cast<unsigned long long>(inputs), in.size());
    std::memcpy(arena, initial.data(), arena_len);
    // Our MAC again, in case an earlier input taught the Device another one.
    send(net::build_arp_frame(net::ArpPacket{.eth_dst = dev_mac, .eth_src = peer_mac, .op = net::ArpOp::kReply,
                                             .sender_mac = peer_mac, .sender_ip = net::Ipv4Address{kPeerIp},
                                             .target_mac = dev_mac, .target_ip = net::Ipv4Address{kDevIp}}));
    pump();
    {
      auto rc = rc_qp();
      auto ud = ud_qp();
      patch.rc_qpn = rc->qp_num();
      patch.ud_qpn = ud->qp_num();
      post_recv(*rc, 0, kRcRecvBytes);
      post_recv(*rc, kRcRecvBytes, kRcRecvBytes);
      post_recv(*ud, 1024, kUdRecvBytes);
      post_recv(*ud, 1024 + kUdRecvBytes, kUdRecvBytes);
      post_send(*rc, rdma::WrOpcode::kRdmaRead, 0, kReadLen);                     // PSN kOurPsn
      post_send(*rc, rdma::WrOpcode::kAtomicFetchAndAdd, kAtomicAt, 8);           // kOurPsn + 1
      post_send(*rc, rdma::WrOpcode::kRdmaWrite, kWriteAt, kWriteLen);            // kOurPsn + 2
      post_send(*rc, rdma::WrOpcode::kSend, kSendAt, kSendLen);                   // kOurPsn + 3
      post_placement(*rc, rdma::WrOpcode::kFlush, 4);                              // kOurPsn + 4
      post_placement(*rc, rdma::WrOpcode::kAtomicWrite, 5);                        // kOurPsn + 5
      pump();

      std::vector<uint8_t> frame;
      for_each_record(in, [&](uint8_t flags, std::span<const uint8_t> bytes) {
        frame.assign(bytes.begin(), bytes.end());
        apply(flags, patch, frame);
        if (trace) {
          roce::Packet p;
          auto e = roce::parse_frame(frame, p);
          std::fprintf(stderr, "  peer -> %zu B flags %#x: %s", frame.size(), flags,
                       e == roce::ParseError::kOk ? roce::opcode_full_name(p.bth.opcode) : roce::parse_error_name(e));
          if (e == roce::ParseError::kOk) std::fprintf(stderr, " psn %#x qp %#x", p.bth.psn, p.bth.dest_qp);
          std::fprintf(stderr, "\n");
        }
        send(frame);
        if (flags & kProgress) pump();
      });
      for (int i = 0, idle = 0; i < 64 && idle < 2; ++i) idle = pump() == 0 ? idle + 1 : 0;
      drain_cq();
      check_memory();
      if (trace) {
        auto changed = [&](size_t r) { return std::memcmp(at(r), initial.data() + offset[r], kRegionBytes[r]) != 0; };
        std::fprintf(stderr, "  changed regions:");
        for (size_t r = 0; r < kRegionCount; ++r)
          if (changed(r)) std::fprintf(stderr, " %zu", r);
        std::fprintf(stderr, "; RC QP %s\n", rdma::qp_state_name(rc->state()));
      }
      (void)rc->state();
      (void)dev->stats();
    }
    // The QPs are gone; what they had queued must not come out any more.
    for (int i = 0; i < 2; ++i) pump();
    drain_cq();
    check_memory();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness::get().run({data, size});
  return 0;
}

#else  // RDMA_RECEIVE_MAKE_CORPUS: writes the seed corpus.

#include <filesystem>
#include <fstream>

namespace {

using roce::ExtHeaders;
namespace o = roce::op;

// One record: a frame built with placeholder addresses (patched by flags).
struct Rec {
  uint8_t flags;
  std::vector<uint8_t> frame;
};

constexpr uint8_t kAll = kFixRcQp | kFixKeys | kFixChecksums | kFixAddresses;
constexpr uint8_t kAllUd = kFixUdQp | kFixChecksums | kFixAddresses;

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + 7 * i);
  return v;
}

Rec frame(uint8_t opcode, uint32_t psn, ExtHeaders ext = {}, std::vector<uint8_t> payload = {}, uint8_t flags = kAll,
          bool ack_req = true) {
  roce::FrameSpec s;
  s.src_ip = kPeerIp;
  s.dst_ip = kDevIp;
  s.bth.opcode = opcode;
  s.bth.psn = psn;
  s.bth.ack_req = ack_req;
  s.ext = ext;
  std::vector<uint8_t> f(roce::frame_length(opcode, payload.size()));
  auto r = roce::build_frame(s, payload, f);
  if (!r) {
    std::fprintf(stderr, "build %s: %s\n", roce::opcode_full_name(opcode), roce::build_error_text(r.error));
    std::exit(1);
  }
  f.resize(r.length);
  return {flags, f};
}

ExtHeaders reth(uint8_t region, int64_t offset, uint32_t len) {
  ExtHeaders e;
  e.reth = {static_cast<uint64_t>(offset), region, len};
  return e;
}
ExtHeaders flush(uint8_t region, int64_t offset, uint32_t len, uint8_t placement, uint8_t selectivity) {
  ExtHeaders e = reth(region, offset, len);
  e.feth = roce::Feth::make(placement, selectivity);
  return e;
}
ExtHeaders atomic(uint8_t region, int64_t offset, uint64_t swap_add, uint64_t compare = 0) {
  ExtHeaders e;
  e.atomic_eth = {static_cast<uint64_t>(offset), region, swap_add, compare};
  return e;
}
ExtHeaders aeth(uint8_t syndrome, uint32_t msn = 1) {
  ExtHeaders e;
  e.aeth = {syndrome, msn};
  return e;
}
ExtHeaders imm(uint32_t v, ExtHeaders e = {}) {
  e.immdt.imm = v;
  return e;
}
ExtHeaders deth(uint32_t qkey) {
  ExtHeaders e;
  e.deth = {qkey, kPeerQpn};
  return e;
}

void write(const std::filesystem::path& dir, const std::string& name, const std::vector<Rec>& recs) {
  std::vector<uint8_t> out;
  for (const auto& r : recs) {
    out.push_back(r.flags);
    out.push_back(static_cast<uint8_t>(r.frame.size() >> 8));
    out.push_back(static_cast<uint8_t>(r.frame.size()));
    out.insert(out.end(), r.frame.begin(), r.frame.end());
  }
  std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(dir)) std::filesystem::remove(e.path());
  const uint32_t p = kPeerPsn, q = kOurPsn;
  const uint8_t ack = roce::aeth::ack_syndrome();

  // Requests, one per opcode, valid.
  write(dir, "rc_send_only", {frame(o::kRcSendOnly, p, {}, pattern(100, 1))});
  write(dir, "rc_send_only_imm", {frame(o::kRcSendOnlyImm, p, imm(0xC0FFEE), pattern(17, 2))});
  write(dir, "rc_send_first_middle_last", {frame(o::kRcSendFirst, p, {}, pattern(kMtu, 3), kAll, false),
                                           frame(o::kRcSendMiddle, p + 1, {}, pattern(kMtu, 4), kAll, false),
                                           frame(o::kRcSendLast, p + 2, {}, pattern(10, 5))});
  write(dir, "rc_send_first_last_imm", {frame(o::kRcSendFirst, p, {}, pattern(kMtu, 3), kAll, false),
                                        frame(o::kRcSendLastImm, p + 1, imm(9), pattern(3, 5))});
  write(dir, "rc_send_only_inv", {frame(o::kRcSendOnlyInv, p, [] { ExtHeaders e; e.ieth.rkey = 0; return e; }(), pattern(8, 1))});
  write(dir, "rc_write_only", {frame(o::kRcWriteOnly, p, reth(kRegionAll, 64, 100), pattern(100, 6))});
  write(dir, "rc_write_only_imm", {frame(o::kRcWriteOnlyImm, p, imm(5, reth(kRegionWrite, 0, 16)), pattern(16, 7))});
  write(dir, "rc_write_first_middle_last", {frame(o::kRcWriteFirst, p, reth(kRegionAll, 0, 2 * kMtu + 8), pattern(kMtu, 8), kAll, false),
                                            frame(o::kRcWriteMiddle, p + 1, {}, pattern(kMtu, 9), kAll, false),
                                            frame(o::kRcWriteLast, p + 2, {}, pattern(8, 10))});
  write(dir, "rc_write_first_last_imm", {frame(o::kRcWriteFirst, p, reth(kRegionWrite, 1024, kMtu + 4), pattern(kMtu, 8), kAll, false),
                                         frame(o::kRcWriteLastImm, p + 1, imm(77), pattern(4, 10))});
  write(dir, "rc_write_zero_length", {frame(o::kRcWriteOnly, p, reth(7, 0, 0), {})});
  write(dir, "rc_read", {frame(o::kRcReadRequest, p, reth(kRegionReadOnly, 8, 2000))});
  write(dir, "rc_read_then_write", {frame(o::kRcReadRequest, p, reth(kRegionAll, 0, 64)),
                                    frame(o::kRcWriteOnly, p + 1, reth(kRegionAll, 0, 8), pattern(8, 1))});
  write(dir, "rc_fetch_add", {frame(o::kRcFetchAdd, p, atomic(kRegionAll, 16, 5))});
  write(dir, "rc_compare_swap", {frame(o::kRcCompareSwap, p, atomic(kRegionAtomic, 8, 0x1234, 0))});
  write(dir, "rc_flush", {frame(o::kRcFlush, p, flush(kRegionAll, 0, 64, roce::feth::kGlobal, roce::feth::kWholeRegion))});
  write(dir, "rc_flush_range", {frame(o::kRcFlush, p, flush(kRegionAll, 64, 256, roce::feth::kGlobal, roce::feth::kRange))});
  write(dir, "rc_atomic_write", {frame(o::kRcAtomicWrite, p, reth(kRegionAll, 0, 8), pattern(8, 1))});
  write(dir, "rc_write_flush_atomic_write", {frame(o::kRcWriteOnly, p, reth(kRegionAll, 128, 64), pattern(64, 3)),
                                             frame(o::kRcFlush, p + 1, flush(kRegionAll, 128, 64, roce::feth::kGlobal, roce::feth::kRange)),
                                             frame(o::kRcAtomicWrite, p + 2, reth(kRegionAll, 120, 8), pattern(8, 4))});

  // Hostile requests.
  write(dir, "bad_write_other_pd", {frame(o::kRcWriteOnly, p, reth(kRegionOtherPd, 0, 16), pattern(16, 1))});
  write(dir, "bad_write_dead_region", {frame(o::kRcWriteOnly, p, reth(kRegionDead, 0, 16), pattern(16, 1))});
  write(dir, "bad_write_read_only", {frame(o::kRcWriteOnly, p, reth(kRegionReadOnly, 0, 16), pattern(16, 1))});
  write(dir, "bad_write_recv_lkey", {frame(o::kRcWriteOnly, p, reth(kRegionRecv, 0, 16), pattern(16, 1))});
  write(dir, "bad_write_below", {frame(o::kRcWriteOnly, p, reth(kRegionAll, -8, 16), pattern(16, 1))});
  write(dir, "bad_write_past_end", {frame(o::kRcWriteOnly, p, reth(kRegionAll, 4096 - 8, 16), pattern(16, 1))});
  write(dir, "bad_write_far_below", {frame(o::kRcWriteOnly, p, reth(kRegionAll, INT64_MIN / 2, 16), pattern(16, 1))});
  write(dir, "bad_write_payload_exceeds_reth", {frame(o::kRcWriteOnly, p, reth(kRegionAll, 0, 8), pattern(64, 1))});
  write(dir, "bad_write_middle_without_first", {frame(o::kRcWriteMiddle, p, {}, pattern(kMtu, 1))});
  write(dir, "bad_send_last_without_first", {frame(o::kRcSendLast, p, {}, pattern(12, 1))});
  write(dir, "bad_send_too_long_for_receive", {frame(o::kRcSendOnly, p, {}, pattern(600, 1))});
  write(dir, "bad_atomic_misaligned", {frame(o::kRcFetchAdd, p, atomic(kRegionAll, 3, 1))});
  write(dir, "bad_atomic_past_end", {frame(o::kRcCompareSwap, p, atomic(kRegionAtomic, 60, 1))});
  write(dir, "bad_read_write_only_region", {frame(o::kRcReadRequest, p, reth(kRegionWrite, 0, 64))});
  write(dir, "bad_read_huge", {frame(o::kRcReadRequest, p, reth(kRegionAll, 0, 0x80000001u))});
  write(dir, "bad_flush_persistent", {frame(o::kRcFlush, p, flush(kRegionAll, 0, 64, roce::feth::kPersistent, roce::feth::kRange))});
  write(dir, "bad_flush_undefined_type", {frame(o::kRcFlush, p, flush(kRegionAll, 0, 64, 0x4, 2))});
  write(dir, "bad_flush_read_only_region", {frame(o::kRcFlush, p, flush(kRegionReadOnly, 0, 64, roce::feth::kGlobal, roce::feth::kRange))});
  write(dir, "bad_flush_past_end", {frame(o::kRcFlush, p, flush(kRegionAll, 4096 - 8, 64, roce::feth::kGlobal, roce::feth::kRange))});
  write(dir, "bad_flush_huge", {frame(o::kRcFlush, p, flush(kRegionAll, 0, 0x80000001u, roce::feth::kGlobal, roce::feth::kWholeRegion))});
  write(dir, "bad_atomic_write_misaligned", {frame(o::kRcAtomicWrite, p, reth(kRegionAll, 3, 8), pattern(8, 1))});
  write(dir, "bad_atomic_write_read_only", {frame(o::kRcAtomicWrite, p, reth(kRegionReadOnly, 0, 8), pattern(8, 1))});
  write(dir, "bad_atomic_write_length", {frame(o::kRcAtomicWrite, p, reth(kRegionAll, 0, 16), pattern(8, 1))});
  write(dir, "bad_atomic_write_past_end", {frame(o::kRcAtomicWrite, p, reth(kRegionAtomic, 64, 8), pattern(8, 1))});
  write(dir, "psn_ahead_then_expected", {frame(o::kRcWriteOnly, p + 3, reth(kRegionAll, 0, 8), pattern(8, 1)),
                                         frame(o::kRcWriteOnly, p, reth(kRegionAll, 0, 8), pattern(8, 2))});
  write(dir, "duplicates", {frame(o::kRcWriteOnly, p, reth(kRegionAll, 0, 8), pattern(8, 1), kAll | kProgress),
                            frame(o::kRcFetchAdd, p + 1, atomic(kRegionAll, 8, 1), {}, kAll | kProgress),
                            frame(o::kRcReadRequest, p + 2, reth(kRegionAll, 0, 16), {}, kAll | kProgress),
                            frame(o::kRcWriteOnly, p, reth(kRegionAll, 0, 8), pattern(8, 9)),
                            frame(o::kRcFetchAdd, p + 1, atomic(kRegionAll, 8, 1)),
                            frame(o::kRcReadRequest, p + 2, reth(kRegionAll, 0, 16))});
  write(dir, "duplicates_flush_atomic_write",
        {frame(o::kRcFlush, p, flush(kRegionAll, 0, 64, roce::feth::kGlobal, roce::feth::kRange), {}, kAll | kProgress),
         frame(o::kRcAtomicWrite, p + 1, reth(kRegionAll, 8, 8), pattern(8, 5), kAll | kProgress),
         frame(o::kRcFlush, p, flush(kRegionAll, 0, 64, roce::feth::kGlobal, roce::feth::kRange)),
         frame(o::kRcAtomicWrite, p + 1, reth(kRegionAll, 8, 8), pattern(8, 6)),
         frame(o::kRcAtomicWrite, p, reth(kRegionAll, 16, 8), pattern(8, 7))});
  write(dir, "rnr_then_more", {frame(o::kRcSendOnly, p, {}, pattern(8, 1)), frame(o::kRcSendOnly, p + 1, {}, pattern(8, 2)),
                               frame(o::kRcSendOnly, p + 2, {}, pattern(8, 3))});

  // Responses to the QP's own requests (READ kOurPsn, FETCH_ADD +1, WRITE +2, SEND +3).
  write(dir, "resp_all_good", {frame(o::kRcReadResponseOnly, q, aeth(ack), pattern(256, 1)),
                               frame(o::kRcAtomicAck, q + 1, [&] { ExtHeaders e = aeth(ack, 2); e.atomic_ack.original = 42; return e; }()),
                               frame(o::kRcAck, q + 3, aeth(ack, 4))});
  write(dir, "resp_read_too_long", {frame(o::kRcReadResponseOnly, q, aeth(ack), pattern(300, 1))});
  write(dir, "resp_read_first", {frame(o::kRcReadResponseFirst, q, aeth(ack), pattern(kMtu, 1))});
  write(dir, "resp_ack_skips_read", {frame(o::kRcAck, q + 2, aeth(ack, 3))});
  write(dir, "resp_nak_seq", {frame(o::kRcAck, q + 2, aeth(roce::aeth::nak_syndrome(roce::aeth::NakCode::kPsnSequenceError)))});
  write(dir, "resp_nak_access", {frame(o::kRcAck, q, aeth(roce::aeth::nak_syndrome(roce::aeth::NakCode::kRemoteAccessError)))});
  write(dir, "resp_rnr_nak", {frame(o::kRcAck, q + 3, aeth(roce::aeth::rnr_nak_syndrome(1)))});
  write(dir, "resp_atomic_ack_for_read", {frame(o::kRcAtomicAck, q, [&] { ExtHeaders e = aeth(ack); e.atomic_ack.original = 1; return e; }())});
  write(dir, "resp_read_middle_orphan", {frame(o::kRcReadResponseMiddle, q, {}, pattern(kMtu, 1))});
  // FLUSH +4 and ATOMIC_WRITE +5: each answered by an empty READ Response Only.
  write(dir, "resp_flush_atomic_write", {frame(o::kRcReadResponseOnly, q, aeth(ack), pattern(256, 1)),
                                         frame(o::kRcAtomicAck, q + 1, [&] { ExtHeaders e = aeth(ack, 2); e.atomic_ack.original = 42; return e; }()),
                                         frame(o::kRcAck, q + 3, aeth(ack, 4)),
                                         frame(o::kRcReadResponseOnly, q + 4, aeth(ack, 5)),
                                         frame(o::kRcReadResponseOnly, q + 5, aeth(ack, 6)),
                                         frame(o::kRcReadResponseOnly, q + 5, aeth(ack, 6))});
  write(dir, "resp_flush_before_read", {frame(o::kRcReadResponseOnly, q + 4, aeth(ack, 5)),
                                        frame(o::kRcReadResponseOnly, q, aeth(ack), pattern(256, 1))});
  write(dir, "resp_flush_with_payload", {frame(o::kRcReadResponseOnly, q + 4, aeth(ack, 5), pattern(8, 1))});
  write(dir, "resp_atomic_ack_for_flush", {frame(o::kRcAtomicAck, q + 4, [&] { ExtHeaders e = aeth(ack); e.atomic_ack.original = 1; return e; }())});
  write(dir, "resp_nak_flush", {frame(o::kRcAck, q + 4, aeth(roce::aeth::nak_syndrome(roce::aeth::NakCode::kInvalidRequest)))});

  // UD.
  write(dir, "ud_send_only", {frame(o::kUdSendOnly, 0, deth(kQkey), pattern(200, 1), kAllUd)});
  write(dir, "ud_send_only_imm", {frame(o::kUdSendOnlyImm, 7, imm(3, deth(kQkey)), pattern(30, 2), kAllUd)});
  write(dir, "ud_send_wrong_qkey", {frame(o::kUdSendOnly, 0, deth(kQkey ^ 1), pattern(20, 1), kAllUd)});
  write(dir, "ud_send_too_long", {frame(o::kUdSendOnly, 0, deth(kQkey), pattern(500, 1), kAllUd)});
  write(dir, "ud_to_rc_qp", {frame(o::kUdSendOnly, 0, deth(kQkey), pattern(20, 1))});
  write(dir, "rc_to_ud_qp", {frame(o::kRcSendOnly, p, {}, pattern(20, 1), kAllUd)});

  // Malformed and misdirected.
  {
    Rec good = frame(o::kRcWriteOnly, p, reth(kRegionAll, 0, 32), pattern(32, 1));
    Rec cut = good;
    cut.frame.resize(50);
    cut.flags = kFixAddresses;
    write(dir, "bad_truncated", {cut});
    Rec icrc = good;
    icrc.flags = kFixRcQp | kFixKeys | kFixAddresses;  // the ICRC is not recomputed: wrong
    write(dir, "bad_icrc", {icrc});
    write(dir, "bad_unknown_qp", {frame(o::kRcWriteOnly, p, reth(kRegionAll, 0, 8), pattern(8, 1), kFixKeys | kFixChecksums | kFixAddresses)});
    write(dir, "uc_to_rc_qp", {frame(o::kUcWriteOnly, p, reth(kRegionAll, 0, 8), pattern(8, 1))});
    Rec garbage{kFixAddresses, pattern(64, 0x33)};
    garbage.frame[12] = 0x08;
    garbage.frame[13] = 0x06;
    write(dir, "arp_garbage", {garbage});
  }
  std::printf("seeds written to %s\n", dir.c_str());
  return 0;
}

#endif  // RDMA_RECEIVE_MAKE_CORPUS
