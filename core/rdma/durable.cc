#include "core/rdma/durable.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "base/hex.h"

namespace ufab::verbs {
namespace {

// statfs(2) magic numbers (linux/magic.h) of file systems whose pages live
// in memory only, or may.
constexpr long kTmpfsMagic = 0x01021994;
constexpr long kRamfsMagic = 0x858458f6;
constexpr long kHugetlbfsMagic = 0x958458f6;
constexpr long kOverlayfsMagic = 0x794c7630;

struct Vma {
  uint64_t start = 0, end = 0;
  std::string perms;
  std::string path;
  std::string vm_flags;  // smaps' "VmFlags:" two-letter codes
};

bool is_header(const std::string& line) {
  // "7f0000000000-7f0000001000 rw-s 00000000 08:01 1234   /path"
  size_t dash = line.find('-');
  size_t space = line.find(' ');
  if (dash == std::string::npos || space == std::string::npos || dash > space || dash == 0) return false;
  for (size_t i = 0; i < space; ++i) {
    if (i != dash && !std::isxdigit(static_cast<unsigned char>(line[i]))) return false;
  }
  return true;
}

Result<std::vector<Vma>> read_smaps() {
  std::ifstream in("/proc/self/smaps");
  if (!in) return fail(errno ? errno : EIO, "reading /proc/self/smaps (is /proc mounted?)");
  std::vector<Vma> out;
  std::string line;
  while (std::getline(in, line)) {
    if (is_header(line)) {
      Vma v;
      std::istringstream s(line);
      std::string range, offset, dev, inode;
      s >> range >> v.perms >> offset >> dev >> inode;
      std::getline(s >> std::ws, v.path);
      v.start = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
      v.end = std::stoull(range.substr(range.find('-') + 1), nullptr, 16);
      out.push_back(std::move(v));
    } else if (!out.empty() && line.rfind("VmFlags:", 0) == 0) {
      out.back().vm_flags = " " + line.substr(8) + " ";
    }
  }
  return out;
}

std::string range_text(uint64_t start, uint64_t end) { return "[" + hex(start) + ", " + hex(end) + ")"; }

// One mapping's kind, or why it cannot be durable.
Result<MappingDurability> classify_vma(const Vma& v) {
  const std::string where = range_text(v.start, v.end) + (v.path.empty() ? "" : " (" + v.path + ")");
  const char* fix = "; map a file on a disk, a block device or a device-DAX namespace (/dev/daxN.M) with MAP_SHARED";
  if (v.perms.size() < 4 || v.perms[3] != 's') {
    return fail(EINVAL, where + " is a private mapping: its pages are this process's own copy, which no flush "
                               "writes anywhere durable" + fix);
  }
  if (v.path.empty() || v.path[0] != '/' || v.path.ends_with(" (deleted)")) {
    return fail(EINVAL, where + " is shared memory without a durable backing (anonymous, SysV or deleted)" + fix);
  }
  struct stat st {};
  if (::stat(v.path.c_str(), &st) != 0) {
    return fail(errno, where + ": cannot stat the mapped file to learn what backs it");
  }
  if (S_ISCHR(st.st_mode)) {
    // /sys/dev/char/MAJ:MIN/subsystem -> .../class/dax (or bus/dax).
    char link[256] = {};
    std::string sys = "/sys/dev/char/" + std::to_string(major(st.st_rdev)) + ":" + std::to_string(minor(st.st_rdev)) +
                      "/subsystem";
    ssize_t n = ::readlink(sys.c_str(), link, sizeof link - 1);
    if (n > 0 && std::string(link, size_t(n)).ends_with("/dax")) {
      return MappingDurability{Durability::kCacheFlush, v.path + " (device DAX)"};
    }
    return fail(EINVAL, where + " is a character device that is not a device-DAX namespace" + fix);
  }
  if (S_ISBLK(st.st_mode)) return MappingDurability{Durability::kFileSync, v.path + " (block device, msync)"};
  if (!S_ISREG(st.st_mode)) return fail(EINVAL, where + " is not a regular file or device" + fix);
  // MAP_SYNC (VmFlags "sf") is only granted on a DAX file system: stores
  // reach persistent memory once their cache lines are written back.
  if (v.vm_flags.find(" sf ") != std::string::npos) {
    return MappingDurability{Durability::kCacheFlush, v.path + " (DAX file, MAP_SYNC)"};
  }
  struct statfs fs {};
  if (::statfs(v.path.c_str(), &fs) != 0) return fail(errno, where + ": statfs of the mapped file failed");
  switch (fs.f_type) {
    case kTmpfsMagic:
    case kRamfsMagic:
    case kHugetlbfsMagic:
      return fail(EINVAL, where + " is a file on a memory file system (tmpfs, ramfs or hugetlbfs): it is lost at "
                                 "power off whatever is flushed" + fix);
    case kOverlayfsMagic:
      return fail(EINVAL, where + " is a file on overlayfs, whose upper layer may be memory (a container's or a VM "
                                 "overlay): map the file from the underlying file system instead" + fix);
    default: break;
  }
  return MappingDurability{Durability::kFileSync, v.path + " (file, msync)"};
}

enum class Writeback : uint8_t { kClwb, kClflushopt, kClflush };

Writeback detect_writeback() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  if (a >= 7) {
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (b & (1u << 24)) return Writeback::kClwb;        // CPUID.(EAX=7,ECX=0):EBX[24]
    if (b & (1u << 23)) return Writeback::kClflushopt;  // CPUID.(EAX=7,ECX=0):EBX[23]
  }
#endif
  return Writeback::kClflush;
}

Writeback writeback() {
  static const Writeback w = detect_writeback();
  return w;
}

void write_back_lines(const void* addr, uint64_t length) {
#if defined(__x86_64__)
  constexpr uintptr_t kLine = 64;  // every x86-64 CPU's cache line
  uintptr_t p = reinterpret_cast<uintptr_t>(addr) & ~(kLine - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(addr) + length;
  switch (writeback()) {
    case Writeback::kClwb:
      for (; p < end; p += kLine) __asm__ volatile("clwb %0" : "+m"(*reinterpret_cast<volatile char*>(p)));
      break;
    case Writeback::kClflushopt:
      for (; p < end; p += kLine) __asm__ volatile("clflushopt %0" : "+m"(*reinterpret_cast<volatile char*>(p)));
      break;
    case Writeback::kClflush:
      for (; p < end; p += kLine) __asm__ volatile("clflush %0" : "+m"(*reinterpret_cast<volatile char*>(p)));
      break;
  }
  // The write-backs are weakly ordered (CLWB, CLFLUSHOPT): the fence waits
  // until they are done before anything later (the answer) is stored.
  __asm__ volatile("sfence" ::: "memory");
#else
  (void)addr;
  (void)length;
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

}  // namespace

const char* durability_name(Durability d) {
  switch (d) {
    case Durability::kNone: return "none";
    case Durability::kCacheFlush: return "cache-flush";
    case Durability::kFileSync: return "file-sync";
  }
  return "?";
}

const char* cache_writeback_instruction() {
  switch (writeback()) {
    case Writeback::kClwb: return "clwb";
    case Writeback::kClflushopt: return "clflushopt";
    case Writeback::kClflush: return "clflush";
  }
  return "?";
}

Result<MappingDurability> classify_mapping(const void* addr, uint64_t length) {
  const uint64_t start = reinterpret_cast<uintptr_t>(addr);
  if (addr == nullptr || length == 0 || start + length < start) {
    return fail(EINVAL, "classifying memory " + hex(start) + " +" + std::to_string(length) + ": not a valid range");
  }
  const uint64_t end = start + length;
  auto vmas = read_smaps();
  if (!vmas) return std::unexpected(vmas.error());
  std::optional<MappingDurability> kind;
  uint64_t covered = start;  // every byte below this is mapped and classified
  for (const Vma& v : *vmas) {
    if (v.end <= covered || v.start >= end) continue;
    if (v.start > covered) break;
    auto k = classify_vma(v);
    if (!k) return std::unexpected(k.error());
    if (kind && kind->kind != k->kind) {
      return fail(EINVAL, "memory " + range_text(start, end) + " spans mappings made durable in different ways (" +
                              kind->what + " and " + k->what + "): register each mapping as its own region");
    }
    if (!kind) kind = std::move(*k);
    covered = v.end;
    if (covered >= end) break;
  }
  if (!kind || covered < end) {
    return fail(EFAULT, "memory " + range_text(start, end) + " is not mapped in full (from " + hex(covered) + " on)");
  }
  return *kind;
}

Status make_durable(Durability kind, const void* addr, uint64_t length) {
  switch (kind) {
    case Durability::kNone: std::atomic_thread_fence(std::memory_order_release); return {};
    case Durability::kCacheFlush: write_back_lines(addr, length); return {};
    case Durability::kFileSync: {
      if (length == 0) return {};
      static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
      const uintptr_t p = reinterpret_cast<uintptr_t>(addr);
      const uintptr_t first = p & ~(page - 1);
      if (::msync(reinterpret_cast<void*>(first), p + length - first, MS_SYNC) != 0) {
        return fail(errno, "msync(MS_SYNC) of " + hex(first) + " +" + std::to_string(p + length - first) +
                               " failed: the data may not be on the disk");
      }
      return {};
    }
  }
  return fail(EINVAL, "unknown durability kind");
}

}  // namespace ufab::verbs
