// Template part of test_host.h.
#pragma once

#include <algorithm>
#include <vector>

namespace ufab::swnic_test {

template <typename LenFn>
int send_burst(Port& port, uint64_t first_seq, uint32_t n, LenFn len_of, uint16_t queue) {
  std::vector<ufab_buf*> bufs(n);
  int got = port.tx_pool(queue).alloc(bufs.data(), n);
  if (got <= 0) return 0;
  for (int i = 0; i < got; ++i) {
    ufab_buf* b = bufs[i];
    uint32_t len = len_of(first_seq + i);
    uint32_t room = b->capacity - b->offset;
    // Frames longer than the buffer are declared with their length but only
    // filled as far as the buffer goes (for the oversize tests).
    fill_frame(b->base + b->offset, std::min(len, room), first_seq + i);
    b->len = len;
  }
  int rc = port.drv()->tx_burst(port.dev(), queue, bufs.data(), static_cast<uint16_t>(got));
  int taken = rc < 0 ? 0 : rc;
  if (taken < got) port.tx_pool(queue).free(bufs.data() + taken, static_cast<uint32_t>(got - taken));
  return rc;
}

}  // namespace ufab::swnic_test
