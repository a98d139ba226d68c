// FLUSH and ATOMIC_WRITE end to end: two ufab devices on the two ports of
// one software NIC, in one thread (explicit progress calls), through the
// C++ API. Every placement type and selectivity, ATOMIC_WRITE values and
// alignment, every access violation with its exact completion status,
// resource accounting against max_rd_atomic, the post-time checks, issue
// 13's registration rule, and a long mixed run of WRITE, FLUSH and
// ATOMIC_WRITE under 5% loss and reordering where every operation executes
// exactly once. The responder against crafted frames (exact NAKs,
// duplicates) is in hostile_peer_test.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ufab/rdma.hpp"

// Work requests are written as designated initializers naming only the
// fields that matter (GCC bug 96868: gcc 12 warns about every other one).
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace ufab::rdma {
namespace {

struct Side {
  std::unique_ptr<Device> dev;
  std::optional<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<QueuePair> qp;
  std::vector<uint8_t> buf;
  std::optional<MemoryRegion> mr;
};

constexpr size_t kBuf = 1 << 20;
constexpr AccessFlags kQpFlush = kRemoteAccess | kFlushGlobal | kFlushPersistent;
constexpr AccessFlags kMrFlush = kLocalWrite | kRemoteAccess | kFlushGlobal;

struct PairSetup {
  std::map<std::string, std::string> params_a, params_b;
  AccessFlags qp_access_b = kQpFlush;  // what A may do at B
  AccessFlags mr_access_b = kMrFlush;
  QpAttr tuning{};
};

class Flush : public ::testing::Test {
 protected:
  void SetUp() override { connect(PairSetup{}); }

  void connect(PairSetup s) {
    a_ = Side{};
    b_ = Side{};
    std::string name = "flush" + std::to_string(::getpid()) + "-" + std::to_string(serial_++);
    s.params_a["stale"] = "reset";
    open(a_, "swnic:" + name + ":0", "10.0.0.1", s.params_a, kMrFlush);
    open(b_, "swnic:" + name + ":1", "10.0.0.2", s.params_b, s.mr_access_b);
    QpAttr ta = s.tuning, tb = s.tuning;
    ta.access_flags = kQpFlush;
    tb.access_flags = s.qp_access_b;
    auto st = a_.qp->connect(b_.qp->local(), ta);
    ASSERT_TRUE(st) << st.error().message();
    st = b_.qp->connect(a_.qp->local(), tb);
    ASSERT_TRUE(st) << st.error().message();
  }

  void open(Side& s, const std::string& spec, const std::string& ip, std::map<std::string, std::string> params,
            AccessFlags mr_access) {
    auto dev = Device::open(spec, {.ip = ip, .params = params});
    ASSERT_TRUE(dev) << dev.error().message();
    s.dev = std::move(*dev);
    auto pd = s.dev->alloc_pd();
    ASSERT_TRUE(pd);
    s.pd.emplace(std::move(*pd));
    auto cq = s.dev->create_cq(1024);
    ASSERT_TRUE(cq);
    s.cq = std::move(*cq);
    auto qp = s.pd->create_qp({.type = QpType::kRc, .send_cq = s.cq.get(), .recv_cq = s.cq.get(),
                               .caps = {.max_send_wr = 512, .max_recv_wr = 16}});
    ASSERT_TRUE(qp) << qp.error().message();
    s.qp = std::move(*qp);
    s.buf.assign(kBuf, 0);
    auto mr = s.pd->register_mr(s.buf.data(), s.buf.size(), mr_access);
    ASSERT_TRUE(mr) << mr.error().message();
    s.mr.emplace(std::move(*mr));
  }

  uint64_t b_addr(size_t off) const { return reinterpret_cast<uintptr_t>(b_.buf.data()) + off; }

  SendWr flush(uint64_t wr_id, uint8_t type, uint8_t level, size_t off = 0, uint64_t len = 4096) const {
    return SendWr{.wr_id = wr_id, .opcode = WrOpcode::kFlush, .flags = kSendSignaled, .remote_addr = b_addr(off),
                  .rkey = b_.mr->rkey(), .flush_type = type, .flush_level = level, .flush_length = len};
  }
  SendWr atomic_write(uint64_t wr_id, size_t off, uint64_t value) const {
    return SendWr{.wr_id = wr_id, .opcode = WrOpcode::kAtomicWrite, .flags = kSendSignaled, .remote_addr = b_addr(off),
                  .rkey = b_.mr->rkey(), .atomic_value = value};
  }

  // Polls `s` while progressing both sides until one completion arrives.
  WorkCompletion next(Side& s) {
    WorkCompletion wc[1];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      a_.dev->progress();
      b_.dev->progress();
      auto n = s.cq->poll(wc);
      EXPECT_TRUE(n);
      if (n && *n == 1) return wc[0];
    }
    ADD_FAILURE() << "no completion within 10 s";
    return {};
  }

  // Posts `wr` on A and returns its completion.
  WorkCompletion run(const SendWr& wr) {
    auto st = a_.qp->post_send(wr);
    EXPECT_TRUE(st) << st.error().message();
    if (!st) return {};
    return next(a_);
  }

  uint64_t b_load(size_t off) const {
    uint64_t v;
    std::memcpy(&v, b_.buf.data() + off, 8);
    return v;
  }

  static int serial_;
  Side a_, b_;
};
int Flush::serial_ = 0;

TEST_F(Flush, SoftRoceOffersGlobalAndPersistentFlushAndAtomicWrite) {
  const ufab_device_attr& attr = a_.dev->attr();
  EXPECT_TRUE(attr.caps & UFAB_DEVICE_CAP_FLUSH_GLOBAL);
  EXPECT_TRUE(attr.caps & UFAB_DEVICE_CAP_ATOMIC_WRITE);
  EXPECT_TRUE(attr.caps & UFAB_DEVICE_CAP_FLUSH_PERSISTENT);
  EXPECT_TRUE(attr.mem_types & (1u << UFAB_MEM_PERSISTENT));
}

// Issue 13's rule: host memory (DRAM) registered for FLUSH PERSISTENT, or
// as persistent memory, is refused, saying why and what to use instead.
TEST_F(Flush, PersistentFlushTargetsOnDramAreRefusedAtRegistration) {
  std::vector<uint8_t> mem(4096);
  for (AccessFlags access : {kFlushPersistent, kLocalWrite | kRemoteWrite | kFlushGlobal | kFlushPersistent}) {
    for (MemoryType type : {MemoryType::kHost, MemoryType::kPersistent}) {
      auto mr = b_.pd->register_mr(mem.data(), mem.size(), access, type);
      ASSERT_FALSE(mr) << "FLUSH_PERSISTENT accepted on DRAM";
      EXPECT_EQ(mr.error().code(), EINVAL);
      const std::string why = mr.error().message();
      EXPECT_NE(why.find("private mapping"), std::string::npos) << "says what the memory is: " << why;
      EXPECT_NE(why.find("DRAM"), std::string::npos) << why;
      EXPECT_NE(why.find("UFAB_ACCESS_FLUSH_GLOBAL"), std::string::npos) << why;
      EXPECT_NE(why.find("MAP_SHARED"), std::string::npos) << "says what to map instead: " << why;
    }
  }
  auto ok = b_.pd->register_mr(mem.data(), mem.size(), kFlushGlobal);
  ASSERT_TRUE(ok) << ok.error().message();
  EXPECT_NE(ok->rkey(), 0u) << "a region with only FLUSH_GLOBAL is a remote target";
}

// A file of `pages` pages in the test's temporary directory (a disk file
// system), mapped shared: a durable target whose FLUSH PERSISTENT is an
// msync. Whether a page was written back shows in /proc/self/smaps: msync
// cleans the pages it writes (Shared_Dirty + Private_Dirty drop).
class FileMapping {
 public:
  explicit FileMapping(size_t pages) : length_(pages * 4096) {
    const char* dir = std::getenv("TEST_TMPDIR");
    path_ = std::string(dir ? dir : "/var/tmp") + "/pmem-" + std::to_string(::getpid()) + "-" + std::to_string(n_++);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd_ < 0 || ::ftruncate(fd_, off_t(length_)) != 0) return;
    void* p = ::mmap(nullptr, length_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p != MAP_FAILED) data_ = static_cast<uint8_t*>(p);
  }
  ~FileMapping() {
    if (data_) ::munmap(data_, length_);
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  uint8_t* data() const { return data_; }
  size_t length() const { return length_; }
  // Dirty kB of this mapping (it is one VMA), -1 when not found.
  long dirty_kb() const {
    FILE* f = std::fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    bool in = false, found = false;
    long kb = 0;
    const auto start = reinterpret_cast<uintptr_t>(data_);
    while (std::fgets(line, sizeof line, f)) {
      unsigned long lo, hi;
      if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
        in = lo == start;
        found = found || in;
        continue;
      }
      long v;
      if (in && (std::sscanf(line, "Shared_Dirty: %ld kB", &v) == 1 || std::sscanf(line, "Private_Dirty: %ld kB", &v) == 1)) {
        kb += v;
      }
    }
    std::fclose(f);
    return found ? kb : -1;
  }

 private:
  static inline int n_ = 0;
  std::string path_;
  int fd_ = -1;
  size_t length_;
  uint8_t* data_ = nullptr;
};

// B registers a shared file mapping as persistent memory; `type` kHost
// with FLUSH_PERSISTENT learns it from the mapping just the same.
std::optional<MemoryRegion> register_persistent(ProtectionDomain& pd, const FileMapping& m, MemoryType type) {
  auto mr = pd.register_mr(m.data(), m.length(), kLocalWrite | kRemoteAccess | kFlushGlobal | kFlushPersistent, type);
  EXPECT_TRUE(mr) << mr.error().message();
  if (!mr) return std::nullopt;
  return std::move(*mr);
}

// FLUSH PERSISTENT of a file mapping writes back exactly the pages it
// names (RANGE), or all of them (whole region), before it completes.
TEST_F(Flush, PersistentFlushOfAFileMappingWritesItsPagesBack) {
  FileMapping file(4);
  ASSERT_NE(file.data(), nullptr) << std::strerror(errno);
  for (MemoryType type : {MemoryType::kPersistent, MemoryType::kHost}) {
    SCOPED_TRACE(type == MemoryType::kPersistent ? "UFAB_MEM_PERSISTENT" : "UFAB_MEM_HOST, learned from the mapping");
    auto mr = register_persistent(*b_.pd, file, type);
    ASSERT_TRUE(mr);
    for (size_t i = 0; i < 4 * 4096; ++i) a_.buf[i] = static_cast<uint8_t>(i * 7 + int(type));
    Sge s = a_.mr->sge(0, 4 * 4096);
    const uint64_t base = reinterpret_cast<uintptr_t>(file.data());
    ASSERT_TRUE(a_.qp->post_send(SendWr{.wr_id = 1, .opcode = WrOpcode::kRdmaWrite, .sgl = {&s, 1},
                                        .remote_addr = base, .rkey = mr->rkey()}));
    WorkCompletion wc = run(SendWr{.wr_id = 2, .opcode = WrOpcode::kFlush, .flags = kSendSignaled,
                                   .remote_addr = base + 4096, .rkey = mr->rkey(),
                                   .flush_type = kFlushTypeGlobal, .flush_level = kFlushRange, .flush_length = 4096});
    ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
    EXPECT_EQ(file.dirty_kb(), 16) << "a GLOBAL flush writes nothing back";
    wc = run(SendWr{.wr_id = 3, .opcode = WrOpcode::kFlush, .flags = kSendSignaled, .remote_addr = base + 4096,
                    .rkey = mr->rkey(), .flush_type = kFlushTypePersistent, .flush_level = kFlushRange,
                    .flush_length = 100});
    ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
    EXPECT_EQ(wc.opcode, WcOpcode::kFlush);
    EXPECT_EQ(file.dirty_kb(), 12) << "100 bytes of page 1: that page, and no other, written back";
    wc = run(SendWr{.wr_id = 4, .opcode = WrOpcode::kFlush, .flags = kSendSignaled, .rkey = mr->rkey(),
                    .flush_type = kFlushTypeGlobal | kFlushTypePersistent, .flush_level = kFlushWholeRegion});
    ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
    EXPECT_EQ(file.dirty_kb(), 0) << "the whole region written back";
    EXPECT_EQ(0, std::memcmp(file.data(), a_.buf.data(), 4 * 4096));
  }
}

// UFAB_SEND_COMMIT: the WRITE completes (as RDMA_WRITE, once) only after
// its range is durable at the target; unsignaled, it is silent like any
// WRITE; an error (the target region lacks FLUSH_PERSISTENT) completes it
// once, with the FLUSH's status.
TEST_F(Flush, CommitCompleteWriteCompletesOnceDurable) {
  FileMapping file(4);
  ASSERT_NE(file.data(), nullptr) << std::strerror(errno);
  auto mr = register_persistent(*b_.pd, file, MemoryType::kPersistent);
  ASSERT_TRUE(mr);
  const uint64_t base = reinterpret_cast<uintptr_t>(file.data());
  for (size_t i = 0; i < 8192; ++i) a_.buf[i] = static_cast<uint8_t>(i ^ 0x5A);
  Sge s = a_.mr->sge(0, 8192);
  WorkCompletion wc = run(SendWr{.wr_id = 7, .opcode = WrOpcode::kRdmaWrite, .flags = kSendSignaled | kSendCommit,
                                 .sgl = {&s, 1}, .remote_addr = base + 4096, .rkey = mr->rkey()});
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.opcode, WcOpcode::kRdmaWrite);
  EXPECT_EQ(file.dirty_kb(), 0) << "completed before its pages were written back";
  EXPECT_EQ(0, std::memcmp(file.data() + 4096, a_.buf.data(), 8192));

  // Unsignaled, then signaled with immediate data: one completion, the second's.
  Sge one = a_.mr->sge(0, 64);
  ASSERT_TRUE(a_.qp->post_send(SendWr{.wr_id = 8, .opcode = WrOpcode::kRdmaWrite, .flags = kSendCommit,
                                      .sgl = {&one, 1}, .remote_addr = base, .rkey = mr->rkey()}));
  ASSERT_TRUE(b_.qp->post_recv(RecvWr{.wr_id = 50}));
  wc = run(SendWr{.wr_id = 9, .opcode = WrOpcode::kRdmaWriteWithImm, .flags = kSendSignaled | kSendCommit,
                  .sgl = {&one, 1}, .imm_data = 0x1234, .remote_addr = base + 3 * 4096, .rkey = mr->rkey()});
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  EXPECT_EQ(wc.wr_id, 9u) << "the unsignaled commit WRITE completed visibly";
  EXPECT_EQ(file.dirty_kb(), 0);
  WorkCompletion rwc = next(b_);
  EXPECT_EQ(rwc.wr_id, 50u);
  EXPECT_EQ(rwc.imm_data, 0x1234u);

  // A target region without FLUSH_PERSISTENT: one error completion.
  wc = run(SendWr{.wr_id = 10, .opcode = WrOpcode::kRdmaWrite, .flags = kSendCommit, .sgl = {&one, 1},
                  .remote_addr = b_addr(0), .rkey = b_.mr->rkey()});
  EXPECT_EQ(wc.wr_id, 10u);
  EXPECT_EQ(wc.status, WcStatus::kRemAccessErr) << wc.error;
  EXPECT_EQ(wc.opcode, WcOpcode::kRdmaWrite);
  EXPECT_NE(wc.error.find("FLUSH_PERSISTENT"), std::string::npos) << wc.error;
  EXPECT_EQ(0, std::memcmp(b_.buf.data(), a_.buf.data(), 64)) << "the WRITE itself landed";
  for (int r = 0; r < 100; ++r) {
    a_.dev->progress();
    b_.dev->progress();
  }
  WorkCompletion more[4];
  auto n = a_.cq->poll(more);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 0u) << "a commit WRITE completed twice: " << more[0].wr_id << " " << more[0].error;
}

TEST_F(Flush, CommitCompletePostChecks) {
  Sge one = a_.mr->sge(0, 64);
  auto st = a_.qp->post_send(SendWr{.opcode = WrOpcode::kSend, .flags = kSendCommit, .sgl = {&one, 1}});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), EINVAL);
  EXPECT_NE(st.error().message().find("only RDMA_WRITE"), std::string::npos) << st.error().message();
  st = a_.qp->post_send(SendWr{.opcode = WrOpcode::kRdmaRead, .flags = kSendCommit, .sgl = {&one, 1}});
  ASSERT_FALSE(st);

  // Two send-queue entries: 511 used of 512 leaves no room.
  for (int i = 0; i < 511; ++i) {
    ASSERT_TRUE(a_.qp->post_send(SendWr{.opcode = WrOpcode::kRdmaWrite, .sgl = {&one, 1}, .remote_addr = b_addr(0),
                                        .rkey = b_.mr->rkey()}));
  }
  st = a_.qp->post_send(SendWr{.opcode = WrOpcode::kRdmaWrite, .flags = kSendCommit, .sgl = {&one, 1},
                               .remote_addr = b_addr(0), .rkey = b_.mr->rkey()});
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), ENOMEM);
  EXPECT_NE(st.error().message().find("two entries"), std::string::npos) << st.error().message();
}

// A SEND names no range a FLUSH could make durable: a receive posted into
// persistent memory lands durably before the SEND is acknowledged, so the
// sender's completion means durable too.
TEST_F(Flush, SendIntoPersistentMemoryLandsDurably) {
  FileMapping file(4);
  ASSERT_NE(file.data(), nullptr) << std::strerror(errno);
  auto mr = register_persistent(*b_.pd, file, MemoryType::kPersistent);
  ASSERT_TRUE(mr);
  Sge r = mr->sge(4096, 3 * 4096);
  ASSERT_TRUE(b_.qp->post_recv(RecvWr{.wr_id = 77, .sgl = {&r, 1}}));
  for (size_t i = 0; i < 10000; ++i) a_.buf[i] = static_cast<uint8_t>(i * 13);
  Sge s = a_.mr->sge(0, 10000);
  WorkCompletion wc = run(SendWr{.wr_id = 5, .opcode = WrOpcode::kSend, .flags = kSendSignaled, .sgl = {&s, 1}});
  ASSERT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  EXPECT_EQ(file.dirty_kb(), 0) << "the SEND was acknowledged before its bytes were written back";
  WorkCompletion rwc = next(b_);
  EXPECT_EQ(rwc.wr_id, 77u);
  EXPECT_EQ(rwc.byte_len, 10000u);
  EXPECT_EQ(0, std::memcmp(file.data() + 4096, a_.buf.data(), 10000));
}

// GLOBAL of a range and of the whole region succeed; PERSISTENT (alone or
// with GLOBAL) of host memory finds no region that allows it (remote
// access error), whatever the selectivity.
TEST_F(Flush, EveryPlacementTypeAndSelectivity) {
  const struct {
    uint8_t type, level;
    WcStatus want;
  } cases[] = {
      {kFlushTypeGlobal, kFlushRange, WcStatus::kSuccess},
      {kFlushTypeGlobal, kFlushWholeRegion, WcStatus::kSuccess},
      {kFlushTypePersistent, kFlushRange, WcStatus::kRemAccessErr},
      {kFlushTypePersistent, kFlushWholeRegion, WcStatus::kRemAccessErr},
      {kFlushTypeGlobal | kFlushTypePersistent, kFlushRange, WcStatus::kRemAccessErr},
      {kFlushTypeGlobal | kFlushTypePersistent, kFlushWholeRegion, WcStatus::kRemAccessErr},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("type " + std::to_string(c.type) + " level " + std::to_string(c.level));
    connect(PairSetup{});
    // Data first, then the FLUSH of it: RC executes them in order.
    for (size_t i = 0; i < 64; ++i) a_.buf[i] = static_cast<uint8_t>(i * 3 + c.type);
    Sge s = a_.mr->sge(0, 64);
    ASSERT_TRUE(a_.qp->post_send(SendWr{.wr_id = 1, .opcode = WrOpcode::kRdmaWrite, .sgl = {&s, 1},
                                        .remote_addr = b_addr(4096), .rkey = b_.mr->rkey()}));
    WorkCompletion wc = run(flush(2, c.type, c.level, 4096, 64));
    EXPECT_EQ(wc.wr_id, 2u);
    EXPECT_EQ(wc.status, c.want) << wc_status_name(wc.status) << ": " << wc.error;
    EXPECT_EQ(wc.opcode, WcOpcode::kFlush);
    EXPECT_EQ(0, std::memcmp(a_.buf.data(), b_.buf.data() + 4096, 64)) << "the WRITE before the FLUSH landed";
    if (c.want == WcStatus::kSuccess) {
      EXPECT_EQ(a_.qp->state(), QpState::kRts);
      // The QP goes on: a second FLUSH of another range, then a READ.
      wc = run(flush(3, c.type, c.level, 0, 8));
      EXPECT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
    } else {
      EXPECT_NE(wc.error.find("remote access error"), std::string::npos) << wc.error;
      EXPECT_EQ(a_.qp->state(), QpState::kError);
    }
  }
}

TEST_F(Flush, AtomicWriteStoresEachValueInOnePiece) {
  uint64_t id = 1;
  for (uint64_t value : {0ull, 1ull, 0x8000000000000000ull, 0x0123456789ABCDEFull, ~0ull}) {
    for (size_t off : {size_t{0}, size_t{8}, size_t{4096 - 8}, kBuf - 8}) {
      std::memset(b_.buf.data() + off, 0xA5, 8);
      WorkCompletion wc = run(atomic_write(id, off, value));
      EXPECT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
      EXPECT_EQ(wc.opcode, WcOpcode::kAtomicWrite);
      EXPECT_EQ(wc.wr_id, id);
      EXPECT_EQ(b_load(off), value) << "offset " << off;
      ++id;
    }
  }
  // Unsignaled ones complete silently; a signaled one after them completes.
  for (uint64_t i = 0; i < 10; ++i) {
    SendWr w = atomic_write(100 + i, 64 + 8 * i, i * 11);
    w.flags = 0;
    ASSERT_TRUE(a_.qp->post_send(w));
  }
  WorkCompletion wc = run(atomic_write(200, 256, 42));
  EXPECT_EQ(wc.wr_id, 200u);
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << wc.error;
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(b_load(64 + 8 * i), i * 11);
}

TEST_F(Flush, MisalignedAtomicWriteIsAnInvalidRequestAndStoresNothing) {
  for (size_t off : {size_t{1}, size_t{4}, size_t{7}, size_t{4093}}) {
    SCOPED_TRACE("offset " + std::to_string(off));
    connect(PairSetup{});
    std::memset(b_.buf.data(), 0x5A, 8192);
    WorkCompletion wc = run(atomic_write(9, off, 0x1122334455667788ull));
    EXPECT_EQ(wc.status, WcStatus::kRemInvReqErr) << wc_status_name(wc.status) << ": " << wc.error;
    EXPECT_NE(wc.error.find("not 8-byte aligned"), std::string::npos) << wc.error;
    for (size_t i = 0; i < 8192; ++i) ASSERT_EQ(b_.buf[i], 0x5A) << "byte " << i << " changed";
    EXPECT_EQ(a_.qp->state(), QpState::kError);
  }
}

// The exact completion status of each right missing: on the responder's
// QP, invalid request; on its region, remote access error.
TEST_F(Flush, EveryAccessViolationHasItsStatus) {
  struct Case {
    std::string what;
    AccessFlags qp_b, mr_b;
    bool atomic_write;
    uint8_t type;
    WcStatus want;
  };
  const std::vector<Case> cases = {
      {"FLUSH GLOBAL, responder QP without FLUSH_GLOBAL", kRemoteAccess, kMrFlush, false, kFlushTypeGlobal,
       WcStatus::kRemInvReqErr},
      {"FLUSH PERSISTENT, responder QP with FLUSH_GLOBAL only", kRemoteAccess | kFlushGlobal, kMrFlush, false,
       kFlushTypePersistent, WcStatus::kRemInvReqErr},
      {"FLUSH GLOBAL, region without FLUSH_GLOBAL", kQpFlush, kLocalWrite | kRemoteAccess, false, kFlushTypeGlobal,
       WcStatus::kRemAccessErr},
      {"FLUSH PERSISTENT, region without FLUSH_PERSISTENT", kQpFlush, kMrFlush, false, kFlushTypePersistent,
       WcStatus::kRemAccessErr},
      {"ATOMIC_WRITE, responder QP without REMOTE_WRITE", kRemoteRead | kRemoteAtomic | kFlushGlobal, kMrFlush, true, 0,
       WcStatus::kRemInvReqErr},
      {"ATOMIC_WRITE, region without REMOTE_WRITE", kQpFlush, kLocalWrite | kRemoteRead | kRemoteAtomic | kFlushGlobal,
       true, 0, WcStatus::kRemAccessErr},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    connect(PairSetup{.qp_access_b = c.qp_b, .mr_access_b = c.mr_b});
    std::memset(b_.buf.data(), 0x3C, 4096);
    WorkCompletion wc = run(c.atomic_write ? atomic_write(5, 64, 0xFEEDull) : flush(5, c.type, kFlushRange, 0, 4096));
    EXPECT_EQ(wc.wr_id, 5u);
    EXPECT_EQ(wc.status, c.want) << wc_status_name(wc.status) << ": " << wc.error;
    EXPECT_FALSE(wc.error.empty());
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(b_.buf[i], 0x3C) << "byte " << i << " changed";
    EXPECT_EQ(a_.qp->state(), QpState::kError);
    // Work behind the failed one is flushed.
    auto st = a_.qp->post_send(atomic_write(6, 64, 1));
    ASSERT_TRUE(st) << st.error().message();
    wc = next(a_);
    EXPECT_EQ(wc.wr_id, 6u);
    EXPECT_EQ(wc.status, WcStatus::kWrFlushErr);
  }
}

TEST_F(Flush, PostTimeChecksSayWhatIsWrong) {
  Sge s = a_.mr->sge(0, 8);
  const struct {
    SendWr wr;
    const char* words;
  } cases[] = {
      {SendWr{.opcode = WrOpcode::kFlush, .sgl = {&s, 1}, .flush_type = kFlushTypeGlobal}, "FLUSH takes no SGEs"},
      {SendWr{.opcode = WrOpcode::kAtomicWrite, .sgl = {&s, 1}}, "ATOMIC_WRITE takes no SGEs"},
      {SendWr{.opcode = WrOpcode::kFlush, .flush_type = 0}, "flush_type 0 is not"},
      {SendWr{.opcode = WrOpcode::kFlush, .flush_type = 4}, "flush_type 4 is not"},
      {SendWr{.opcode = WrOpcode::kFlush, .flush_type = kFlushTypeGlobal, .flush_level = 2}, "flush_level 2 is not"},
      {SendWr{.opcode = WrOpcode::kFlush, .flush_type = kFlushTypeGlobal, .flush_length = (1ull << 31) + 1},
       "at most 2 GiB"},
  };
  for (const auto& c : cases) {
    auto st = a_.qp->post_send(c.wr);
    ASSERT_FALSE(st) << c.words;
    EXPECT_EQ(st.error().code(), EINVAL);
    EXPECT_NE(st.error().message().find(c.words), std::string::npos) << st.error().message();
  }
  // A whole-region FLUSH ignores flush_length.
  WorkCompletion wc = run(flush(1, kFlushTypeGlobal, kFlushWholeRegion, 0, ~0ull));
  EXPECT_EQ(wc.status, WcStatus::kSuccess) << wc.error;

  // RC only.
  auto ud = a_.pd->create_qp({.type = QpType::kUd, .send_cq = a_.cq.get(), .recv_cq = a_.cq.get()});
  ASSERT_TRUE(ud) << ud.error().message();
  QpAttr t;
  t.qkey = 0x11111111;
  ASSERT_TRUE((*ud)->connect(ConnectionData{}, t));
  for (WrOpcode op : {WrOpcode::kFlush, WrOpcode::kAtomicWrite}) {
    auto st = (*ud)->post_send(SendWr{.opcode = op, .flush_type = kFlushTypeGlobal, .ud = {.ip = 0x0A000002, .qpn = 1}});
    ASSERT_FALSE(st);
    EXPECT_NE(st.error().message().find("needs an RC QP"), std::string::npos) << st.error().message();
  }
}

// FLUSH and ATOMIC_WRITE count against max_rd_atomic with READs: a
// requester allowed one at a time talks to a responder that takes one at
// a time (more would be NAKed invalid request), and everything completes,
// in order. A fenced WRITE waits for them.
TEST_F(Flush, OneResourceAtATimeWithReadsInBetween) {
  PairSetup s;
  s.tuning.max_rd_atomic = 1;
  s.tuning.max_dest_rd_atomic = 1;
  connect(s);
  std::vector<SendWr> wrs;
  std::vector<Sge> sges(64);
  for (uint64_t i = 0; i < 64; ++i) {
    switch (i % 4) {
      case 0: wrs.push_back(flush(i, kFlushTypeGlobal, i % 8 == 0 ? kFlushRange : kFlushWholeRegion, 0, 512)); break;
      case 1: wrs.push_back(atomic_write(i, 8 * i, i * 1000)); break;
      case 2:
        sges[i] = a_.mr->sge(4096 + 8 * i, 8);
        wrs.push_back(SendWr{.wr_id = i, .opcode = WrOpcode::kRdmaRead, .flags = kSendSignaled, .sgl = {&sges[i], 1},
                             .remote_addr = b_addr(8 * (i - 1)), .rkey = b_.mr->rkey()});
        break;
      default:
        sges[i] = a_.mr->sge(8192, 8);
        wrs.push_back(SendWr{.wr_id = i, .opcode = WrOpcode::kRdmaWrite, .flags = kSendSignaled | kSendFence,
                             .sgl = {&sges[i], 1}, .remote_addr = b_addr(65536 + 8 * i), .rkey = b_.mr->rkey()});
    }
  }
  ASSERT_TRUE(a_.qp->post_send(std::span<const SendWr>(wrs)));
  for (uint64_t i = 0; i < 64; ++i) {
    WorkCompletion wc = next(a_);
    ASSERT_EQ(wc.wr_id, i);
    ASSERT_EQ(wc.status, WcStatus::kSuccess) << i << ": " << wc.error;
    if (i % 4 == 2) {
      uint64_t v;
      std::memcpy(&v, a_.buf.data() + 4096 + 8 * i, 8);
      EXPECT_EQ(v, (i - 1) * 1000) << "the READ sees the ATOMIC_WRITE before it";
    }
  }
  EXPECT_EQ(b_.dev->stats().naks_sent, 0u) << "the requester never exceeded the responder's resources";
}

// 10^4 WRITEs, FLUSHes and ATOMIC_WRITEs interleaved, over a link that
// loses 5% and reorders 5% of the frames each way. Each WRITE and
// ATOMIC_WRITE puts its own value into its own 8-byte slot; the responder's
// side watches the slots between progress rounds, and the moment a value
// appears it replaces it with a tombstone: a value that appears twice was
// written twice. At the end every slot holds its tombstone (written once),
// and every work request completed successfully, once, in order.
TEST_F(Flush, MixedRunUnderLossAndReorderExecutesEachOperationOnce) {
  PairSetup s;
  s.params_a = {{"loss", "0.05"}, {"reorder", "0.05"}, {"seed", "11"}};
  s.params_b = {{"loss", "0.05"}, {"reorder", "0.05"}, {"seed", "12"}};
  s.tuning.timeout = 8;  // about 1 ms: losses are recovered quickly
  connect(s);
  constexpr uint64_t kOps = 10000, kInFlight = 128;
  constexpr uint64_t kTomb = 0xDEADDEADDEADDEADull;
  const uint64_t base = 8 * 1024;  // slots from here in B's buffer, 8 bytes per operation
  ASSERT_LE(base + 8 * kOps, kBuf);
  std::vector<uint8_t> seen(kOps, 0);  // 0: not yet, 1: seen once
  uint64_t posted = 0, completed = 0, watch_from = 0;
  uint64_t flushes = 0, writes = 0, atomic_writes = 0;
  auto value_of = [](uint64_t i) { return 0x5100000000000000ull | (i + 1); };
  auto watch = [&] {
    const uint64_t hi = posted;
    for (uint64_t i = watch_from; i < hi; ++i) {
      uint64_t v;
      std::memcpy(&v, b_.buf.data() + base + 8 * i, 8);
      if (v == 0 || v == kTomb) continue;
      ASSERT_EQ(v, value_of(i)) << "slot " << i << " holds another operation's value";
      ASSERT_EQ(seen[i], 0) << "operation " << i << " wrote its slot twice";
      seen[i] = 1;
      std::memcpy(b_.buf.data() + base + 8 * i, &kTomb, 8);
    }
    while (watch_from < hi && (seen[watch_from] || watch_from % 3 == 2)) ++watch_from;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  WorkCompletion wc[32];
  while (completed < kOps && std::chrono::steady_clock::now() < deadline) {
    while (posted < kOps && posted - completed < kInFlight) {
      const uint64_t i = posted;
      SendWr w;
      // A WRITE's source: its value in a slot of A's buffer that stays
      // untouched until it completes (4096 slots, at most kInFlight in use).
      Sge sge = a_.mr->sge((i % 4096) * 8, 8);
      switch (i % 3) {
        case 0: {
          const uint64_t v = value_of(i);
          std::memcpy(a_.buf.data() + (i % 4096) * 8, &v, 8);
          w = SendWr{.wr_id = i, .opcode = WrOpcode::kRdmaWrite, .flags = kSendSignaled, .sgl = {&sge, 1},
                     .remote_addr = b_addr(base + 8 * i), .rkey = b_.mr->rkey()};
          break;
        }
        case 1: w = atomic_write(i, base + 8 * i, value_of(i)); break;
        default:
          // The two slots before it, or every 16th time the whole region.
          w = i % 16 == 2 ? flush(i, kFlushTypeGlobal, kFlushWholeRegion)
                          : flush(i, kFlushTypeGlobal, kFlushRange, base + 8 * (i - 2), 16);
      }
      auto st = a_.qp->post_send(w);
      ASSERT_TRUE(st) << st.error().message();
      ++posted;
    }
    a_.dev->progress();
    b_.dev->progress();
    ASSERT_NO_FATAL_FAILURE(watch());
    auto n = a_.cq->poll(wc);
    ASSERT_TRUE(n) << n.error().message();
    for (size_t k = 0; k < *n; ++k) {
      ASSERT_EQ(wc[k].status, WcStatus::kSuccess) << "operation " << wc[k].wr_id << ": " << wc[k].error;
      ASSERT_EQ(wc[k].wr_id, completed) << "completions out of order, lost or doubled";
      const WcOpcode want = completed % 3 == 0 ? WcOpcode::kRdmaWrite
                            : completed % 3 == 1 ? WcOpcode::kAtomicWrite
                                                 : WcOpcode::kFlush;
      ASSERT_EQ(wc[k].opcode, want) << completed;
      if (want == WcOpcode::kFlush) {
        // Completed FLUSH: what it covered is there (the watcher may have
        // put its tombstone already).
        for (uint64_t j : {completed - 2, completed - 1}) {
          uint64_t v;
          std::memcpy(&v, b_.buf.data() + base + 8 * j, 8);
          ASSERT_TRUE(v == value_of(j) || v == kTomb) << "slot " << j << " not written when the FLUSH after it completed";
        }
        ++flushes;
      } else {
        (want == WcOpcode::kRdmaWrite ? writes : atomic_writes)++;
      }
      ++completed;
    }
  }
  // Let any late duplicate arrive: a few more rounds, still watching.
  for (int r = 0; r < 200; ++r) {
    a_.dev->progress();
    b_.dev->progress();
    ASSERT_NO_FATAL_FAILURE(watch());
  }
  ASSERT_EQ(completed, kOps) << "timed out";
  for (uint64_t i = 0; i < kOps; ++i) {
    if (i % 3 == 2) continue;  // FLUSH: no slot
    ASSERT_EQ(seen[i], 1) << "operation " << i << " never wrote its slot";
    ASSERT_EQ(b_load(base + 8 * i), kTomb) << "operation " << i << " wrote its slot again after the first time";
  }
  auto n = a_.cq->poll(wc);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 0u) << "a completion after the last one";
  EXPECT_EQ(flushes + writes + atomic_writes, kOps);
  DeviceStats sa = a_.dev->stats(), sb = b_.dev->stats();
  EXPECT_GT(sa.retransmits, 0u) << "the faults were not exercised";
  EXPECT_GT(sb.duplicates, 0u) << "no request was seen twice: the replay path was not exercised";
  std::printf("retransmits %llu timeouts %llu, responder duplicates %llu, sent per needed %.3f\n",
              (unsigned long long)sa.retransmits, (unsigned long long)sa.timeouts,
              (unsigned long long)sb.duplicates, ufab_sent_per_needed(&sa));
}

}  // namespace
}  // namespace ufab::rdma
