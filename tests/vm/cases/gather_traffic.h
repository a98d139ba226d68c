// Gather transmit (abi/raw_frame.h tx_burst_gather) between two VM test
// ports, checked byte for byte. Shared by the e1000e and virtio-net VM tests.
//
// Frame `seq` is 60..1514 bytes in 1..4 segments (seq % 4 + 1):
//  - segment 0 lies in the frame's own buffer from the sender's pool, at an
//    odd shift past its headroom: a 28-byte header (destination, source,
//    ethertype 0x88b5, "GATH", sequence, length) and some filler; with one
//    segment the whole frame is there;
//  - the other segments lie in one DMA region from the sender's dma()
//    allocator (so they have real IOVAs behind the vIOMMU), at odd offsets
//    and mostly odd lengths, shared by every frame and never copied.
// The receiver compares each frame with the bytes the sender gathered.
#pragma once

#include <cstdint>

#include "tests/vm/cases/vm_ports.h"

namespace ufab::vmtest {

struct GatherSpec {
  uint64_t frames = 3000;
  uint16_t burst = 16;  // frames offered per call after the first
  // The first call offers more frames than the empty TX ring has
  // descriptors for: it must take whole frames up to `ring_room`
  // descriptors, stopping at the first that does not fit. A frame of n
  // segments takes n + `extra_descs` descriptors (virtio-net: 1, the header).
  uint32_t ring_room = 0;  // 0: no such check
  uint32_t extra_descs = 0;
  // e1000e: a segment takes a descriptor per 4 KiB IOVA page it touches
  // (docs/drivers/e1000e.md, "Gather transmit").
  bool page_split = false;
  uint64_t window = 192;  // frames in flight at most (QEMU's hub reorders past a full receiver)
  double timeout_s = 240;
};

struct GatherReport {
  uint64_t sent = 0, received = 0;
  uint64_t mismatched = 0;    // ours, but not byte for byte what was gathered
  uint64_t out_of_order = 0;  // ours, but not the next sequence number
  uint64_t foreign = 0;       // not ours (other traffic on the hub)
  uint32_t first_call_frames = 0, first_call_descs = 0;  // what the first call took
  uint32_t first_left_descs = 0;                         // what the first frame it left needed
  uint32_t segments[5] = {};                             // frames sent by segment count
  double seconds = 0;
  bool timed_out = false;
};

// Sends spec.frames gathered frames from a (TX queue 0) to b (RX queue 0)
// and checks them; gtest failures for what goes wrong. Stops a's device
// when frames are left in flight, so the payload region can go.
GatherReport gather_transfer(Port& a, Port& b, const GatherSpec& spec, const char* label);

}  // namespace ufab::vmtest
