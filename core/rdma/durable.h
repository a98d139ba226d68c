// Durable memory: what makes the bytes of a mapping survive a power loss,
// learned from the mapping itself, and the operation that does it. A FLUSH
// PERSISTENT (IBA memory placement extensions) is answered only after
// make_durable has returned for its range; docs/persistence.md says what
// each kind promises and costs.
#pragma once

#include <cstdint>
#include <string>

#include "base/error.h"

namespace ufab::verbs {

enum class Durability : uint8_t {
  kNone,        // DRAM, tmpfs, private or anonymous memory: visibility is all a flush gives
  kCacheFlush,  // persistent memory mapped with DAX: write the cache lines back, then fence
  kFileSync,    // the page cache of a file or block device on a disk: msync(MS_SYNC)
};

// "none", "cache-flush", "file-sync".
const char* durability_name(Durability d);

struct MappingDurability {
  Durability kind = Durability::kNone;
  // What the range is, for messages and `ufab` output: "/dev/dax0.0
  // (device DAX)", "/data/log (ext4 file, msync)".
  std::string what;
};

// How [addr, addr + length) of this process can be made durable, from
// /proc/self/smaps and the backing files: every byte must be mapped
// MAP_SHARED from one of
//   - a device-DAX character device (/dev/daxN.M)  -> kCacheFlush
//   - a file mapped with MAP_SYNC (a DAX file system) -> kCacheFlush
//   - a block device                               -> kFileSync
//   - a regular file on a disk file system          -> kFileSync
// and all of it the same kind. Anything else (anonymous or private memory,
// tmpfs/ramfs/hugetlbfs, overlayfs whose upper layer may be memory, a
// deleted file) is an error that says what the range is and what to map
// instead.
Result<MappingDurability> classify_mapping(const void* addr, uint64_t length);

// Makes [addr, addr + length) durable the way `kind` says: CLWB (else
// CLFLUSHOPT, else CLFLUSH) of every cache line and a store fence, or
// msync(MS_SYNC) of the pages. kNone: a release fence only (global
// visibility). Errors carry msync's errno (EIO: the disk failed the write).
Status make_durable(Durability kind, const void* addr, uint64_t length);

// The cache-line write-back instruction make_durable uses on this CPU:
// "clwb", "clflushopt" or "clflush".
const char* cache_writeback_instruction();

}  // namespace ufab::verbs
