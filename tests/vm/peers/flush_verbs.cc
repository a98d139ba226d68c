// flush_verbs: tests/vm/cases/flush_peer.cc's FLUSH and ATOMIC_WRITE
// protocol over libibverbs on a kernel RDMA device (Linux soft-RoCE's rxe0),
// as target or initiator, so that ufab and the kernel's rxe check each
// other's FLUSH and ATOMIC_WRITE in both directions (the protocol is
// described at the top of flush_peer.cc; keep the two in step).
//
//   flush_verbs --device rxe0 --gid-index 1 --listen 0 --pmem /dev/dax0.0      (target)
//   flush_verbs --device rxe0 --gid-index 1 --connect 127.0.0.1:PORT --cases LIST  (initiator)
//
// As initiator it posts through ibv_qp_ex (ibv_create_qp_ex with
// IBV_QP_EX_WITH_ATOMIC_WRITE): ibv_wr_atomic_write is in rdma-core 44
// (Debian 12). ibv_wr_flush came with rdma-core 45: built with
// -DUFAB_VERBS_FLUSH=1 against such headers (tests/vm/build-trixie-peer.sh
// does it with Debian 13's), the FLUSH cases are there too; without it they
// are refused as not built in. As target it registers its regions with the
// raw FLUSH access bits (1 << 8 GLOBAL, 1 << 9 PERSISTENT), which rdma-core
// 44's ibv_reg_mr and ibv_modify_qp pass to the kernel unchanged; rxe takes
// FLUSH_PERSISTENT only on persistent-memory pages (--pmem: a devdax device).
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/hex.h"

#include "base/error.h"
#include "tools/exchange/exchange.h"
#include "ufab/rdma.hpp"

#ifndef UFAB_VERBS_FLUSH
#define UFAB_VERBS_FLUSH 0
#endif

namespace {

namespace exchange = ufab::exchange;
using std::chrono::milliseconds;
using ufab::Error;
using ufab::hex;
using ufab::Result;
using ufab::Status;

constexpr const char* kUsage = R"(usage: flush_verbs --device NAME --gid-index N --listen PORT [--pmem PATH]    (target)
       flush_verbs --device NAME --gid-index N --connect HOST:PORT --cases LIST   (initiator)

tests/vm/cases/flush_peer's FLUSH and ATOMIC_WRITE protocol over libibverbs.

options:
  --device NAME      the RDMA device, e.g. rxe0
  --gid-index N      the port's GID index of ::ffff:A.B.C.D, type RoCE v2
  --listen PORT      be the target (0: any free port, printed)
  --pmem PATH        target: map 2 MiB of PATH (a devdax device) MAP_SHARED
                     as the pmem region, registered with FLUSH_PERSISTENT
  --connect H:P      be the initiator
  --cases LIST       initiator: comma-separated cases, or "all"
  --timeout S        bound on each wait, in seconds (default 30)

exit status: 0 every case passed, 1 one failed, 2 usage error.
)";

constexpr size_t kPmemSize = 2u << 20;
constexpr size_t kDramSize = 64u << 10;
constexpr int kQps = 3;
constexpr uint8_t kPort = 1;
constexpr uint64_t kAtomicValue = 0x8877665544332211ull;
constexpr uint64_t kAtomicValuePmem = 0x00fdd0eeffc0ad0bull;
// verbs' IBV_ACCESS_FLUSH_GLOBAL and _PERSISTENT (rdma-core >= 45 names them).
constexpr unsigned kAccessFlushGlobal = 1u << 8;
constexpr unsigned kAccessFlushPersistent = 1u << 9;
#if UFAB_VERBS_FLUSH
static_assert(kAccessFlushGlobal == IBV_ACCESS_FLUSH_GLOBAL && kAccessFlushPersistent == IBV_ACCESS_FLUSH_PERSISTENT);
#endif

uint8_t pattern(uint32_t seed, size_t i) {
  return static_cast<uint8_t>(((static_cast<uint32_t>(i) + seed * 7919u) * 2654435761u) >> 24);
}

struct Options {
  std::string device, host, pmem, cases;
  int gid_index = -1;
  bool target = false;
  uint16_t port = 0;
  milliseconds timeout{30000};
};

std::unexpected<Error> failed(const std::string& what, const Error& error) {
  return std::unexpected(error.context(what));
}
std::unexpected<Error> verbs_failed(const std::string& what, int rc) {
  int err = rc > 0 ? rc : errno;
  return std::unexpected(Error(err, what + ": " + std::strerror(err)));
}
std::string dotted(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string(ip >> 16 & 255) + "." + std::to_string(ip >> 8 & 255) + "." +
         std::to_string(ip & 255);
}

template <typename T, int (*Destroy)(T*)>
struct Destroyer {
  void operator()(T* p) const { Destroy(p); }
};
using Context = std::unique_ptr<ibv_context, Destroyer<ibv_context, ibv_close_device>>;
using Pd = std::unique_ptr<ibv_pd, Destroyer<ibv_pd, ibv_dealloc_pd>>;
using Mr = std::unique_ptr<ibv_mr, Destroyer<ibv_mr, ibv_dereg_mr>>;
using Cq = std::unique_ptr<ibv_cq, Destroyer<ibv_cq, ibv_destroy_cq>>;
using Qp = std::unique_ptr<ibv_qp, Destroyer<ibv_qp, ibv_destroy_qp>>;

struct Unmap {
  size_t length;
  void operator()(void* p) const { ::munmap(p, length); }
};
using Mapping = std::unique_ptr<void, Unmap>;

Result<Mapping> map_memory(const std::string& path, size_t length) {
  if (path.empty()) {
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return verbs_failed("mmap of " + std::to_string(length) + " bytes", -1);
    return Mapping(p, Unmap{length});
  }
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return verbs_failed("opening " + path, -1);
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return verbs_failed("mmap MAP_SHARED of 2 MiB of " + path, err);
  return Mapping(p, Unmap{length});
}

Result<Context> open_device(const std::string& name) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return verbs_failed("ibv_get_device_list (is the kernel's ib_uverbs loaded?)", -1);
  Context context;
  for (int i = 0; i < n; ++i) {
    if (name == ibv_get_device_name(list[i])) context.reset(ibv_open_device(list[i]));
  }
  int err = errno;
  ibv_free_device_list(list);
  if (context) return context;
  return verbs_failed("opening RDMA device " + name, err ? err : ENODEV);
}

Result<uint32_t> local_ip(ibv_context* ctx, int gid_index) {
  ibv_gid_entry entry{};
  if (int rc = ibv_query_gid_ex(ctx, kPort, gid_index, &entry, 0); rc != 0) {
    return verbs_failed("reading GID index " + std::to_string(gid_index), rc);
  }
  const uint8_t* raw = entry.gid.raw;
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (entry.gid_type != IBV_GID_TYPE_ROCE_V2 || std::memcmp(raw, kMapped, 12) != 0) {
    return std::unexpected(Error(EINVAL, "GID index " + std::to_string(gid_index) + " is not a RoCE v2 ::ffff:a.b.c.d"));
  }
  return uint32_t(raw[12]) << 24 | uint32_t(raw[13]) << 16 | uint32_t(raw[14]) << 8 | raw[15];
}

// RESET -> INIT -> RTR -> RTS towards `peer` (ufab's QpAttr defaults).
Status connect_qp(ibv_qp* qp, unsigned access, int gid_index, const ufab::rdma::ConnectionData& peer,
                  uint32_t our_psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = kPort;
  a.qp_access_flags = access;
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS); rc != 0) {
    return verbs_failed("ibv_modify_qp to INIT with access " + hex(access), rc);
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = kPort;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
  a.ah_attr.grh.hop_limit = 64;
  uint8_t* dgid = a.ah_attr.grh.dgid.raw;
  dgid[10] = dgid[11] = 0xff;
  for (int i = 0; i < 4; ++i) dgid[12 + i] = static_cast<uint8_t>(peer.ip >> (24 - 8 * i));
  int rc = ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return verbs_failed("ibv_modify_qp to RTR", rc);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = our_psn;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 16;
  rc = ibv_modify_qp(
      qp, &a,
      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return verbs_failed("ibv_modify_qp to RTS", rc);
  return {};
}

Result<ibv_wc> next_completion(ibv_cq* cq, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ibv_wc wc{};
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) return std::unexpected(Error(EIO, "ibv_poll_cq failed"));
    if (n == 1) return wc;
    if (std::chrono::steady_clock::now() >= deadline) {
      return std::unexpected(Error(ETIMEDOUT, "no completion within " + std::to_string(timeout.count()) + " ms"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// ------------------------------------------------------------ the target

std::string answer(const std::string& line, uint8_t* pmem, uint8_t* dram) {
  std::istringstream in(line);
  std::string verb, region;
  uint64_t offset = 0;
  in >> verb >> region >> offset;
  uint8_t* base = region == "pmem" ? pmem : region == "dram" ? dram : nullptr;
  size_t size = region == "pmem" ? kPmemSize : kDramSize;
  if (!in || !base) return "bad unknown request or region: " + exchange::shown(line);
  if (verb == "check") {
    uint64_t length = 0;
    uint32_t seed = 0;
    in >> length >> seed;
    if (!in || offset > size || length > size - offset) return "bad range outside the region";
    for (uint64_t i = 0; i < length; ++i) {
      if (base[offset + i] != pattern(seed, i)) {
        return "bad byte " + std::to_string(offset + i) + " of " + region + " is " + hex(base[offset + i]) +
               ", expected " + hex(pattern(seed, i));
      }
    }
    return "ok " + std::to_string(length) + " bytes at " + region + "+" + hex(offset) + " as written";
  }
  if (verb == "check8") {
    std::string value_hex;
    in >> value_hex;
    auto want = exchange::parse_hex(value_hex, 16);
    if (!want || offset % 8 != 0 || offset + 8 > size) return "bad check8 request";
    uint64_t got = 0;
    std::memcpy(&got, base + offset, 8);
    if (got != *want) return "bad " + region + "+" + hex(offset) + " holds " + hex(got) + ", expected " + hex(*want);
    return "ok " + region + "+" + hex(offset) + " holds " + hex(got);
  }
  return "bad unknown request: " + exchange::shown(line);
}

// ------------------------------------------------------------ the initiator

struct Peer {
  ibv_qp_ex* qpx[kQps];
  ibv_cq* cq[kQps];
  ufab::rdma::ConnectionData remote[kQps];
  const ibv_mr* local_mr;
  uint8_t* local;
};

// Completes the ibv_wr_* request begun by `post` on QP q and waits for it.
template <typename Post>
Result<ibv_wc> execute(Peer& p, int q, uint64_t wr_id, Post post, milliseconds timeout) {
  ibv_qp_ex* qpx = p.qpx[q];
  ibv_wr_start(qpx);
  qpx->wr_id = wr_id;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  post(qpx);
  if (int rc = ibv_wr_complete(qpx); rc != 0) return verbs_failed("ibv_wr_complete", rc);
  auto wc = next_completion(p.cq[q], timeout);
  if (!wc) return wc;
  if (wc->wr_id != wr_id) {
    return std::unexpected(
        Error(EPROTO, "completion for wr_id " + std::to_string(wc->wr_id) + ", expected " + std::to_string(wr_id)));
  }
  return wc;
}

Status expect_success(const Result<ibv_wc>& wc, const std::string& what) {
  if (!wc) return failed(what, wc.error());
  if (wc->status != IBV_WC_SUCCESS) {
    return std::unexpected(Error(EIO, what + ": completion status \"" + ibv_wc_status_str(wc->status) + "\" (" +
                                          std::to_string(wc->status) + ")"));
  }
  return {};
}

Result<std::string> ask(exchange::TcpChannel& ch, const std::string& request, milliseconds timeout) {
  if (auto s = ch.send_all(request + "\n", timeout); !s) return failed("asking the target", s.error());
  auto reply = ch.recv_line(512, timeout);
  if (!reply) return failed("the target's answer to \"" + request + "\"", reply.error());
  if (reply->rfind("ok", 0) != 0) {
    return std::unexpected(Error(EIO, "the target says: " + reply->substr(std::min<size_t>(reply->size(), 4))));
  }
  return reply->substr(std::min<size_t>(reply->size(), 3));
}

std::unexpected<Error> no_region(const char* region) {
  return std::unexpected(Error(ENODEV, std::string("the target has no ") + region + " region"));
}

Result<std::string> atomic_write(Peer& p, exchange::TcpChannel& ch, int r, const char* region, uint64_t offset,
                                 uint64_t value, milliseconds timeout) {
  const auto& rm = p.remote[r];
  if (rm.rkey == 0 && rm.length == 0) return no_region(region);
  auto wc = execute(p, 0, 900 + r, [&](ibv_qp_ex* qpx) {
    ibv_wr_atomic_write(qpx, rm.rkey, rm.addr + offset, &value);  // the 8 bytes as they lie in our memory
  }, timeout);
  if (auto s = expect_success(wc, "ATOMIC_WRITE"); !s) return std::unexpected(s.error());
  if (wc->opcode != IBV_WC_ATOMIC_WRITE) {
    return std::unexpected(Error(EIO, "ATOMIC_WRITE completed with wc opcode " + std::to_string(wc->opcode)));
  }
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(value));
  auto seen = ask(ch, "check8 " + std::string(region) + " " + std::to_string(offset) + " " + digits, timeout);
  if (!seen) return seen;
  return "ibv_wr_atomic_write of " + hex(value) + " completed; target: " + *seen;
}

#if UFAB_VERBS_FLUSH
Result<std::string> write_and_flush(Peer& p, exchange::TcpChannel& ch, int r, const char* region, uint64_t offset,
                                    uint32_t length, uint32_t seed, uint8_t type, uint8_t level,
                                    milliseconds timeout) {
  const auto& rm = p.remote[r];
  if (rm.rkey == 0 && rm.length == 0) return no_region(region);
  for (uint32_t i = 0; i < length; ++i) p.local[i] = pattern(seed, i);
  auto wc = execute(p, 0, seed * 10 + 1, [&](ibv_qp_ex* qpx) {
    ibv_wr_rdma_write(qpx, rm.rkey, rm.addr + offset);
    ibv_wr_set_sge(qpx, p.local_mr->lkey, reinterpret_cast<uint64_t>(p.local), length);
  }, timeout);
  if (auto s = expect_success(wc, "RDMA_WRITE"); !s) return std::unexpected(s.error());
  wc = execute(p, 0, seed * 10 + 2, [&](ibv_qp_ex* qpx) {
    ibv_wr_flush(qpx, rm.rkey, rm.addr + offset, level == IBV_FLUSH_RANGE ? length : 0, type, level);
  }, timeout);
  if (auto s = expect_success(wc, "ibv_wr_flush"); !s) return std::unexpected(s.error());
  if (wc->opcode != IBV_WC_FLUSH) {
    return std::unexpected(Error(EIO, "FLUSH completed with wc opcode " + std::to_string(wc->opcode)));
  }
  auto seen = ask(ch, "check " + std::string(region) + " " + std::to_string(offset) + " " + std::to_string(length) +
                          " " + std::to_string(seed), timeout);
  if (!seen) return seen;
  return std::to_string(length) + "-byte RDMA_WRITE then ibv_wr_flush completed; target: " + *seen;
}

Result<std::string> flush_refused(Peer& p, int q, int r, uint8_t type, ibv_wc_status want, milliseconds timeout) {
  const auto& rm = p.remote[r];
  auto wc = execute(p, q, 800 + q, [&](ibv_qp_ex* qpx) {
    ibv_wr_flush(qpx, rm.rkey, rm.addr, 4096, type, IBV_FLUSH_RANGE);
  }, timeout);
  if (!wc) return std::unexpected(wc.error());
  if (wc->status != want) {
    return std::unexpected(Error(EIO, std::string("completion status \"") + ibv_wc_status_str(wc->status) +
                                          "\", expected \"" + ibv_wc_status_str(want) + "\""));
  }
  return std::string("completion status \"") + ibv_wc_status_str(wc->status) + "\"";
}
#endif

// flush_peer's cases but commit-write (ufab's kSendCommit).
const std::vector<std::string> kAllCases = {"persistent-range", "persistent-mr", "global-range", "global-mr",
                                            "atomic-write",     "atomic-write-pmem", "missing-type", "qp-no-flush"};

Result<std::string> run_case(const std::string& name, Peer& p, exchange::TcpChannel& ch, milliseconds timeout) {
  if (name == "atomic-write") return atomic_write(p, ch, 1, "dram", 8, kAtomicValue, timeout);
  if (name == "atomic-write-pmem") return atomic_write(p, ch, 0, "pmem", 16, kAtomicValuePmem, timeout);
#if UFAB_VERBS_FLUSH
  if (name == "persistent-range") {
    return write_and_flush(p, ch, 0, "pmem", 0x1000, 4096, 11, IBV_FLUSH_PERSISTENT, IBV_FLUSH_RANGE, timeout);
  }
  if (name == "persistent-mr") {
    return write_and_flush(p, ch, 0, "pmem", 0x10000, 8192, 12, IBV_FLUSH_PERSISTENT, IBV_FLUSH_MR, timeout);
  }
  if (name == "global-range") {
    return write_and_flush(p, ch, 1, "dram", 0x1000, 4096, 13, IBV_FLUSH_GLOBAL, IBV_FLUSH_RANGE, timeout);
  }
  if (name == "global-mr") {
    return write_and_flush(p, ch, 1, "dram", 0x4000, 8192, 14, IBV_FLUSH_GLOBAL, IBV_FLUSH_MR, timeout);
  }
  if (name == "missing-type") return flush_refused(p, 1, 1, IBV_FLUSH_PERSISTENT, IBV_WC_REM_ACCESS_ERR, timeout);
  if (name == "qp-no-flush") return flush_refused(p, 2, 2, IBV_FLUSH_GLOBAL, IBV_WC_REM_INV_REQ_ERR, timeout);
#endif
  return std::unexpected(Error(ENOTSUP, "not built in: FLUSH needs ibv_wr_flush (rdma-core >= 45); this build has "
                                        "only ATOMIC_WRITE (tests/vm/build-trixie-peer.sh builds one with FLUSH)"));
}

// ------------------------------------------------------------ both

Result<int> run(const Options& opt) {
  std::vector<std::string> cases;
  if (!opt.target) {
    if (opt.cases == "all") {
      cases = kAllCases;
    } else {
      std::istringstream in(opt.cases);
      for (std::string c; std::getline(in, c, ',');) {
        if (std::find(kAllCases.begin(), kAllCases.end(), c) == kAllCases.end()) {
          return std::unexpected(Error(EINVAL, "--cases: unknown case \"" + c + "\""));
        }
        cases.push_back(c);
      }
    }
  }
  auto context = open_device(opt.device);
  if (!context) return std::unexpected(context.error());
  ibv_context* ctx = context->get();
  auto ip = local_ip(ctx, opt.gid_index);
  if (!ip) return failed(opt.device, ip.error());
  Pd pd(ibv_alloc_pd(ctx));
  if (!pd) return verbs_failed("ibv_alloc_pd", -1);

  auto dram = map_memory("", kDramSize);
  if (!dram) return std::unexpected(dram.error());
  const unsigned remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  const unsigned dram_access = remote | (opt.target ? IBV_ACCESS_REMOTE_ATOMIC | kAccessFlushGlobal : 0);
  Mr dram_mr(ibv_reg_mr(pd.get(), dram->get(), kDramSize, static_cast<int>(dram_access)));
  if (!dram_mr) return verbs_failed("ibv_reg_mr of 64 KiB, access " + hex(dram_access), -1);
  std::optional<Mapping> pmem;
  Mr pmem_mr;
  if (opt.target && !opt.pmem.empty()) {
    auto m = map_memory(opt.pmem, kPmemSize);
    if (!m) return std::unexpected(m.error());
    pmem.emplace(std::move(*m));
    const unsigned access = remote | kAccessFlushGlobal | kAccessFlushPersistent;
    pmem_mr.reset(ibv_reg_mr(pd.get(), pmem->get(), kPmemSize, static_cast<int>(access)));
    if (!pmem_mr) {
      return verbs_failed("ibv_reg_mr of 2 MiB of " + opt.pmem + ", access " + hex(access) +
                              " (rxe takes FLUSH_PERSISTENT only on persistent-memory pages)",
                          -1);
    }
  }

  std::vector<Cq> cqs;
  std::vector<Qp> qps;
  Peer peer{};
  for (int i = 0; i < kQps; ++i) {
    cqs.emplace_back(ibv_create_cq(ctx, 16, nullptr, nullptr, 0));
    if (!cqs.back()) return verbs_failed("ibv_create_cq", -1);
    ibv_qp_init_attr_ex init{};
    init.send_cq = init.recv_cq = cqs.back().get();
    init.qp_type = IBV_QPT_RC;
    init.cap = {.max_send_wr = 8, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
    init.pd = pd.get();
    init.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    init.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_WRITE;
#if UFAB_VERBS_FLUSH
    init.send_ops_flags |= IBV_QP_EX_WITH_FLUSH;
#endif
    qps.emplace_back(ibv_create_qp_ex(ctx, &init));
    if (!qps.back()) return verbs_failed("ibv_create_qp_ex (RC, with ATOMIC_WRITE)", -1);
    peer.qpx[i] = ibv_qp_to_qp_ex(qps.back().get());
    peer.cq[i] = cqs.back().get();
  }
  peer.local_mr = dram_mr.get();
  peer.local = static_cast<uint8_t*>(dram->get());

  std::vector<uint32_t> psn(kQps);
  std::mt19937 rng{std::random_device{}()};
  auto local_line = [&](int i) -> Result<std::string> {
    ufab::rdma::ConnectionData d;
    d.ip = *ip;
    d.qpn = qps[i]->qp_num;
    d.psn = psn[i] = rng() & 0xffffff;
    if (opt.target && i == 0 && pmem_mr) {
      d.addr = reinterpret_cast<uint64_t>(pmem->get()), d.rkey = pmem_mr->rkey, d.length = kPmemSize;
    } else if (opt.target && i != 0) {
      d.addr = reinterpret_cast<uint64_t>(dram->get()), d.rkey = dram_mr->rkey, d.length = kDramSize;
    }
    return exchange::encode_connection_line(d);
  };
  std::vector<std::string> lines;
  for (int i = 0; i < kQps; ++i) {
    auto line = local_line(i);
    if (!line) return failed("encoding our connection data", line.error());
    lines.push_back(*line);
  }

  Result<exchange::TcpChannel> channel = std::unexpected(Error(ENOTCONN, "not connected"));
  if (opt.target) {
    auto listener = exchange::TcpChannel::listen(opt.port);
    if (!listener) return failed("listening on TCP port " + std::to_string(opt.port), listener.error());
    std::printf("flush_verbs: target %s at %s, pmem %s, listening on TCP port %u\n", opt.device.c_str(),
                dotted(*ip).c_str(), pmem ? opt.pmem.c_str() : "none", listener->port());
    channel = listener->accept(opt.timeout);
    if (!channel) return failed("waiting for the initiator", channel.error());
  } else {
    channel = exchange::TcpChannel::connect(opt.host, opt.port, opt.timeout);
    if (!channel) return std::unexpected(channel.error());
    for (const auto& l : lines) {
      if (auto s = channel->send_all(l, opt.timeout); !s) return failed("sending our connection data", s.error());
    }
  }
  for (int i = 0; i < kQps; ++i) {
    auto line = channel->recv_line(exchange::kConnectionLineMax, opt.timeout);
    if (!line) return failed("reading the peer's connection data", line.error());
    auto d = exchange::decode_connection_line(*line);
    if (!d) return failed("the peer's connection data", d.error());
    peer.remote[i] = *d;
    const unsigned access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                            (i < 2 ? kAccessFlushGlobal | kAccessFlushPersistent : 0);
    if (auto s = connect_qp(qps[i].get(), access, opt.gid_index, *d, psn[i]); !s) {
      return failed("connecting QP " + std::to_string(i), s.error());
    }
  }
  if (opt.target) {
    for (const auto& l : lines) {
      if (auto s = channel->send_all(l, opt.timeout); !s) return failed("answering the initiator", s.error());
    }
  }
  std::printf("flush_verbs: QPs %s %s %s connected to %s %s %s at %s\n", hex(qps[0]->qp_num).c_str(),
              hex(qps[1]->qp_num).c_str(), hex(qps[2]->qp_num).c_str(), hex(peer.remote[0].qpn).c_str(),
              hex(peer.remote[1].qpn).c_str(), hex(peer.remote[2].qpn).c_str(), dotted(peer.remote[0].ip).c_str());

  if (opt.target) {
    for (;;) {
      auto line = channel->recv_line(512, opt.timeout * 4);
      if (!line) return failed("waiting for the initiator's next request", line.error());
      if (*line == "done") break;
      std::string reply = answer(*line, pmem ? static_cast<uint8_t*>(pmem->get()) : nullptr,
                                 static_cast<uint8_t*>(dram->get()));
      std::printf("flush_verbs: %s -> %s\n", line->c_str(), reply.c_str());
      if (auto s = channel->send_all(reply + "\n", opt.timeout); !s) return failed("answering", s.error());
    }
    std::printf("flush_verbs: the initiator is done\n");
    return 0;
  }
  int bad = 0;
  for (const auto& c : cases) {
    auto r = run_case(c, peer, *channel, opt.timeout);
    if (r) {
      std::printf("flush_verbs: case %s: OK: %s\n", c.c_str(), r->c_str());
    } else {
      ++bad;
      std::printf("flush_verbs: case %s: FAILED: %s\n", c.c_str(), r.error().message().c_str());
    }
  }
  if (auto s = channel->send_all("done\n", opt.timeout); !s) return failed("telling the target", s.error());
  std::printf("flush_verbs: %zu cases, %d failed\n", cases.size(), bad);
  return bad == 0 ? 0 : 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "flush_verbs: %s\n(run `flush_verbs --help` for usage)\n", message.c_str());
  return 2;
}

bool parse_number(std::string_view text, unsigned max, unsigned* out) {
  if (text.empty() || text.size() > 5) return false;
  unsigned value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > max) return false;
  *out = value;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options opt;
  bool listen = false, connect = false;
  unsigned n = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) return usage_error("unknown option or missing value: " + arg);
    std::string value = argv[++i];
    if (arg == "--device") {
      opt.device = value;
    } else if (arg == "--gid-index") {
      if (!parse_number(value, 255, &n)) return usage_error("--gid-index " + value + ": expected 0-255");
      opt.gid_index = int(n);
    } else if (arg == "--pmem") {
      opt.pmem = value;
    } else if (arg == "--cases") {
      opt.cases = value;
    } else if (arg == "--listen") {
      if (!parse_number(value, 65535, &n)) return usage_error("--listen " + value + ": expected a TCP port");
      opt.port = uint16_t(n);
      listen = true;
    } else if (arg == "--connect") {
      size_t colon = value.rfind(':');
      if (colon == std::string::npos || colon == 0 || !parse_number(value.substr(colon + 1), 65535, &n) || n == 0) {
        return usage_error("--connect " + value + ": expected HOST:PORT");
      }
      opt.port = uint16_t(n);
      opt.host = value.substr(0, colon);
      connect = true;
    } else if (arg == "--timeout") {
      char* end = nullptr;
      long seconds = std::strtol(value.c_str(), &end, 10);
      if (*end != '\0' || seconds <= 0 || seconds > 86400) return usage_error("--timeout " + value + ": 1-86400");
      opt.timeout = milliseconds(seconds * 1000);
    } else {
      return usage_error("unknown option " + arg);
    }
  }
  if (opt.device.empty() || opt.gid_index < 0) return usage_error("--device and --gid-index are required");
  if (listen == connect) return usage_error("give exactly one of --listen PORT and --connect HOST:PORT");
  opt.target = listen;
  if (!opt.target && opt.cases.empty()) return usage_error("the initiator needs --cases LIST (or all)");

  auto rc = run(opt);
  if (!rc) {
    std::fprintf(stderr, "flush_verbs: %s\n", rc.error().message().c_str());
    return 1;
  }
  return *rc;
}
