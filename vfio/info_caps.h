// Walking VFIO "info capability chains" (vfio_info_cap_header lists appended
// to GET_INFO / GET_REGION_INFO replies) and the two-call argsz protocol.
// Internal to vfio/.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "vfio/kernel.h"

namespace ufab::vfio::detail {

// An argsz-prefixed reply buffer, 8-byte aligned so the kernel structs
// (which hold __u64 fields) can be read in place.
class InfoBuffer {
 public:
  explicit InfoBuffer(size_t size) : words_((size + 7) / 8, 0), size_(size) {}
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words_.data()); }
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(words_.data()); }
  size_t size() const { return size_; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data());
  }

 private:
  std::vector<uint64_t> words_;
  size_t size_;
};

// Issues an INFO ioctl whose struct starts with `argsz`: the first call
// uses `fixed_size` (plus whatever `prepare` sets, such as a region index);
// when the kernel answers with a larger argsz (there are capabilities that did
// not fit), it is called again with that size. `what` names the call for
// errors.
template <typename Prepare>
Result<InfoBuffer> query_info(Kernel& kernel, int fd, unsigned long request, size_t fixed_size,
                              const std::string& what, Prepare prepare) {
  size_t size = fixed_size;
  // The kernel can only ask for more once per change of its state; a bound
  // keeps a misbehaving kernel (or fake) from looping us forever.
  for (int attempt = 0; attempt < 4; ++attempt) {
    InfoBuffer buffer(size);
    uint32_t argsz = static_cast<uint32_t>(size);
    std::memcpy(buffer.data(), &argsz, sizeof argsz);
    prepare(buffer);
    if (kernel.ioctl(fd, request, buffer.data()) != 0) return fail_errno(what);
    uint32_t wanted;
    std::memcpy(&wanted, buffer.data(), sizeof wanted);
    if (wanted <= size) return buffer;
    if (wanted > (1u << 20))
      return fail(EPROTO, what + ": the kernel asked for an implausible reply size of " +
                              std::to_string(wanted) + " bytes");
    size = wanted;
  }
  return fail(EPROTO, what + ": the reply size kept growing; giving up after 4 calls");
}

struct InfoCap {
  uint16_t id = 0;
  uint16_t version = 0;
  uint32_t offset = 0;  // of the header, from the start of the buffer
  uint32_t length = 0;  // bytes from offset to the next capability or the end
};

// The capabilities starting at `first` (the struct's cap_offset). Offsets are
// relative to the buffer start and must move forward, stay past the fixed
// struct and inside the reply; otherwise the chain is reported as corrupt.
Result<std::vector<InfoCap>> walk_info_caps(const InfoBuffer& buffer, size_t fixed_size, uint32_t first,
                                            const std::string& what);

}  // namespace ufab::vfio::detail
