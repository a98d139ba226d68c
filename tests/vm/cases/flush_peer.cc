// flush_peer: FLUSH and ATOMIC_WRITE between ufab (this program, over the
// public C++ API <ufab/rdma.hpp>) and a peer over libibverbs on Linux
// soft-RoCE (tests/vm/peers/flush_verbs.cc), each result checked in the
// target's memory. tests/vm/rxe_flush_guest.sh runs the two in the VM.
//
//   flush_peer --device 0000:00:02.0 --ip 10.0.0.2 --connect 127.0.0.1:PORT --cases LIST   (initiator)
//   flush_peer --device 0000:00:02.0 --ip 10.0.0.2 --listen 0 [--pmem /dev/dax0.0]         (target)
//   flush_peer --device 0000:00:02.0 --ip 10.0.0.2 --connect 127.0.0.1:PORT --latency N     (initiator)
//
// The protocol (flush_verbs.cc speaks it too; keep the two in step):
//  - The target has three RC QPs and two regions: "pmem" (2 MiB of a
//    durable mapping, --pmem; rights: remote write/read, FLUSH GLOBAL and
//    PERSISTENT) and "dram" (64 KiB of ordinary memory; remote
//    write/read/atomic and FLUSH GLOBAL only). QPs 0 and 1 allow remote
//    write/read/atomic and both FLUSH types; QP 2 no FLUSH at all.
//  - The initiator connects over TCP and sends three tools/exchange lines
//    (its QPs 0-2). The target connects its QPs to them and answers with
//    three lines: QP 0 with the pmem region (address, rkey, length: all 0
//    without --pmem), QP 1 and QP 2 with the dram region.
//  - The initiator runs the cases (--cases) and asks the target to look:
//    "check REGION OFFSET LENGTH SEED" (the bytes are pattern(SEED)) or
//    "check8 REGION OFFSET VALUE" (8 bytes, hex, host order); the target
//    answers "ok ..." or "bad WHY". Then "done".
// Cases: persistent-range, persistent-mr (WRITE, then FLUSH PERSISTENT of
// the range or the whole region, to pmem), global-range, global-mr (the
// same with FLUSH GLOBAL, to dram), atomic-write (ATOMIC_WRITE to dram),
// atomic-write-pmem, missing-type (FLUSH PERSISTENT to dram, which lacks
// it: remote access error; QP 1), qp-no-flush (FLUSH GLOBAL on QP 2:
// remote invalid request), commit-write (a WRITE with kSendCommit to pmem:
// on the wire a WRITE and a FLUSH PERSISTENT of its range; initiator only).
// One line each: "flush_peer: case NAME: OK: ..." or "flush_peer: case
// NAME: FAILED: ...", and at the end the transport's counters
// ("flush_peer: transport: ..., parse errors N, ...").
// --latency N (initiator; after the cases, if any): round trips, one at a
// time (post, wait for the completion), of 64-byte requests on QP 0 (it
// may reach both regions: one PD), each series after 10 unmeasured ones:
// "write" (RDMA_WRITE to dram: the link's round trip), "flush-global"
// (FLUSH GLOBAL of a 64-byte range of dram), and with a pmem region
// "flush-persistent" (FLUSH PERSISTENT of a 64-byte range of pmem) and
// "commit-write" (a 64-byte WRITE with kSendCommit to pmem). All on one QP
// so that the series differ only in the operation: against a ufab target,
// the same requests on QP 1 were slower than on QP 0 (not so against rxe;
// docs/benchmarks.md, "Persistence in the VM"). One line per series:
// "flush_peer: latency NAME: n N, min A, median B, p99 C, max D usec" (or
// "flush_peer: latency NAME: FAILED: ..."); the target answers nothing for
// them, so either peer program serves as the target.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "base/hex.h"

#include "tools/exchange/exchange.h"
#include "ufab/rdma.hpp"

namespace {

namespace rdma = ufab::rdma;
namespace exchange = ufab::exchange;
using std::chrono::milliseconds;
using ufab::Error;
using ufab::hex;
using ufab::Result;
using ufab::Status;

constexpr const char* kUsage = R"(usage: flush_peer --device SPEC --ip A.B.C.D --listen PORT [--pmem PATH]    (target)
       flush_peer --device SPEC --ip A.B.C.D --connect HOST:PORT --cases LIST   (initiator)
       flush_peer --device SPEC --ip A.B.C.D --connect HOST:PORT --latency N    (initiator)

FLUSH (GLOBAL, PERSISTENT; range and whole region) and ATOMIC_WRITE
against tests/vm/peers/flush_verbs (libibverbs), every result checked in
the target's memory. The protocol is described at the top of the source.

options:
  --device SPEC      the ufab port (a PCI address bound to vfio-pci, swnic:...)
  --ip A.B.C.D       its IPv4 address
  --listen PORT      be the target (0: any port, printed)
  --pmem PATH        target: map 2 MiB of PATH (a devdax device, or a file
                     on a durable file system) MAP_SHARED as the pmem
                     region, registered as persistent memory
  --connect H:P      be the initiator
  --cases LIST       initiator: comma-separated cases (see the source), or "all"
  --latency N        initiator: N round trips per series, one at a time, of
                     64-byte WRITE, FLUSH GLOBAL, FLUSH PERSISTENT and
                     commit-complete WRITE; prints min/median/p99/max usec
  --timeout S        bound on each wait, in seconds (default 30)

exit status: 0 every case passed, 1 one failed, 2 usage error.
)";

constexpr size_t kPmemSize = 2u << 20;  // one devdax page
constexpr size_t kDramSize = 64u << 10;
constexpr int kQps = 3;
constexpr uint64_t kAtomicValue = 0x1122334455667788ull;
constexpr uint64_t kAtomicValuePmem = 0x0badc0ffee0ddf00ull;

uint8_t pattern(uint32_t seed, size_t i) {
  return static_cast<uint8_t>(((static_cast<uint32_t>(i) + seed * 7919u) * 2654435761u) >> 24);
}

struct Options {
  std::string device, ip, host, pmem, cases;
  unsigned latency = 0;
  bool target = false;
  uint16_t port = 0;
  milliseconds timeout{30000};
};

std::unexpected<Error> failed(const std::string& what, const Error& error) {
  return std::unexpected(error.context(what));
}

std::string dotted(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string(ip >> 16 & 255) + "." + std::to_string(ip >> 8 & 255) + "." +
         std::to_string(ip & 255);
}

// Memory for a region: the durable mapping, or ordinary pages.
class Mapping {
 public:
  static Result<Mapping> anonymous(size_t length) {
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return std::unexpected(Error(errno, "mmap of " + std::to_string(length) + " bytes"));
    return Mapping(p, length);
  }
  static Result<Mapping> shared(const std::string& path, size_t length) {
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return std::unexpected(Error(errno, "opening " + path + ": " + std::strerror(errno)));
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    ::close(fd);
    if (p == MAP_FAILED) {
      return std::unexpected(Error(err, "mmap MAP_SHARED of " + std::to_string(length) + " bytes of " + path + ": " +
                                            std::strerror(err) + " (a devdax device maps in 2 MiB pages)"));
    }
    return Mapping(p, length);
  }
  Mapping(Mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  Mapping& operator=(Mapping&&) = delete;
  ~Mapping() {
    if (p_) ::munmap(p_, n_);
  }
  uint8_t* data() const { return static_cast<uint8_t*>(p_); }
  size_t size() const { return n_; }

 private:
  Mapping(void* p, size_t n) : p_(p), n_(n) {}
  void* p_;
  size_t n_;
};

// ------------------------------------------------------------ the target

// Answers one "check"/"check8" line against the regions.
std::string answer(const std::string& line, const Mapping* pmem, const Mapping& dram) {
  std::istringstream in(line);
  std::string verb, region;
  uint64_t offset = 0;
  in >> verb >> region >> offset;
  const Mapping* m = region == "pmem" ? pmem : region == "dram" ? &dram : nullptr;
  if (!in || !m) return "bad unknown request or region: " + exchange::shown(line);
  if (verb == "check") {
    uint64_t length = 0;
    uint32_t seed = 0;
    in >> length >> seed;
    if (!in || offset > m->size() || length > m->size() - offset) return "bad range outside the region";
    for (uint64_t i = 0; i < length; ++i) {
      uint8_t got = m->data()[offset + i];
      if (got != pattern(seed, i)) {
        return "bad byte " + std::to_string(offset + i) + " of " + region + " is " + hex(got) + ", expected " +
               hex(pattern(seed, i));
      }
    }
    return "ok " + std::to_string(length) + " bytes at " + region + "+" + hex(offset) + " as written";
  }
  if (verb == "check8") {
    std::string value_hex;
    in >> value_hex;
    auto want = exchange::parse_hex(value_hex, 16);
    if (!want || offset % 8 != 0 || offset + 8 > m->size()) return "bad check8 request";
    uint64_t got = 0;
    std::memcpy(&got, m->data() + offset, 8);
    if (got != *want) return "bad " + region + "+" + hex(offset) + " holds " + hex(got) + ", expected " + hex(*want);
    return "ok " + region + "+" + hex(offset) + " holds " + hex(got);
  }
  return "bad unknown request: " + exchange::shown(line);
}

// ------------------------------------------------------------ the initiator

struct Peer {
  rdma::QueuePair* qp[kQps];
  rdma::CompletionQueue* cq[kQps];
  rdma::ConnectionData remote[kQps];  // [0]: pmem, [1] and [2]: dram
};

// Posts one signaled request on QP q and waits for its completion, whatever
// its status.
Result<rdma::WorkCompletion> execute(Peer& p, int q, rdma::SendWr wr, milliseconds timeout) {
  wr.flags |= rdma::kSendSignaled;
  if (auto posted = p.qp[q]->post_send(wr); !posted) return failed("posting", posted.error());
  rdma::WorkCompletion wc;
  auto n = p.cq[q]->wait(std::span(&wc, 1), timeout);
  if (!n) return failed("polling the completion queue", n.error());
  if (*n == 0) return std::unexpected(Error(ETIMEDOUT, "no completion within " + std::to_string(timeout.count()) + " ms"));
  if (wc.wr_id != wr.wr_id) {
    return std::unexpected(Error(EPROTO, "completion for wr_id " + std::to_string(wc.wr_id) + ", expected " +
                                             std::to_string(wr.wr_id)));
  }
  return wc;
}

Status expect_success(const Result<rdma::WorkCompletion>& wc, const std::string& what) {
  if (!wc) return failed(what, wc.error());
  if (wc->status != rdma::WcStatus::kSuccess) {
    return std::unexpected(Error(EIO, what + ": completion status \"" + rdma::wc_status_name(wc->status) + "\"" +
                                          (wc->error.empty() ? "" : ": " + wc->error)));
  }
  return {};
}

// Asks the target to look at its memory.
Result<std::string> ask(exchange::TcpChannel& ch, const std::string& request, milliseconds timeout) {
  if (auto s = ch.send_all(request + "\n", timeout); !s) return failed("asking the target", s.error());
  auto reply = ch.recv_line(512, timeout);
  if (!reply) return failed("the target's answer to \"" + request + "\"", reply.error());
  if (reply->rfind("ok", 0) != 0) {
    return std::unexpected(Error(EIO, "the target says: " + reply->substr(std::min<size_t>(reply->size(), 4))));
  }
  return reply->substr(std::min<size_t>(reply->size(), 3));
}

struct Local {
  uint8_t* buf;
  const rdma::MemoryRegion* mr;
};

// WRITE pattern(seed) to remote[r] + offset, FLUSH it (type, level), then
// ask the target whether the bytes are there.
Result<std::string> write_and_flush(Peer& p, Local& l, exchange::TcpChannel& ch, int r, const char* region,
                                    uint64_t offset, uint32_t length, uint32_t seed, uint8_t type, uint8_t level,
                                    milliseconds timeout) {
  for (uint32_t i = 0; i < length; ++i) l.buf[i] = pattern(seed, i);
  rdma::Sge sge = l.mr->sge(0, length);
  const rdma::ConnectionData& rm = p.remote[r];
  if (rm.rkey == 0 && rm.length == 0) return std::unexpected(Error(ENODEV, std::string("the target has no ") + region + " region"));
  rdma::SendWr write{.wr_id = seed * 10 + 1, .opcode = rdma::WrOpcode::kRdmaWrite, .sgl = {&sge, 1}};
  write.remote_addr = rm.addr + offset;
  write.rkey = rm.rkey;
  if (auto s = expect_success(execute(p, 0, write, timeout), "RDMA_WRITE"); !s) return std::unexpected(s.error());
  rdma::SendWr flush{.wr_id = seed * 10 + 2, .opcode = rdma::WrOpcode::kFlush};
  flush.remote_addr = rm.addr + offset;
  flush.rkey = rm.rkey;
  flush.flush_type = type;
  flush.flush_level = level;
  flush.flush_length = level == rdma::kFlushRange ? length : 0;
  auto wc = execute(p, 0, flush, timeout);
  if (auto s = expect_success(wc, "FLUSH"); !s) return std::unexpected(s.error());
  if (wc->opcode != rdma::WcOpcode::kFlush) {
    return std::unexpected(Error(EIO, std::string("FLUSH completed as ") + rdma::wc_opcode_name(wc->opcode)));
  }
  auto seen = ask(ch, "check " + std::string(region) + " " + std::to_string(offset) + " " + std::to_string(length) +
                          " " + std::to_string(seed), timeout);
  if (!seen) return seen;
  return std::to_string(length) + "-byte RDMA_WRITE then FLUSH completed; target: " + *seen;
}

// A commit-complete WRITE (kSendCommit) of pattern(seed): ufab sends the
// WRITE and a FLUSH PERSISTENT of its range and completes the WRITE once
// the FLUSH is answered.
Result<std::string> commit_write(Peer& p, Local& l, exchange::TcpChannel& ch, uint64_t offset, uint32_t length,
                                 uint32_t seed, milliseconds timeout) {
  const rdma::ConnectionData& rm = p.remote[0];
  if (rm.rkey == 0 && rm.length == 0) return std::unexpected(Error(ENODEV, "the target has no pmem region"));
  for (uint32_t i = 0; i < length; ++i) l.buf[i] = pattern(seed, i);
  rdma::Sge sge = l.mr->sge(0, length);
  rdma::SendWr write{.wr_id = seed * 10 + 1, .opcode = rdma::WrOpcode::kRdmaWrite, .flags = rdma::kSendCommit,
                     .sgl = {&sge, 1}};
  write.remote_addr = rm.addr + offset;
  write.rkey = rm.rkey;
  auto wc = execute(p, 0, write, timeout);
  if (auto s = expect_success(wc, "RDMA_WRITE with kSendCommit"); !s) return std::unexpected(s.error());
  if (wc->opcode != rdma::WcOpcode::kRdmaWrite) {
    return std::unexpected(Error(EIO, std::string("the commit-complete WRITE completed as ") +
                                          rdma::wc_opcode_name(wc->opcode)));
  }
  auto seen = ask(ch, "check pmem " + std::to_string(offset) + " " + std::to_string(length) + " " +
                          std::to_string(seed), timeout);
  if (!seen) return seen;
  return std::to_string(length) + "-byte commit-complete RDMA_WRITE completed (once); target: " + *seen;
}

Result<std::string> atomic_write(Peer& p, exchange::TcpChannel& ch, int r, const char* region, uint64_t offset,
                                 uint64_t value, milliseconds timeout) {
  const rdma::ConnectionData& rm = p.remote[r];
  if (rm.rkey == 0 && rm.length == 0) return std::unexpected(Error(ENODEV, std::string("the target has no ") + region + " region"));
  rdma::SendWr wr{.wr_id = 900 + static_cast<uint64_t>(r), .opcode = rdma::WrOpcode::kAtomicWrite};
  wr.remote_addr = rm.addr + offset;
  wr.rkey = rm.rkey;
  wr.atomic_value = value;
  auto wc = execute(p, 0, wr, timeout);
  if (auto s = expect_success(wc, "ATOMIC_WRITE"); !s) return std::unexpected(s.error());
  if (wc->opcode != rdma::WcOpcode::kAtomicWrite) {
    return std::unexpected(Error(EIO, std::string("ATOMIC_WRITE completed as ") + rdma::wc_opcode_name(wc->opcode)));
  }
  char digits[17];
  std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(value));
  auto seen = ask(ch, "check8 " + std::string(region) + " " + std::to_string(offset) + " " + digits, timeout);
  if (!seen) return seen;
  return "ATOMIC_WRITE of " + hex(value) + " completed; target: " + *seen;
}

// A FLUSH that must fail with `want` on QP q.
Result<std::string> flush_refused(Peer& p, int q, int r, uint8_t type, rdma::WcStatus want, milliseconds timeout) {
  const rdma::ConnectionData& rm = p.remote[r];
  rdma::SendWr flush{.wr_id = 800 + static_cast<uint64_t>(q), .opcode = rdma::WrOpcode::kFlush};
  flush.remote_addr = rm.addr;
  flush.rkey = rm.rkey;
  flush.flush_type = type;
  flush.flush_level = rdma::kFlushRange;
  flush.flush_length = 4096;
  auto wc = execute(p, q, flush, timeout);
  if (!wc) return std::unexpected(wc.error());
  if (wc->status != want) {
    return std::unexpected(Error(EIO, std::string("completion status \"") + rdma::wc_status_name(wc->status) +
                                          "\", expected \"" + rdma::wc_status_name(want) + "\"" +
                                          (wc->error.empty() ? "" : ": " + wc->error)));
  }
  return std::string("completion status \"") + rdma::wc_status_name(wc->status) + "\"" +
         (wc->error.empty() ? "" : " (" + wc->error + ")");
}

const std::vector<std::string> kAllCases = {"persistent-range", "persistent-mr",     "global-range",
                                            "global-mr",        "atomic-write",      "atomic-write-pmem",
                                            "missing-type",     "qp-no-flush",       "commit-write"};

Result<std::string> run_case(const std::string& name, Peer& p, Local& l, exchange::TcpChannel& ch,
                             milliseconds timeout) {
  if (name == "persistent-range") {
    return write_and_flush(p, l, ch, 0, "pmem", 0x1000, 4096, 1, rdma::kFlushTypePersistent, rdma::kFlushRange,
                           timeout);
  }
  if (name == "persistent-mr") {
    return write_and_flush(p, l, ch, 0, "pmem", 0x10000, 8192, 2, rdma::kFlushTypePersistent,
                           rdma::kFlushWholeRegion, timeout);
  }
  if (name == "global-range") {
    return write_and_flush(p, l, ch, 1, "dram", 0x1000, 4096, 3, rdma::kFlushTypeGlobal, rdma::kFlushRange, timeout);
  }
  if (name == "global-mr") {
    return write_and_flush(p, l, ch, 1, "dram", 0x4000, 8192, 4, rdma::kFlushTypeGlobal, rdma::kFlushWholeRegion,
                           timeout);
  }
  if (name == "commit-write") return commit_write(p, l, ch, 0x20000, 4096, 5, timeout);
  if (name == "atomic-write") return atomic_write(p, ch, 1, "dram", 8, kAtomicValue, timeout);
  if (name == "atomic-write-pmem") return atomic_write(p, ch, 0, "pmem", 16, kAtomicValuePmem, timeout);
  if (name == "missing-type") {
    return flush_refused(p, 1, 1, rdma::kFlushTypePersistent, rdma::WcStatus::kRemAccessErr, timeout);
  }
  if (name == "qp-no-flush") {
    return flush_refused(p, 2, 2, rdma::kFlushTypeGlobal, rdma::WcStatus::kRemInvReqErr, timeout);
  }
  return std::unexpected(Error(EINVAL, "unknown case"));
}

// ------------------------------------------------------------ --latency

struct LatencySeries {
  const char* name;
  int qp;      // the initiator's QP
  int region;  // remote[region]
  rdma::WrOpcode opcode;
  uint8_t flush_type;
  bool commit;
};

// N round trips of one 64-byte request, one at a time; the summary line's
// text (n, min, median, p99, max in microseconds).
Result<std::string> latency_series(Peer& p, Local& l, const LatencySeries& s, unsigned n, milliseconds timeout) {
  constexpr uint32_t kLength = 64;
  constexpr unsigned kWarmup = 10;
  const rdma::ConnectionData& rm = p.remote[s.region];
  if (rm.rkey == 0 && rm.length == 0) return std::unexpected(Error(ENODEV, "the target has no such region"));
  for (uint32_t i = 0; i < kLength; ++i) l.buf[i] = pattern(77, i);
  rdma::Sge sge = l.mr->sge(0, kLength);
  std::vector<double> usec;
  usec.reserve(n);
  for (unsigned i = 0; i < kWarmup + n; ++i) {
    rdma::SendWr wr{.wr_id = 5000 + i, .opcode = s.opcode};
    wr.remote_addr = rm.addr + 0x8000;  // away from the cases' bytes
    wr.rkey = rm.rkey;
    if (s.opcode == rdma::WrOpcode::kFlush) {
      wr.flush_type = s.flush_type;
      wr.flush_level = rdma::kFlushRange;
      wr.flush_length = kLength;
    } else {
      wr.sgl = {&sge, 1};
      if (s.commit) wr.flags = rdma::kSendCommit;
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto wc = execute(p, s.qp, wr, timeout);
    const auto t1 = std::chrono::steady_clock::now();
    if (auto ok = expect_success(wc, "round trip " + std::to_string(i + 1)); !ok) return std::unexpected(ok.error());
    if (i >= kWarmup) usec.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(usec.begin(), usec.end());
  auto at = [&](double q) { return usec[std::min(usec.size() - 1, static_cast<size_t>(q * double(usec.size())))]; };
  char text[160];
  std::snprintf(text, sizeof text, "n %zu, min %.1f, median %.1f, p99 %.1f, max %.1f usec", usec.size(), usec.front(),
                at(0.5), at(0.99), usec.back());
  return std::string(text);
}

// The series of --latency; returns how many failed.
int run_latency(Peer& p, Local& l, unsigned n, milliseconds timeout) {
  const LatencySeries series[] = {
      {"write", 0, 1, rdma::WrOpcode::kRdmaWrite, 0, false},
      {"flush-global", 0, 1, rdma::WrOpcode::kFlush, rdma::kFlushTypeGlobal, false},
      {"flush-persistent", 0, 0, rdma::WrOpcode::kFlush, rdma::kFlushTypePersistent, false},
      {"commit-write", 0, 0, rdma::WrOpcode::kRdmaWrite, 0, true},
  };
  int bad = 0;
  for (const auto& s : series) {
    if (s.region == 0 && p.remote[0].rkey == 0 && p.remote[0].length == 0) {
      std::printf("flush_peer: latency %s: not run: the target has no pmem region (start it with --pmem)\n", s.name);
      continue;
    }
    auto r = latency_series(p, l, s, n, timeout);
    if (r) {
      std::printf("flush_peer: latency %s: %s\n", s.name, r->c_str());
    } else {
      ++bad;
      std::printf("flush_peer: latency %s: FAILED: %s\n", s.name, r.error().message().c_str());
    }
  }
  return bad;
}

Result<std::vector<std::string>> parse_cases(const std::string& list) {
  if (list == "all") return kAllCases;
  std::vector<std::string> out;
  std::istringstream in(list);
  for (std::string c; std::getline(in, c, ',');) {
    if (std::find(kAllCases.begin(), kAllCases.end(), c) == kAllCases.end()) {
      return std::unexpected(Error(EINVAL, "unknown case \"" + c + "\""));
    }
    out.push_back(c);
  }
  if (out.empty()) return std::unexpected(Error(EINVAL, "no cases"));
  return out;
}

// ------------------------------------------------------------ both

Result<int> run(const Options& opt) {
  auto device = rdma::Device::open(opt.device, {.ip = opt.ip, .progress_thread = true});
  if (!device) return failed("opening " + opt.device, device.error());
  rdma::Device& dev = **device;
  auto pd = dev.alloc_pd();
  if (!pd) return failed("allocating a protection domain", pd.error());

  std::vector<std::string> cases;
  if (!opt.target && !opt.cases.empty()) {
    auto parsed = parse_cases(opt.cases);
    if (!parsed) return failed("--cases " + opt.cases, parsed.error());
    cases = *parsed;
  }

  // Regions: the target's dram and (with --pmem) pmem; the initiator's one
  // local buffer for WRITE sources.
  auto dram = Mapping::anonymous(kDramSize);
  if (!dram) return std::unexpected(dram.error());
  std::optional<Mapping> pmem;
  std::optional<rdma::MemoryRegion> pmem_mr;
  const rdma::AccessFlags remote = rdma::kLocalWrite | rdma::kRemoteWrite | rdma::kRemoteRead;
  auto dram_mr = pd->register_mr(dram->data(), dram->size(),
                                 remote | (opt.target ? rdma::kRemoteAtomic | rdma::kFlushGlobal : 0));
  if (!dram_mr) return failed("registering " + std::to_string(kDramSize) + " bytes", dram_mr.error());
  if (opt.target && !opt.pmem.empty()) {
    auto m = Mapping::shared(opt.pmem, kPmemSize);
    if (!m) return std::unexpected(m.error());
    pmem.emplace(std::move(*m));
    auto mr = pd->register_mr(pmem->data(), pmem->size(), remote | rdma::kFlushGlobal | rdma::kFlushPersistent,
                              rdma::MemoryType::kPersistent);
    if (!mr) {
      return failed("registering 2 MiB of " + opt.pmem + " as persistent memory with FLUSH_PERSISTENT", mr.error());
    }
    pmem_mr.emplace(std::move(*mr));
  }

  std::vector<std::unique_ptr<rdma::CompletionQueue>> cqs;
  std::vector<std::unique_ptr<rdma::QueuePair>> qps;
  std::string lines;
  for (int i = 0; i < kQps; ++i) {
    auto cq = dev.create_cq(16);
    if (!cq) return failed("creating a completion queue", cq.error());
    auto qp = pd->create_qp({.type = rdma::QpType::kRc, .send_cq = cq->get(), .recv_cq = cq->get(),
                             .caps = {.max_send_wr = 8, .max_recv_wr = 1}});
    if (!qp) return failed("creating a queue pair", qp.error());
    cqs.push_back(std::move(*cq));
    qps.push_back(std::move(*qp));
  }

  auto local_line = [&](int i) -> Result<std::string> {
    rdma::ConnectionData d = qps[i]->local();
    if (opt.target) {
      if (i == 0 && pmem_mr) {
        d.addr = reinterpret_cast<uint64_t>(pmem_mr->addr()), d.rkey = pmem_mr->rkey(),
        d.length = static_cast<uint32_t>(pmem_mr->length());
      } else if (i != 0) {
        d.addr = reinterpret_cast<uint64_t>(dram_mr->addr()), d.rkey = dram_mr->rkey(),
        d.length = static_cast<uint32_t>(dram_mr->length());
      }
    }
    return exchange::encode_connection_line(d);
  };

  Result<exchange::TcpChannel> channel = std::unexpected(Error(ENOTCONN, "not connected"));
  if (opt.target) {
    auto listener = exchange::TcpChannel::listen(opt.port);
    if (!listener) return failed("listening on TCP port " + std::to_string(opt.port), listener.error());
    std::printf("flush_peer: target %s at %s, pmem %s, listening on TCP port %u\n", dev.name().c_str(),
                opt.ip.c_str(), pmem ? opt.pmem.c_str() : "none", listener->port());
    channel = listener->accept(opt.timeout);
    if (!channel) return failed("waiting for the initiator", channel.error());
  } else {
    channel = exchange::TcpChannel::connect(opt.host, opt.port, opt.timeout);
    if (!channel) return std::unexpected(channel.error());
    for (int i = 0; i < kQps; ++i) {
      auto line = local_line(i);
      if (!line) return failed("encoding our connection data", line.error());
      if (auto s = channel->send_all(*line, opt.timeout); !s) return failed("sending our connection data", s.error());
    }
  }
  Peer peer{};
  for (int i = 0; i < kQps; ++i) {
    auto line = channel->recv_line(exchange::kConnectionLineMax, opt.timeout);
    if (!line) return failed("reading the peer's connection data", line.error());
    auto d = exchange::decode_connection_line(*line);
    if (!d) return failed("the peer's connection data", d.error());
    peer.remote[i] = *d;
    rdma::QpAttr attr;
    // The target's QPs: 0 and 1 take both FLUSH types, 2 none.
    attr.access_flags = rdma::kRemoteWrite | rdma::kRemoteRead | rdma::kRemoteAtomic |
                        (i < 2 ? rdma::kFlushGlobal | rdma::kFlushPersistent : 0);
    if (auto s = qps[i]->connect(*d, attr); !s) return failed("connecting QP " + std::to_string(i), s.error());
    peer.qp[i] = qps[i].get();
    peer.cq[i] = cqs[i].get();
  }
  if (opt.target) {
    for (int i = 0; i < kQps; ++i) {
      auto line = local_line(i);
      if (!line) return failed("encoding our connection data", line.error());
      if (auto s = channel->send_all(*line, opt.timeout); !s) return failed("answering the initiator", s.error());
    }
  }
  std::printf("flush_peer: QPs %s %s %s connected to %s %s %s at %s\n", hex(qps[0]->qp_num()).c_str(),
              hex(qps[1]->qp_num()).c_str(), hex(qps[2]->qp_num()).c_str(), hex(peer.remote[0].qpn).c_str(),
              hex(peer.remote[1].qpn).c_str(), hex(peer.remote[2].qpn).c_str(), dotted(peer.remote[0].ip).c_str());

  if (opt.target) {
    // Answer the initiator's questions until it is done.
    for (int n = 0;; ++n) {
      auto line = channel->recv_line(512, opt.timeout * 4);
      if (!line) return failed("waiting for the initiator's next request", line.error());
      if (*line == "done") break;
      std::string reply = answer(*line, pmem ? &*pmem : nullptr, *dram);
      std::printf("flush_peer: %s -> %s\n", line->c_str(), reply.c_str());
      if (auto s = channel->send_all(reply + "\n", opt.timeout); !s) return failed("answering", s.error());
    }
    std::printf("flush_peer: the initiator is done\n");
    std::printf("flush_peer: transport: %s\n", rdma::to_string(dev.stats()).c_str());
    return 0;
  }
  Local local{dram->data(), &*dram_mr};
  int bad = 0;
  for (const auto& c : cases) {
    auto r = run_case(c, peer, local, *channel, opt.timeout);
    if (r) {
      std::printf("flush_peer: case %s: OK: %s\n", c.c_str(), r->c_str());
    } else {
      ++bad;
      std::printf("flush_peer: case %s: FAILED: %s\n", c.c_str(), r.error().message().c_str());
    }
  }
  if (opt.latency > 0) bad += run_latency(peer, local, opt.latency, opt.timeout);
  if (auto s = channel->send_all("done\n", opt.timeout); !s) return failed("telling the target", s.error());
  std::printf("flush_peer: %zu cases, %d failed%s\n", cases.size(), bad,
              opt.latency > 0 ? " (latency series counted)" : "");
  std::printf("flush_peer: transport: %s\n", rdma::to_string(dev.stats()).c_str());
  return bad == 0 ? 0 : 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "flush_peer: %s\n(run `flush_peer --help` for usage)\n", message.c_str());
  return 2;
}

bool parse_port(std::string_view text, uint16_t* port) {
  if (text.empty() || text.size() > 5) return false;
  unsigned value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return false;
  *port = static_cast<uint16_t>(value);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options opt;
  bool listen = false, connect = false;
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
    } else if (arg == "--ip") {
      opt.ip = value;
    } else if (arg == "--pmem") {
      opt.pmem = value;
    } else if (arg == "--cases") {
      opt.cases = value;
    } else if (arg == "--listen") {
      if (!parse_port(value, &opt.port)) return usage_error("--listen " + value + ": expected a TCP port, 0-65535");
      listen = true;
    } else if (arg == "--connect") {
      size_t colon = value.rfind(':');
      if (colon == std::string::npos || colon == 0 || !parse_port(value.substr(colon + 1), &opt.port) ||
          opt.port == 0) {
        return usage_error("--connect " + value + ": expected HOST:PORT, e.g. 127.0.0.1:18515");
      }
      opt.host = value.substr(0, colon);
      connect = true;
    } else if (arg == "--timeout") {
      char* end = nullptr;
      long seconds = std::strtol(value.c_str(), &end, 10);
      if (*end != '\0' || seconds <= 0 || seconds > 86400) return usage_error("--timeout " + value + ": 1-86400");
      opt.timeout = milliseconds(seconds * 1000);
    } else if (arg == "--latency") {
      char* end = nullptr;
      long n = std::strtol(value.c_str(), &end, 10);
      if (*end != '\0' || n <= 0 || n > 1000000) return usage_error("--latency " + value + ": 1-1000000 round trips");
      opt.latency = static_cast<unsigned>(n);
    } else {
      return usage_error("unknown option " + arg);
    }
  }
  if (opt.device.empty()) return usage_error("--device is required");
  if (listen == connect) return usage_error("give exactly one of --listen PORT and --connect HOST:PORT");
  opt.target = listen;
  if (!opt.target && opt.cases.empty() && opt.latency == 0) {
    return usage_error("the initiator needs --cases LIST (or all), --latency N, or both");
  }
  if (opt.target && (!opt.cases.empty() || opt.latency > 0)) return usage_error("--cases and --latency are the initiator's");
  if (!opt.target && !opt.pmem.empty()) return usage_error("--pmem is the target's");

  auto rc = run(opt);
  if (!rc) {
    std::fprintf(stderr, "flush_peer: %s\n", rc.error().message().c_str());
    return 1;
  }
  return *rc;
}
