// Zero-copy transmit through the public API, soft-RoCE over swnic (a NIC
// that gathers, abi/raw_frame.h tx_burst_gather): WRITE, SEND and READ
// payloads from registered memory arrive byte for byte, large ones as
// gathered frames (ufab_device_stats.tx_gather_frames), small ones copied;
// zerocopy=off copies everything; a bad zerocopy= value is a clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ufab/rdma.hpp"

namespace ufab::zero_copy_test {
namespace {

using namespace ::ufab::rdma;

constexpr size_t kBig = 65536 + 123;  // 65 packets at the 1024-byte path MTU, the last a short one
constexpr size_t kSmall = 100;        // below the gather threshold

struct Ends {
  std::unique_ptr<Device> a, b;
  std::optional<ProtectionDomain> pd_a, pd_b;
  std::unique_ptr<CompletionQueue> cq_a, cq_b;
  std::unique_ptr<QueuePair> qp_a, qp_b;
  std::vector<uint8_t> src, dst;  // a's buffer, b's buffer
  std::optional<MemoryRegion> mr_a, mr_b;
};

uint8_t pattern(size_t i, unsigned salt) { return static_cast<uint8_t>(i * 131 + salt + (i >> 9)); }

void open_ends(Ends& e, const std::map<std::string, std::string>& params) {
  static int run = 0;
  std::string link = "swnic:zc" + std::to_string(::getpid()) + "r" + std::to_string(run++);
  auto pa = params;
  pa["stale"] = "reset";
  auto a = Device::open(link + ":0", {.ip = "10.8.0.1", .params = pa, .progress_thread = true});
  ASSERT_TRUE(a) << a.error().message();
  auto b = Device::open(link + ":1", {.ip = "10.8.0.2", .params = params, .progress_thread = true});
  ASSERT_TRUE(b) << b.error().message();
  e.a = std::move(*a);
  e.b = std::move(*b);
  e.pd_a.emplace(*e.a->alloc_pd());
  e.pd_b.emplace(*e.b->alloc_pd());
  e.cq_a = std::move(*e.a->create_cq(64));
  e.cq_b = std::move(*e.b->create_cq(64));
  auto qa = e.pd_a->create_qp({.type = QpType::kRc, .send_cq = e.cq_a.get(), .recv_cq = e.cq_a.get()});
  auto qb = e.pd_b->create_qp({.type = QpType::kRc, .send_cq = e.cq_b.get(), .recv_cq = e.cq_b.get()});
  ASSERT_TRUE(qa && qb);
  e.qp_a = std::move(*qa);
  e.qp_b = std::move(*qb);
  e.src.resize(kBig + 1);  // +1: a piece starting at an odd address
  e.dst.assign(kBig + 1, 0);
  auto ma = e.pd_a->register_mr(e.src.data(), e.src.size(), kLocalWrite);
  auto mb = e.pd_b->register_mr(e.dst.data(), e.dst.size(), kLocalWrite | kRemoteWrite | kRemoteRead);
  ASSERT_TRUE(ma && mb);
  e.mr_a.emplace(std::move(*ma));
  e.mr_b.emplace(std::move(*mb));
  ASSERT_TRUE(e.qp_a->connect(e.qp_b->local()));
  ASSERT_TRUE(e.qp_b->connect(e.qp_a->local()));
}

WorkCompletion wait_one(CompletionQueue& cq) {
  WorkCompletion wc[1];
  auto n = cq.wait(wc, std::chrono::milliseconds(10000));
  EXPECT_TRUE(n && *n == 1) << (n ? "timed out" : n.error().message());
  return n && *n == 1 ? wc[0] : WorkCompletion{.status = WcStatus::kGeneralErr};
}

// WRITE a -> b of `len` bytes from offset 1 (two SGEs), checked at b.
void write(Ends& e, size_t len, unsigned salt) {
  for (size_t i = 0; i < len; ++i) e.src[1 + i] = pattern(i, salt);
  Sge sgl[2] = {e.mr_a->sge(1, len / 3), e.mr_a->sge(1 + len / 3, len - len / 3)};
  ASSERT_TRUE(e.qp_a->post_send({.wr_id = salt, .opcode = WrOpcode::kRdmaWrite, .flags = kSendSignaled,
                                 .sgl = sgl, .remote_addr = reinterpret_cast<uintptr_t>(e.dst.data()),
                                 .rkey = e.mr_b->rkey()}));
  EXPECT_EQ(wait_one(*e.cq_a).status, WcStatus::kSuccess);
  for (size_t i = 0; i < len; ++i) ASSERT_EQ(e.dst[i], pattern(i, salt)) << "byte " << i << " of " << len;
}

// SEND a -> b, received at offset 0.
void send(Ends& e, size_t len, unsigned salt) {
  for (size_t i = 0; i < len; ++i) e.src[1 + i] = pattern(i, salt);
  Sge rsge = e.mr_b->sge(0, kBig);
  ASSERT_TRUE(e.qp_b->post_recv({.wr_id = 7, .sgl = {&rsge, 1}}));
  Sge sge = e.mr_a->sge(1, len);
  ASSERT_TRUE(e.qp_a->post_send({.wr_id = salt, .opcode = WrOpcode::kSend, .flags = kSendSignaled, .sgl = {&sge, 1}}));
  EXPECT_EQ(wait_one(*e.cq_a).status, WcStatus::kSuccess);
  WorkCompletion r = wait_one(*e.cq_b);
  EXPECT_EQ(r.status, WcStatus::kSuccess);
  EXPECT_EQ(r.byte_len, len);
  for (size_t i = 0; i < len; ++i) ASSERT_EQ(e.dst[i], pattern(i, salt)) << "byte " << i << " of " << len;
}

// READ b -> a: b's responder sends the data (gathered from b's region).
void read(Ends& e, size_t len, unsigned salt) {
  for (size_t i = 0; i < len; ++i) e.dst[i] = pattern(i, salt);
  Sge sge = e.mr_a->sge(1, len);
  ASSERT_TRUE(e.qp_a->post_send({.wr_id = salt, .opcode = WrOpcode::kRdmaRead, .flags = kSendSignaled,
                                 .sgl = {&sge, 1}, .remote_addr = reinterpret_cast<uintptr_t>(e.dst.data()),
                                 .rkey = e.mr_b->rkey()}));
  EXPECT_EQ(wait_one(*e.cq_a).status, WcStatus::kSuccess);
  for (size_t i = 0; i < len; ++i) ASSERT_EQ(e.src[1 + i], pattern(i, salt)) << "byte " << i << " of " << len;
}

TEST(ZeroCopy, LargePayloadsAreGatheredSmallOnesCopied) {
  Ends e;
  open_ends(e, {});
  ASSERT_TRUE(e.qp_a);
  write(e, kSmall, 1);
  send(e, kSmall, 2);
  EXPECT_EQ(e.a->stats().tx_gather_frames, 0u) << "payloads under 256 bytes are copied";

  write(e, kBig, 3);
  uint64_t after_write = e.a->stats().tx_gather_frames;
  // 64 full packets gathered; the 123-byte last one is copied.
  EXPECT_EQ(after_write, 64u) << "one gathered frame per full packet of a 65-packet WRITE";
  send(e, 4096, 4);
  EXPECT_EQ(e.a->stats().tx_gather_frames, after_write + 4);
  read(e, kBig, 5);
  EXPECT_EQ(e.b->stats().tx_gather_frames, 64u) << "READ responses gathered from the responder's region";
}

TEST(ZeroCopy, OffCopiesEverything) {
  Ends e;
  open_ends(e, {{"zerocopy", "off"}});
  ASSERT_TRUE(e.qp_a);
  write(e, kBig, 6);
  send(e, 4096, 7);
  read(e, kBig, 8);
  EXPECT_EQ(e.a->stats().tx_gather_frames, 0u);
  EXPECT_EQ(e.b->stats().tx_gather_frames, 0u);
}

TEST(ZeroCopy, BadValueIsAClearError) {
  std::string link = "swnic:zcbad" + std::to_string(::getpid());
  auto a = Device::open(link + ":0", {.ip = "10.8.0.1", .params = {{"zerocopy", "maybe"}}});
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().message().find("zerocopy=maybe: use zerocopy=on (the default) or zerocopy=off"),
            std::string::npos)
      << a.error().message();
}

}  // namespace
}  // namespace ufab::zero_copy_test
