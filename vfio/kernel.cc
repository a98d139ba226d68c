#include "vfio/kernel.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace ufab::vfio {
namespace {

class RealKernel final : public Kernel {
 public:
  int open(const char* path, int flags) override { return ::open(path, flags | O_CLOEXEC); }
  int close(int fd) override { return ::close(fd); }
  int ioctl(int fd, unsigned long request, void* arg) override {
    int rc;
    do rc = ::ioctl(fd, request, arg);
    while (rc < 0 && errno == EINTR);
    return rc;
  }
  int ioctl_value(int fd, unsigned long request, unsigned long value) override {
    int rc;
    do rc = ::ioctl(fd, request, value);
    while (rc < 0 && errno == EINTR);
    return rc;
  }
  void* mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) override {
    return ::mmap(addr, length, prot, flags, fd, offset);
  }
  int munmap(void* addr, size_t length) override { return ::munmap(addr, length); }
  ssize_t pread(int fd, void* buf, size_t count, off_t offset) override {
    ssize_t n;
    do n = ::pread(fd, buf, count, offset);
    while (n < 0 && errno == EINTR);
    return n;
  }
  ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) override {
    ssize_t n;
    do n = ::pwrite(fd, buf, count, offset);
    while (n < 0 && errno == EINTR);
    return n;
  }
  int eventfd(unsigned initial_value, int flags) override {
    return ::eventfd(initial_value, flags | EFD_CLOEXEC);
  }
  int getrlimit(int resource, struct rlimit* limit) override {
    return ::getrlimit(static_cast<__rlimit_resource>(resource), limit);
  }
  bool has_cap_ipc_lock() override {
    // glibc has no capget wrapper without libcap; the raw syscall with the
    // version 3 header fills two 32-bit words per set.
    __user_cap_header_struct header{};
    header.version = _LINUX_CAPABILITY_VERSION_3;
    header.pid = 0;
    __user_cap_data_struct data[2]{};
    if (::syscall(SYS_capget, &header, data) != 0) return false;
    return (data[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32))) != 0;
  }
};

}  // namespace

Kernel& Kernel::real() {
  static RealKernel instance;
  return instance;
}

}  // namespace ufab::vfio
