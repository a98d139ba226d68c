// The C API's own behaviour (core/provider/c_api.cc), over the shared-memory
// provider: argument errors, ufab_last_error per thread, objects destroyed
// in any order with the device closing only with its last object, post
// lists naming the refused request, and the shm provider's refusal of
// FLUSH, ATOMIC_WRITE, commit-complete WRITEs and persistent memory.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
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
  EXPECT_STREQ(ufab_wr_opcode_str(UFAB_WR_FLUSH), "FLUSH");
  EXPECT_STREQ(ufab_wr_opcode_str(UFAB_WR_ATOMIC_WRITE), "ATOMIC_WRITE");
  EXPECT_STREQ(ufab_wc_opcode_str(UFAB_WC_FLUSH), "FLUSH");
  EXPECT_STREQ(ufab_wc_opcode_str(UFAB_WC_ATOMIC_WRITE), "ATOMIC_WRITE");
}

// verbs' numbers, and the send WR's layout of API 1.0 (the FLUSH fields
// took its reserved word; the union shares compare_add's bytes).
TEST(CApi, FlushAndAtomicWriteValuesAreVerbs) {
  EXPECT_EQ(UFAB_WR_FLUSH, 14);
  EXPECT_EQ(UFAB_WR_ATOMIC_WRITE, 15);
  EXPECT_EQ(UFAB_WC_FLUSH, 8);
  EXPECT_EQ(UFAB_WC_ATOMIC_WRITE, 9);
  EXPECT_EQ(UFAB_ACCESS_FLUSH_GLOBAL, 1u << 8);
  EXPECT_EQ(UFAB_ACCESS_FLUSH_PERSISTENT, 1u << 9);
  EXPECT_EQ(UFAB_FLUSH_GLOBAL, 1);
  EXPECT_EQ(UFAB_FLUSH_PERSISTENT, 2);
  EXPECT_EQ(UFAB_FLUSH_RANGE, 0);
  EXPECT_EQ(UFAB_FLUSH_MR, 1);
  EXPECT_EQ(sizeof(ufab_send_wr), 80u);
  EXPECT_EQ(offsetof(ufab_send_wr, rkey), 40u);
  EXPECT_EQ(offsetof(ufab_send_wr, flush_type), 44u);
  EXPECT_EQ(offsetof(ufab_send_wr, flush_level), 45u);
  EXPECT_EQ(offsetof(ufab_send_wr, compare_add), 48u);
  EXPECT_EQ(offsetof(ufab_send_wr, atomic_value), 48u);
  EXPECT_EQ(offsetof(ufab_send_wr, flush_length), 48u);
  EXPECT_EQ(offsetof(ufab_send_wr, swap), 56u);
}


TEST(CApi, ShmRefusesFlushAndAtomicWriteAsNotSupported) {
  ufab_device* dev = nullptr;
  ASSERT_EQ(ufab_device_open(domain("g").c_str(), nullptr, &dev), 0) << ufab_last_error();
  ufab_device_attr attr{};
  ASSERT_EQ(ufab_device_query(dev, &attr), 0);
  EXPECT_EQ(attr.caps & (UFAB_DEVICE_CAP_FLUSH_GLOBAL | UFAB_DEVICE_CAP_FLUSH_PERSISTENT | UFAB_DEVICE_CAP_ATOMIC_WRITE),
            0u);
  ufab_pd* pd = nullptr;
  ufab_cq* cq = nullptr;
  ufab_qp* qp = nullptr;
  ASSERT_EQ(ufab_pd_alloc(dev, &pd), 0);
  ASSERT_EQ(ufab_cq_create(dev, 16, &cq), 0);
  static char buf[4096];
  ufab_mr* mr = nullptr;
  EXPECT_EQ(ufab_mr_reg(pd, buf, sizeof buf, UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_FLUSH_GLOBAL, &mr), -EOPNOTSUPP);
  EXPECT_NE(std::string(ufab_last_error()).find("soft-RoCE"), std::string::npos) << ufab_last_error();
  ufab_qp_init_attr init{};
  init.qp_type = UFAB_QPT_RC;
  init.send_cq = cq;
  init.recv_cq = cq;
  init.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
  ASSERT_EQ(ufab_qp_create(pd, &init, &qp), 0);
  ufab_qp_attr a{};
  a.state = UFAB_QPS_INIT;
  a.port = 1;
  a.access_flags = UFAB_ACCESS_REMOTE_WRITE | UFAB_ACCESS_FLUSH_GLOBAL;
  EXPECT_EQ(ufab_qp_modify(qp, &a, UFAB_QP_STATE | UFAB_QP_PKEY_INDEX | UFAB_QP_PORT | UFAB_QP_ACCESS_FLAGS),
            -EOPNOTSUPP);
  EXPECT_NE(std::string(ufab_last_error()).find("FLUSH"), std::string::npos) << ufab_last_error();
  for (uint32_t op : {uint32_t{UFAB_WR_FLUSH}, uint32_t{UFAB_WR_ATOMIC_WRITE}}) {
    ufab_send_wr wr{};
    wr.opcode = op;
    wr.flush_type = UFAB_FLUSH_GLOBAL;
    uint32_t bad = 99;
    EXPECT_EQ(ufab_post_send(qp, &wr, 1, &bad), -EOPNOTSUPP);
    EXPECT_EQ(bad, 0u);
    std::string why = ufab_last_error();
    EXPECT_NE(why.find(ufab_wr_opcode_str(op)), std::string::npos) << why;
    EXPECT_NE(why.find("not implemented by the shm provider"), std::string::npos) << why;
  }
  ufab_send_wr commit{};
  commit.opcode = UFAB_WR_RDMA_WRITE;
  commit.send_flags = UFAB_SEND_COMMIT;
  uint32_t bad = 99;
  EXPECT_EQ(ufab_post_send(qp, &commit, 1, &bad), -EOPNOTSUPP) << "a commit-complete WRITE it cannot make durable";
  EXPECT_NE(std::string(ufab_last_error()).find("UFAB_SEND_COMMIT"), std::string::npos) << ufab_last_error();
  for (uint32_t access : {uint32_t{UFAB_ACCESS_FLUSH_PERSISTENT},
                          uint32_t{UFAB_ACCESS_LOCAL_WRITE | UFAB_ACCESS_FLUSH_GLOBAL | UFAB_ACCESS_FLUSH_PERSISTENT}}) {
    EXPECT_EQ(ufab_mr_reg(pd, buf, sizeof buf, access, &mr), -EOPNOTSUPP);
  }
  ufab_mr_attr pm{.size = sizeof pm, .access = UFAB_ACCESS_LOCAL_WRITE, .addr = buf, .length = sizeof buf,
                  .mem_type = UFAB_MEM_PERSISTENT, .reserved = 0};
  EXPECT_EQ(ufab_mr_reg_attr(pd, &pm, &mr), -EOPNOTSUPP);
  EXPECT_NE(std::string(ufab_last_error()).find("persistent"), std::string::npos) << ufab_last_error();
  EXPECT_EQ(mr, nullptr);
  ufab_qp_destroy(qp);
  ufab_cq_destroy(cq);
  ufab_pd_free(pd);
  ufab_device_close(dev);
}

}  // namespace
