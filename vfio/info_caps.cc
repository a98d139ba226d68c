#include "vfio/info_caps.h"

#include <linux/vfio.h>

#include "vfio/text.h"

namespace ufab::vfio::detail {

Result<std::vector<InfoCap>> walk_info_caps(const InfoBuffer& buffer, size_t fixed_size, uint32_t first,
                                            const std::string& what) {
  std::vector<InfoCap> caps;
  uint32_t offset = first;
  uint32_t previous = 0;
  while (offset != 0) {
    if (offset < fixed_size || offset <= previous || offset % 4 != 0 ||
        offset > buffer.size() || buffer.size() - offset < sizeof(vfio_info_cap_header))
      return fail(EPROTO, what + ": capability chain is corrupt (capability at offset " + hex(offset) +
                              " in a " + std::to_string(buffer.size()) + "-byte reply)");
    vfio_info_cap_header header;
    std::memcpy(&header, buffer.data() + offset, sizeof header);
    InfoCap cap;
    cap.id = header.id;
    cap.version = header.version;
    cap.offset = offset;
    cap.length = static_cast<uint32_t>(buffer.size() - offset);
    if (header.next != 0 && header.next > offset && header.next - offset < cap.length)
      cap.length = header.next - offset;
    caps.push_back(cap);
    previous = offset;
    offset = header.next;
  }
  return caps;
}

}  // namespace ufab::vfio::detail
