// core/rdma/durable.h: which mappings can be made durable, and how; what
// the errors say about the others. (A device-DAX namespace exists only in
// the VM test bed, on its emulated NVDIMM.)
#include "core/rdma/durable.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

namespace ufab::verbs {
namespace {

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// A file of `length` bytes in `dir`, mapped shared; unmapped and removed
// at the end.
struct Mapped {
  Mapped(const std::string& dir, size_t length, int flags = MAP_SHARED) : length(length) {
    path = dir + "/durable-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::ftruncate(fd, off_t(length)) != 0) return;
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p != MAP_FAILED) data = static_cast<uint8_t*>(p);
  }
  ~Mapped() {
    if (data) ::munmap(data, length);
    if (fd >= 0) ::close(fd);
    ::unlink(path.c_str());
  }
  static inline int serial = 0;
  std::string path;
  int fd = -1;
  size_t length;
  uint8_t* data = nullptr;
};

std::string disk_dir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d ? d : "/var/tmp";
}

TEST(Durable, AFileOnADiskIsSyncedWithMsync) {
  Mapped m(disk_dir(), 3 * 4096);
  ASSERT_NE(m.data, nullptr) << std::strerror(errno);
  struct statfs fs {};
  ASSERT_EQ(::statfs(m.path.c_str(), &fs), 0);
  if (fs.f_type == 0x794c7630 || fs.f_type == 0x01021994) {
    GTEST_SKIP() << disk_dir() << " is on overlayfs or tmpfs here, not a disk file system: run with TEST_TMPDIR on one";
  }
  auto k = classify_mapping(m.data + 100, 2 * 4096);
  ASSERT_TRUE(k) << k.error().message();
  EXPECT_EQ(k->kind, Durability::kFileSync);
  EXPECT_TRUE(contains(k->what, m.path.c_str())) << k->what;
  std::memset(m.data, 0x3C, m.length);
  ASSERT_TRUE(make_durable(Durability::kFileSync, m.data + 5000, 10));  // an unaligned range: its page
  char back[16] = {};
  ASSERT_EQ(::pread(m.fd, back, sizeof back, 5000), ssize_t(sizeof back));
  EXPECT_EQ(back[0], 0x3C);
}

TEST(Durable, PrivateAndAnonymousMemoryAreRefusedSayingWhatToMap) {
  std::string buf(8192, 'x');
  auto k = classify_mapping(buf.data(), buf.size());
  ASSERT_FALSE(k);
  EXPECT_EQ(k.error().code(), EINVAL);
  EXPECT_TRUE(contains(k.error().message(), "private mapping")) << k.error().message();
  EXPECT_TRUE(contains(k.error().message(), "MAP_SHARED")) << k.error().message();

  void* shared = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  k = classify_mapping(shared, 8192);
  ASSERT_FALSE(k);
  EXPECT_TRUE(contains(k.error().message(), "without a durable backing")) << k.error().message();
  ::munmap(shared, 8192);

  Mapped priv(disk_dir(), 4096, MAP_PRIVATE);
  ASSERT_NE(priv.data, nullptr);
  k = classify_mapping(priv.data, 4096);
  ASSERT_FALSE(k);
  EXPECT_TRUE(contains(k.error().message(), "private mapping")) << k.error().message();
  EXPECT_TRUE(contains(k.error().message(), priv.path.c_str())) << "names the file: " << k.error().message();
}

TEST(Durable, FilesOnMemoryFileSystemsAreRefused) {
  Mapped m("/dev/shm", 4096);
  ASSERT_NE(m.data, nullptr) << "/dev/shm: " << std::strerror(errno);
  auto k = classify_mapping(m.data, 4096);
  ASSERT_FALSE(k);
  EXPECT_TRUE(contains(k.error().message(), "memory file system")) << k.error().message();
}

TEST(Durable, RangesMustBeMappedInFullAndOfOneKind) {
  // A file mapping followed by an anonymous one: the second is refused.
  Mapped m(disk_dir(), 4 * 4096);
  ASSERT_NE(m.data, nullptr);
  ASSERT_EQ(::munmap(m.data + 3 * 4096, 4096), 0);  // a hole after three pages
  auto k = classify_mapping(m.data, 4 * 4096);
  ASSERT_FALSE(k);
  EXPECT_EQ(k.error().code(), EFAULT);
  EXPECT_TRUE(contains(k.error().message(), "not mapped in full")) << k.error().message();
  void* anon = ::mmap(m.data + 3 * 4096, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_NE(anon, MAP_FAILED);
  k = classify_mapping(m.data, 4 * 4096);
  ASSERT_FALSE(k);
  EXPECT_TRUE(contains(k.error().message(), "private mapping")) << k.error().message();
  EXPECT_FALSE(classify_mapping(nullptr, 10));
  EXPECT_FALSE(classify_mapping(m.data, 0));
}

// Cache-line write-back runs on any memory (it is what a DAX mapping
// gets); the instruction is the best this CPU has.
TEST(Durable, CacheLineWriteBackUsesTheBestInstruction) {
  const std::string insn = cache_writeback_instruction();
  EXPECT_TRUE(insn == "clwb" || insn == "clflushopt" || insn == "clflush") << insn;
  std::string buf(1000, 'a');
  ASSERT_TRUE(make_durable(Durability::kCacheFlush, buf.data() + 3, 997));
  ASSERT_TRUE(make_durable(Durability::kNone, buf.data(), 1));
  EXPECT_EQ(buf[500], 'a');
  EXPECT_STREQ(durability_name(Durability::kCacheFlush), "cache-flush");
  EXPECT_STREQ(durability_name(Durability::kFileSync), "file-sync");
}

}  // namespace
}  // namespace ufab::verbs
