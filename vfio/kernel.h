// The syscall seam of the VFIO layer. Every open, close, ioctl, mmap, munmap,
// pread, pwrite and eventfd that vfio/ makes goes through a Kernel, so unit
// tests can hand in a fake that emulates /dev/vfio without an IOMMU, and the
// paths of sysfs, /dev and /proc are configurable for the same reason.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <utility>

namespace ufab::vfio {

// Calls follow the libc convention: -1 (or MAP_FAILED) with errno set.
class Kernel {
 public:
  virtual ~Kernel() = default;

  virtual int open(const char* path, int flags) = 0;
  virtual int close(int fd) = 0;
  // For VFIO ioctls that take a pointer to an argsz-prefixed struct, a string
  // or an int.
  virtual int ioctl(int fd, unsigned long request, void* arg) = 0;
  // For VFIO ioctls that take a plain integer (CHECK_EXTENSION, SET_IOMMU) or
  // nothing (GET_API_VERSION, DEVICE_RESET: pass 0).
  virtual int ioctl_value(int fd, unsigned long request, unsigned long value) = 0;
  virtual void* mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) = 0;
  virtual int munmap(void* addr, size_t length) = 0;
  virtual ssize_t pread(int fd, void* buf, size_t count, off_t offset) = 0;
  virtual ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) = 0;
  virtual int eventfd(unsigned initial_value, int flags) = 0;
  virtual int getrlimit(int resource, struct rlimit* limit) = 0;
  // Whether the calling thread has CAP_IPC_LOCK in its effective set; the
  // type1 IOMMU driver skips the RLIMIT_MEMLOCK check for such callers.
  virtual bool has_cap_ipc_lock() = 0;

  // The process-wide instance that makes the real system calls.
  static Kernel& real();
};

// Where the VFIO layer finds the kernel's interfaces. Tests point the roots at
// a fake tree in a temporary directory.
struct Environment {
  Kernel* kernel = &Kernel::real();
  std::string sysfs_root = "/sys";
  std::string dev_root = "/dev";
  std::string proc_root = "/proc";
};

// Owns a file descriptor and closes it through the Kernel that opened it, so
// a fake kernel sees every close. Movable, not copyable.
class KernelFd {
 public:
  KernelFd() = default;
  KernelFd(Kernel& kernel, int fd) : kernel_(&kernel), fd_(fd) {}
  KernelFd(KernelFd&& other) noexcept
      : kernel_(other.kernel_), fd_(std::exchange(other.fd_, -1)) {}
  KernelFd& operator=(KernelFd&& other) noexcept {
    if (this != &other) {
      reset();
      kernel_ = other.kernel_;
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  KernelFd(const KernelFd&) = delete;
  KernelFd& operator=(const KernelFd&) = delete;
  ~KernelFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  Kernel* kernel() const { return kernel_; }
  void reset() {
    if (fd_ >= 0 && kernel_ != nullptr) kernel_->close(fd_);
    fd_ = -1;
  }

 private:
  Kernel* kernel_ = nullptr;
  int fd_ = -1;
};

}  // namespace ufab::vfio
