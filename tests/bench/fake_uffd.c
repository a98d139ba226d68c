/* For counting instructions only (tests/bench/regcache_insn.sh): valgrind
 * does not know userfaultfd (system call 323), so under it the registration
 * cache would cache no host memory. Preloaded, this stands in for it: the
 * userfaultfd is an eventfd that never becomes readable, and its two
 * ioctls (UFFDIO_API, UFFDIO_REGISTER) succeed. It never reports an
 * unmapping: never use it where memory is really unmapped under the cache. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <linux/userfaultfd.h>
#include <stdarg.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>

long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; ++i) a[i] = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_userfaultfd) return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  static long (*real)(long, ...) = 0;
  if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

int ioctl(int fd, unsigned long request, ...) {
  va_list ap;
  va_start(ap, request);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  if (request == UFFDIO_API || request == UFFDIO_REGISTER) return 0;
  static int (*real)(int, unsigned long, ...) = 0;
  if (!real) real = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
  return real(fd, request, arg);
}
