#include "vfio/kernel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/unit/vfio/fake_kernel.h"

namespace ufab::vfio {
namespace {

bool fd_is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(KernelFd, ClosesThroughItsKernelExactlyOnce) {
  testing::FakeSysfs sysfs;
  testing::FakeKernel fake(sysfs.dev());
  int raw = fake.eventfd(0, 0);
  ASSERT_GE(raw, 0);
  {
    KernelFd a(fake, raw);
    EXPECT_EQ(fake.open_fds(), 1u);
    KernelFd b(std::move(a));
    EXPECT_FALSE(a.valid());
    EXPECT_EQ(b.get(), raw);
    KernelFd c;
    c = std::move(b);
    EXPECT_EQ(fake.open_fds(), 1u);
  }
  EXPECT_EQ(fake.open_fds(), 0u);
  EXPECT_EQ(fake.foreign_closes, 0);
  EXPECT_FALSE(fd_is_open(raw));
}

TEST(RealKernel, EventfdIsCloseOnExecAndWorks) {
  Kernel& k = Kernel::real();
  KernelFd fd(k, k.eventfd(0, EFD_NONBLOCK));
  ASSERT_TRUE(fd.valid());
  EXPECT_TRUE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC);
  uint64_t one = 1, got = 0;
  ASSERT_EQ(::write(fd.get(), &one, sizeof one), 8);
  ASSERT_EQ(::read(fd.get(), &got, sizeof got), 8);
  EXPECT_EQ(got, 1u);
  int raw = fd.get();
  fd.reset();
  EXPECT_FALSE(fd_is_open(raw));
}

TEST(RealKernel, OpenOfAMissingVfioNodeSetsErrno) {
  Kernel& k = Kernel::real();
  EXPECT_EQ(k.open("/nonexistent/vfio/vfio", O_RDWR), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST(RealKernel, MmapAndPreadPassThrough) {
  Kernel& k = Kernel::real();
  void* p = k.mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  static_cast<char*>(p)[0] = 'x';
  EXPECT_EQ(k.munmap(p, 4096), 0);
  int fd = k.open("/proc/self/stat", O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[4];
  EXPECT_GT(k.pread(fd, buf, sizeof buf, 0), 0);
  EXPECT_EQ(k.close(fd), 0);
  rlimit limit{};
  EXPECT_EQ(k.getrlimit(RLIMIT_MEMLOCK, &limit), 0);
}

TEST(RealKernel, CapIpcLockMatchesTheProcessCredentials) {
  // Compare with /proc/self/status CapEff (bit 14), read independently.
  FILE* f = std::fopen("/proc/self/status", "r");
  ASSERT_NE(f, nullptr);
  char line[256];
  unsigned long long eff = 0;
  bool found = false;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "CapEff: %llx", &eff) == 1) found = true;
  std::fclose(f);
  ASSERT_TRUE(found);
  EXPECT_EQ(Kernel::real().has_cap_ipc_lock(), ((eff >> 14) & 1) != 0);
}

}  // namespace
}  // namespace ufab::vfio
