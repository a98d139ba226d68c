// The C API's own behaviour (core/provider/c_api.cc), over the shared-memory
// provider: argument errors, ufab_last_error per thread, objects destroyed
// in any order with the device closing only with its last object, post
// lists naming the refused request.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>

#include "ufab/rdma.h"

namespace {

int open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

std::string domain(const char* tag) { return "shm:capi" + std::to_string(getpid()) + tag; }

TEST(CApi, ArgumentErrorsSayWhatIsMissing) {
  ufab_device* dev = nullptr;
  EXPECT_EQ(ufab_device_open(nullptr, nullptr, &dev), -EINVAL);
  EXPECT_NE(std::string(ufab_last_error()).find("name and out are required"), std::string::npos) << ufab_last_error();
  ufab_device_opts small{};
  small.size = 4;
  EXPECT_EQ(ufab_device_open(domain("a").c_str(), &small, &dev), -EINVAL);
  EXPECT_NE(std::string(ufab_last_error()).find("sizeof(struct ufab_device_opts)"), std::string::npos);
  EXPECT_LT(ufab_device_open("nosuch:x", nullptr, &dev), 0);
  EXPECT_NE(std::string(ufab_last_error()).find("nosuch:x"), std::string::npos) << ufab_last_error();
}

TEST(CApi, LastErrorIsPerThread) {
  ufab_device* dev = nullptr;
  ASSERT_EQ(ufab_device_open(nullptr, nullptr, &dev), -EINVAL);
  std::string other;
  std::thread([&] { other = ufab_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(ufab_last_error()), "");
}

TEST(CApi, ObjectsMayBeDestroyedInAnyOrderAndTheDeviceClosesWithTheLast) {
  int before = open_fds();
  ufab_device* dev = nullptr;
  ASSERT_EQ(ufab_device_open(domain("b").c_str(), nullptr, &dev), 0) << ufab_last_error();
  ufab_pd* pd = nullptr;
  ufab_cq* cq = nullptr;
  ufab_mr* mr = nullptr;
  ufab_qp* qp = nullptr;
  static char buf[4096];
  ASSERT_EQ(ufab_pd_alloc(dev, &pd), 0);
  ASSERT_EQ(ufab_cq_create(dev, 16, &cq), 0);
  ASSERT_EQ(ufab_mr_reg(pd, buf, sizeof buf, UFAB_ACCESS_LOCAL_WRITE, &mr), 0) << ufab_last_error();
  ufab_qp_init_attr init{};
  init.qp_type = UFAB_QPT_RC;
  init.send_cq = cq;
  init.recv_cq = cq;
  init.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
  ASSERT_EQ(ufab_qp_create(pd, &init, &qp), 0) << ufab_last_error();
  EXPECT_EQ(ufab_cq_depth(cq), 16u);
  int open_now = open_fds();
  EXPECT_GT(open_now, before);  // the device holds descriptors

  // Parents first: each stays alive for its children.
  ufab_device_close(dev);
  EXPECT_EQ(ufab_pd_free(pd), 0);
  EXPECT_EQ(ufab_cq_destroy(cq), 0);
  EXPECT_EQ(open_fds(), open_now);  // still open: the QP and the MR hold it
  ufab_qp_attr attr{};
  EXPECT_EQ(ufab_qp_query(qp, &attr), 0);  // the QP still works
  EXPECT_EQ(attr.state, UFAB_QPS_RESET);
  EXPECT_EQ(ufab_qp_destroy(qp), 0);
  EXPECT_EQ(ufab_mr_dereg(mr), 0);  // the last one: the device closes
  EXPECT_EQ(open_fds(), before);
}

TEST(CApi, APostListNamesTheRefusedRequest) {
  ufab_device* dev = nullptr;
  ASSERT_EQ(ufab_device_open(domain("c").c_str(), nullptr, &dev), 0) << ufab_last_error();
  ufab_pd* pd = nullptr;
  ufab_cq* cq = nullptr;
  ufab_qp* qp = nullptr;
  ASSERT_EQ(ufab_pd_alloc(dev, &pd), 0);
  ASSERT_EQ(ufab_cq_create(dev, 16, &cq), 0);
  ufab_qp_init_attr init{};
  init.qp_type = UFAB_QPT_RC;
  init.send_cq = cq;
  init.recv_cq = cq;
  init.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
  ASSERT_EQ(ufab_qp_create(pd, &init, &qp), 0);
  // Receives may be posted from INIT on; in RESET the first is refused.
  ufab_recv_wr wrs[3] = {};
  uint32_t bad = 99;
  EXPECT_EQ(ufab_post_recv(qp, wrs, 3, &bad), -EINVAL);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(std::string(ufab_last_error()).rfind("receive request 0 of 3", 0), 0u) << ufab_last_error();
  ufab_qp_destroy(qp);
  ufab_cq_destroy(cq);
  ufab_pd_free(pd);
  ufab_device_close(dev);
}

TEST(CApi, ValuesHaveVerbsWords) {
  EXPECT_STREQ(ufab_wc_status_str(UFAB_WC_REM_ACCESS_ERR), "remote access error");
  EXPECT_STREQ(ufab_wc_status_str(200), "unknown status");
  EXPECT_STREQ(ufab_qp_state_str(UFAB_QPS_ERR), "ERROR");
  EXPECT_STREQ(ufab_wr_opcode_str(UFAB_WR_RDMA_READ), "RDMA_READ");
  EXPECT_STREQ(ufab_wr_opcode_str(256 + UFAB_WR_SEND), "unknown opcode");  // not truncated to SEND
  EXPECT_STREQ(ufab_wc_opcode_str(UFAB_WC_RECV_RDMA_WITH_IMM), "RECV_RDMA_WITH_IMM");
}

}  // namespace
