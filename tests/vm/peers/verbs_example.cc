// verbs_example: examples/rdma_example.cc's program and protocol over
// libibverbs (rdma-core) on a kernel RDMA device, such as Linux soft-RoCE's
// rxe0, so that ufab's rdma_example and the kernel's RDMA stack run against
// each other in either role, each side checking every result:
//
//   verbs_example --device rxe0 --gid-index 1 --listen 18515
//   rdma_example --device 0000:00:02.0 --ip 10.0.0.2 --connect 127.0.0.1:18515
//
// It speaks the same exchange (one "UFAB1 ..." line each way over TCP, as
// tools/exchange/exchange.h encodes it, and the client's final "done"),
// registers the same buffer layout, and runs the same steps: the client
// does SEND, RDMA_WRITE, RDMA_READ, RDMA_WRITE_WITH_IMM, FETCH_AND_ADD and
// CMP_AND_SWP against the server's buffer; the server checks the SEND, the
// immediate and every byte written. Its output has rdma_example's shape
// ("verbs_example: step N/M OK: ...", "verbs_example: all M steps OK").
// tests/vm/rxe_verbs_guest.sh runs it against ufab in the VM test bed.
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include "base/hex.h"

#include "base/error.h"
#include "tools/exchange/exchange.h"
#include "ufab/rdma.hpp"

namespace {

namespace exchange = ufab::exchange;
using std::chrono::milliseconds;
using ufab::Error;
using ufab::hex;
using ufab::Result;
using ufab::Status;

constexpr const char* kUsage = R"(usage: verbs_example --device NAME --gid-index N --listen PORT   (server)
       verbs_example --device NAME --gid-index N --connect HOST:PORT   (client)

examples/rdma_example's protocol over libibverbs: connects one RC queue
pair to an rdma_example (or another verbs_example) and runs SEND/RECV,
RDMA_WRITE, RDMA_READ, RDMA_WRITE_WITH_IMM, FETCH_AND_ADD and CMP_AND_SWP,
checking each. The queue-pair data is exchanged over TCP.

options:
  --device NAME      the RDMA device (ibv_devices lists them), e.g. rxe0
  --gid-index N      the port's GID index of ::ffff:A.B.C.D, type RoCE v2
                     (/sys/class/infiniband/NAME/ports/1/gids and gid_attrs)
  --listen PORT      be the server; TCP port for the exchange (0: any free
                     port, printed)
  --connect H:P      be the client; the server's TCP address
  --timeout S        bound on each wait, in seconds (default 30)
  -h, --help         this text

exit status: 0 every step passed, 1 a step failed, 2 usage error.
)";

// examples/rdma_example.cc's layout, which is the protocol: keep the two in
// step.
struct Buffer {
  uint64_t counter;
  uint64_t fetched;
  char message[64];
  uint8_t data[16384];
  uint8_t data_with_imm[4099];
};
static_assert(offsetof(Buffer, data) == 80 && offsetof(Buffer, data_with_imm) == 16464);

constexpr uint64_t kInitialCounter = 1000;
constexpr uint64_t kSwapped = 2000;
constexpr std::string_view kHello = "hello from the rdma_example client";
constexpr uint32_t kImm = 0x1a2b3c4d;  // a number; verbs carries it big-endian (htonl/ntohl)
constexpr uint8_t kPort = 1;

uint8_t pattern(size_t i) { return static_cast<uint8_t>((static_cast<uint32_t>(i) * 2654435761u) >> 24); }
uint8_t imm_pattern(size_t i) { return static_cast<uint8_t>(~pattern(i)); }

struct Options {
  std::string device;
  int gid_index = -1;
  bool server = false;
  uint16_t port = 0;
  std::string host;
  milliseconds timeout{30000};
};

std::unexpected<Error> failed(const std::string& what, const Error& error) {
  return std::unexpected(error.context(what));
}
// A verbs call that returned an errno value (or -1 and errno).
std::unexpected<Error> verbs_failed(const std::string& what, int rc) {
  int err = rc > 0 ? rc : errno;
  return std::unexpected(Error(err, what + ": " + std::strerror(err)));
}

class Steps {
 public:
  explicit Steps(int total) : total_(total) {}
  void ok(const std::string& what) { std::printf("verbs_example: step %d/%d OK: %s\n", ++done_, total_, what.c_str()); }
  void summary() const { std::printf("verbs_example: all %d steps OK\n", done_); }

 private:
  int total_;
  int done_ = 0;
};

std::string dotted(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string(ip >> 16 & 255) + "." + std::to_string(ip >> 8 & 255) + "." +
         std::to_string(ip & 255);
}

// Owners of the verbs objects; they go in reverse order of creation.
template <typename T, int (*Destroy)(T*)>
struct Destroyer {
  void operator()(T* p) const { Destroy(p); }
};
using Context = std::unique_ptr<ibv_context, Destroyer<ibv_context, ibv_close_device>>;
using Pd = std::unique_ptr<ibv_pd, Destroyer<ibv_pd, ibv_dealloc_pd>>;
using Mr = std::unique_ptr<ibv_mr, Destroyer<ibv_mr, ibv_dereg_mr>>;
using Cq = std::unique_ptr<ibv_cq, Destroyer<ibv_cq, ibv_destroy_cq>>;
using Qp = std::unique_ptr<ibv_qp, Destroyer<ibv_qp, ibv_destroy_qp>>;

Result<Context> open_device(const std::string& name) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return verbs_failed("ibv_get_device_list (is the kernel's ib_uverbs loaded?)", -1);
  Context context;
  std::string names;
  for (int i = 0; i < n; ++i) {
    names += std::string(names.empty() ? "" : ", ") + ibv_get_device_name(list[i]);
    if (name == ibv_get_device_name(list[i])) context.reset(ibv_open_device(list[i]));
  }
  int err = errno;
  ibv_free_device_list(list);
  if (context) return context;
  if (names.find(name) != std::string::npos) return verbs_failed("ibv_open_device(" + name + ")", err);
  return std::unexpected(Error(ENODEV, "no RDMA device " + name + "; there are: " + (names.empty() ? "none" : names)));
}

// Our IPv4 address, from the GID the QP will send from: it must be a RoCE
// v2 GID ::ffff:a.b.c.d, as ufab's is.
Result<uint32_t> local_ip(ibv_context* ctx, int gid_index) {
  ibv_gid_entry entry{};
  if (int rc = ibv_query_gid_ex(ctx, kPort, gid_index, &entry, 0); rc != 0) {
    return verbs_failed("reading GID index " + std::to_string(gid_index) + " of port 1", rc);
  }
  const uint8_t* raw = entry.gid.raw;
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (entry.gid_type != IBV_GID_TYPE_ROCE_V2 || std::memcmp(raw, kMapped, 12) != 0) {
    return std::unexpected(Error(EINVAL, "GID index " + std::to_string(gid_index) +
                                             " is not a RoCE v2 GID ::ffff:a.b.c.d; pick the index whose "
                                             "gid_attrs/types entry says \"RoCE v2\" for the port's IPv4 address"));
  }
  return uint32_t(raw[12]) << 24 | uint32_t(raw[13]) << 16 | uint32_t(raw[14]) << 8 | raw[15];
}

// Waits (bounded) for the next completion; an error status is an error.
// The kernel's RDMA stack makes progress on its own, so sleeping between
// polls loses nothing but a little latency.
Result<ibv_wc> next_completion(ibv_cq* cq, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ibv_wc wc{};
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) return std::unexpected(Error(EIO, "ibv_poll_cq failed"));
    if (n == 1 && wc.status != IBV_WC_SUCCESS) {
      return std::unexpected(Error(EIO, std::string("completion status \"") + ibv_wc_status_str(wc.status) + "\" (" +
                                            std::to_string(wc.status) + ", vendor error " + hex(wc.vendor_err) +
                                            ") for wr_id " + std::to_string(wc.wr_id)));
    }
    if (n == 1) return wc;
    if (std::chrono::steady_clock::now() >= deadline) {
      return std::unexpected(Error(ETIMEDOUT, "no completion within " + std::to_string(timeout.count()) +
                                                  " ms: is the peer running, and are both ports on one link?"));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Posts one signaled request and waits for its completion.
Result<ibv_wc> execute(ibv_qp* qp, ibv_cq* cq, ibv_send_wr wr, milliseconds timeout) {
  wr.send_flags |= IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp, &wr, &bad); rc != 0) return verbs_failed("ibv_post_send", rc);
  auto wc = next_completion(cq, timeout);
  if (!wc) return wc;
  if (wc->wr_id != wr.wr_id) {
    return std::unexpected(
        Error(EPROTO, "completion for wr_id " + std::to_string(wc->wr_id) + ", expected " + std::to_string(wr.wr_id)));
  }
  return wc;
}

// RESET -> INIT, with the rights the peer's WRITE, READ and atomics need.
Status to_init(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = kPort;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return verbs_failed("ibv_modify_qp to INIT", rc);
  return {};
}

// INIT -> RTR -> RTS towards `peer`, with what RoCE needs: a GRH to
// ::ffff:peer.ip from our GID, and ufab's defaults (QpAttr) for the rest.
Status to_rts(ibv_qp* qp, int gid_index, const ufab::rdma::ConnectionData& peer, uint32_t our_psn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = kPort;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
  a.ah_attr.grh.hop_limit = 64;
  uint8_t* dgid = a.ah_attr.grh.dgid.raw;
  dgid[10] = dgid[11] = 0xff;
  for (int i = 0; i < 4; ++i) dgid[12 + i] = static_cast<uint8_t>(peer.ip >> (24 - 8 * i));
  int rc = ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return verbs_failed("ibv_modify_qp to RTR (the kernel resolves " + dotted(peer.ip) + " by ARP)", rc);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = our_psn;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 16;
  rc = ibv_modify_qp(
      qp, &a,
      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return verbs_failed("ibv_modify_qp to RTS", rc);
  return {};
}

Status run_client_steps(ibv_qp* qp, ibv_cq* cq, Buffer& buf, const ibv_mr* mr, const ufab::rdma::ConnectionData& peer,
                        milliseconds timeout, Steps& steps) {
  auto sge_of = [&](const void* field, uint32_t length) {
    return ibv_sge{.addr = reinterpret_cast<uint64_t>(field), .length = length, .lkey = mr->lkey};
  };
  const uint64_t remote_data = peer.addr + offsetof(Buffer, data);
  const uint64_t remote_counter = peer.addr + offsetof(Buffer, counter);

  std::memcpy(buf.message, kHello.data(), kHello.size());
  ibv_sge send_sge = sge_of(buf.message, kHello.size());
  ibv_send_wr send{};
  send.wr_id = 1;
  send.opcode = IBV_WR_SEND;
  send.sg_list = &send_sge;
  send.num_sge = 1;
  if (auto wc = execute(qp, cq, send, timeout); !wc) return failed("SEND", wc.error());
  steps.ok("SEND of " + std::to_string(kHello.size()) + " bytes");

  for (size_t i = 0; i < sizeof buf.data; ++i) buf.data[i] = pattern(i);
  ibv_sge data_sge = sge_of(buf.data, sizeof buf.data);
  ibv_send_wr write{};
  write.wr_id = 2;
  write.opcode = IBV_WR_RDMA_WRITE;
  write.sg_list = &data_sge;
  write.num_sge = 1;
  write.wr.rdma.remote_addr = remote_data;
  write.wr.rdma.rkey = peer.rkey;
  if (auto wc = execute(qp, cq, write, timeout); !wc) return failed("RDMA_WRITE", wc.error());
  steps.ok("RDMA_WRITE of " + std::to_string(sizeof buf.data) + " bytes to " + hex(remote_data));

  std::memset(buf.data, 0, sizeof buf.data);
  ibv_send_wr read = write;
  read.wr_id = 3;
  read.opcode = IBV_WR_RDMA_READ;
  auto read_wc = execute(qp, cq, read, timeout);
  if (!read_wc) return failed("RDMA_READ", read_wc.error());
  for (size_t i = 0; i < sizeof buf.data; ++i) {
    if (buf.data[i] != pattern(i)) {
      return std::unexpected(Error(EIO, "RDMA_READ: byte " + std::to_string(i) + " is " + hex(buf.data[i]) +
                                            ", the RDMA_WRITE put " + hex(pattern(i))));
    }
  }
  steps.ok("RDMA_READ of " + std::to_string(read_wc->byte_len) + " bytes back, all equal to what was written");

  for (size_t i = 0; i < sizeof buf.data_with_imm; ++i) buf.data_with_imm[i] = imm_pattern(i);
  ibv_sge imm_sge = sge_of(buf.data_with_imm, sizeof buf.data_with_imm);
  ibv_send_wr write_imm = write;
  write_imm.wr_id = 4;
  write_imm.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  write_imm.sg_list = &imm_sge;
  write_imm.wr.rdma.remote_addr = peer.addr + offsetof(Buffer, data_with_imm);
  write_imm.imm_data = htonl(kImm);
  if (auto wc = execute(qp, cq, write_imm, timeout); !wc) return failed("RDMA_WRITE_WITH_IMM", wc.error());
  steps.ok("RDMA_WRITE_WITH_IMM of " + std::to_string(sizeof buf.data_with_imm) + " bytes, immediate " + hex(kImm));

  ibv_sge fetched_sge = sge_of(&buf.fetched, sizeof buf.fetched);
  ibv_send_wr add{};
  add.wr_id = 5;
  add.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  add.sg_list = &fetched_sge;
  add.num_sge = 1;
  add.wr.atomic.remote_addr = remote_counter;
  add.wr.atomic.rkey = peer.rkey;
  add.wr.atomic.compare_add = 1;
  if (auto wc = execute(qp, cq, add, timeout); !wc) return failed("FETCH_AND_ADD", wc.error());
  if (buf.fetched != kInitialCounter) {
    return std::unexpected(Error(EIO, "FETCH_AND_ADD returned " + std::to_string(buf.fetched) + ", expected " +
                                          std::to_string(kInitialCounter)));
  }
  steps.ok("FETCH_AND_ADD 1: the counter was " + std::to_string(buf.fetched));

  ibv_send_wr cas = add;
  cas.wr_id = 6;
  cas.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  cas.wr.atomic.compare_add = kInitialCounter + 1;
  cas.wr.atomic.swap = kSwapped;
  if (auto wc = execute(qp, cq, cas, timeout); !wc) return failed("CMP_AND_SWP", wc.error());
  if (buf.fetched != kInitialCounter + 1) {
    return std::unexpected(Error(EIO, "CMP_AND_SWP found " + std::to_string(buf.fetched) + ", expected " +
                                          std::to_string(kInitialCounter + 1) + " (so nothing was swapped)"));
  }
  steps.ok("CMP_AND_SWP " + std::to_string(kInitialCounter + 1) + " -> " + std::to_string(kSwapped) + ": swapped");
  return {};
}

Status run_server_steps(ibv_cq* cq, const Buffer& buf, exchange::TcpChannel& channel, milliseconds timeout,
                        Steps& steps) {
  auto wc = next_completion(cq, timeout);
  if (!wc) return failed("receiving the SEND", wc.error());
  std::string_view got(buf.message, std::min<size_t>(wc->byte_len, sizeof buf.message));
  if (wc->opcode != IBV_WC_RECV || got != kHello) {
    return std::unexpected(Error(EIO, "received \"" + std::string(got) + "\" (wc opcode " + std::to_string(wc->opcode) +
                                          "), expected \"" + std::string(kHello) + "\""));
  }
  steps.ok("RECV of " + std::to_string(wc->byte_len) + " bytes: \"" + std::string(got) + "\"");

  wc = next_completion(cq, timeout);
  if (!wc) return failed("receiving the RDMA_WRITE_WITH_IMM", wc.error());
  if (wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(wc->wc_flags & IBV_WC_WITH_IMM)) {
    return std::unexpected(Error(EIO, "RDMA_WRITE_WITH_IMM: wc opcode " + std::to_string(wc->opcode) + ", flags " +
                                          hex(wc->wc_flags) + ", expected RECV_RDMA_WITH_IMM (" +
                                          std::to_string(IBV_WC_RECV_RDMA_WITH_IMM) + ") with IBV_WC_WITH_IMM"));
  }
  const uint32_t imm = ntohl(wc->imm_data);
  if (imm != kImm || wc->byte_len != sizeof buf.data_with_imm) {
    return std::unexpected(Error(EIO, "RDMA_WRITE_WITH_IMM: immediate " + hex(imm) + " and length " +
                                          std::to_string(wc->byte_len) + ", expected " + hex(kImm) + " and " +
                                          std::to_string(sizeof buf.data_with_imm)));
  }
  for (size_t i = 0; i < sizeof buf.data_with_imm; ++i) {
    if (buf.data_with_imm[i] != imm_pattern(i)) {
      return std::unexpected(Error(EIO, "RDMA_WRITE_WITH_IMM: byte " + std::to_string(i) + " is " +
                                            hex(buf.data_with_imm[i]) + ", expected " + hex(imm_pattern(i))));
    }
  }
  steps.ok("RECV_RDMA_WITH_IMM: immediate " + hex(imm) + ", the " + std::to_string(wc->byte_len) +
           " bytes written are in our buffer");

  auto done = channel.recv_line(16, timeout);
  if (!done) return failed("waiting for the client to finish", done.error());
  if (*done != "done") return std::unexpected(Error(EPROTO, "client sent \"" + *done + "\", expected \"done\""));
  for (size_t i = 0; i < sizeof buf.data; ++i) {
    if (buf.data[i] != pattern(i)) {
      return std::unexpected(Error(EIO, "RDMA_WRITE: byte " + std::to_string(i) + " of the buffer is " +
                                            hex(buf.data[i]) + ", expected " + hex(pattern(i))));
    }
  }
  steps.ok("the client's RDMA_WRITE of " + std::to_string(sizeof buf.data) + " bytes is in our buffer");
  if (buf.counter != kSwapped) {
    return std::unexpected(Error(EIO, "the counter is " + std::to_string(buf.counter) + ", expected " +
                                          std::to_string(kSwapped) + " after FETCH_AND_ADD and CMP_AND_SWP"));
  }
  steps.ok("the counter went " + std::to_string(kInitialCounter) + " -> " + std::to_string(kSwapped) +
           " through the client's atomics");
  return {};
}

Status run(const Options& opt) {
  Steps steps(opt.server ? 5 : 7);

  auto context = open_device(opt.device);
  if (!context) return std::unexpected(context.error());
  ibv_context* ctx = context->get();
  ibv_port_attr port{};
  if (int rc = ibv_query_port(ctx, kPort, &port); rc != 0) return verbs_failed("ibv_query_port", rc);
  if (port.state != IBV_PORT_ACTIVE) {
    return std::unexpected(Error(ENETDOWN, "port 1 of " + opt.device + " is " + ibv_port_state_str(port.state) +
                                               ", not ACTIVE: is its netdev up?"));
  }
  auto ip = local_ip(ctx, opt.gid_index);
  if (!ip) return failed(opt.device, ip.error());

  Pd pd(ibv_alloc_pd(ctx));
  if (!pd) return verbs_failed("ibv_alloc_pd", -1);
  auto buf = std::make_unique<Buffer>();
  buf->counter = kInitialCounter;
  Mr mr(
      ibv_reg_mr(pd.get(), buf.get(), sizeof(Buffer),
                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
  if (!mr) return verbs_failed("ibv_reg_mr of " + std::to_string(sizeof(Buffer)) + " bytes", -1);
  Cq cq(ibv_create_cq(ctx, 32, nullptr, nullptr, 0));
  if (!cq) return verbs_failed("ibv_create_cq", -1);
  ibv_qp_init_attr init{};
  init.send_cq = cq.get();
  init.recv_cq = cq.get();
  init.qp_type = IBV_QPT_RC;
  init.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 0};
  Qp qp(ibv_create_qp(pd.get(), &init));
  if (!qp) return verbs_failed("ibv_create_qp", -1);
  if (auto s = to_init(qp.get()); !s) return s;

  ufab::rdma::ConnectionData local;
  local.ip = *ip;
  local.qpn = qp->qp_num;
  local.psn = std::random_device{}() & 0xffffff;
  local.addr = reinterpret_cast<uint64_t>(buf.get());
  local.rkey = mr->rkey;
  local.length = sizeof(Buffer);
  auto line = exchange::encode_connection_line(local);
  if (!line) return failed("encoding our connection data", line.error());

  if (opt.server) {
    // Both receives before the client can send: one for the SEND, one for
    // the WRITE_WITH_IMM's immediate (no SGE: its data goes where the
    // client points).
    ibv_sge recv_sge{.addr = reinterpret_cast<uint64_t>(buf->message), .length = sizeof buf->message, .lkey = mr->lkey};
    ibv_recv_wr imm_recv{.wr_id = 101, .next = nullptr, .sg_list = nullptr, .num_sge = 0};
    ibv_recv_wr recv{.wr_id = 100, .next = &imm_recv, .sg_list = &recv_sge, .num_sge = 1};
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(qp.get(), &recv, &bad); rc != 0) return verbs_failed("ibv_post_recv", rc);
  }

  // rdma_example's exchange: the server reads first and connects its QP
  // before it answers; the connection stays open for the client's "done".
  Result<exchange::TcpChannel> channel = std::unexpected(Error(ENOTCONN, "not connected"));
  if (opt.server) {
    auto listener = exchange::TcpChannel::listen(opt.port);
    if (!listener) return failed("listening on TCP port " + std::to_string(opt.port), listener.error());
    std::printf("verbs_example: server %s at %s, QP %s, listening on TCP port %u\n", opt.device.c_str(),
                dotted(*ip).c_str(), hex(qp->qp_num).c_str(), listener->port());
    channel = listener->accept(opt.timeout);
    if (!channel) return failed("waiting for the client", channel.error());
  } else {
    channel = exchange::TcpChannel::connect(opt.host, opt.port, opt.timeout);
    if (!channel) return std::unexpected(channel.error());
    if (auto sent = channel->send_all(*line, opt.timeout); !sent) {
      return failed("sending our connection data", sent.error());
    }
  }
  auto peer_line = channel->recv_line(exchange::kConnectionLineMax, opt.timeout);
  if (!peer_line) return failed("reading the peer's connection data", peer_line.error());
  auto peer = exchange::decode_connection_line(*peer_line);
  if (!peer) return failed("the peer's connection data", peer.error());

  if (auto s = to_rts(qp.get(), opt.gid_index, *peer, local.psn); !s) {
    return failed("connecting the queue pair", s.error());
  }
  if (opt.server) {
    if (auto sent = channel->send_all(*line, opt.timeout); !sent) return failed("answering the client", sent.error());
  }
  steps.ok("QP " + hex(qp->qp_num) + " connected to QP " + hex(peer->qpn) + " at " + dotted(peer->ip) +
           " (path MTU 1024)");

  if (opt.server) {
    if (auto s = run_server_steps(cq.get(), *buf, *channel, opt.timeout, steps); !s) return s;
  } else {
    if (auto s = run_client_steps(qp.get(), cq.get(), *buf, mr.get(), *peer, opt.timeout, steps); !s) return s;
    if (auto sent = channel->send_all("done\n", opt.timeout); !sent) return failed("telling the server", sent.error());
  }
  steps.summary();
  return {};  // the QP, CQ, MR, buffer, PD and device go in reverse order
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "verbs_example: %s\n(run `verbs_example --help` for usage)\n", message.c_str());
  return 2;
}

bool parse_number(std::string_view text, unsigned max, unsigned* out) {
  if (text.empty() || text.size() > 5) return false;
  unsigned value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > max) return false;
  *out = value;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Options opt;
  bool listen = false, connect = false;
  unsigned n = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) return usage_error("unknown option or missing value: " + arg);
    std::string value = argv[++i];
    if (arg == "--device") {
      opt.device = value;
    } else if (arg == "--gid-index") {
      if (!parse_number(value, 255, &n)) return usage_error("--gid-index " + value + ": expected 0-255");
      opt.gid_index = int(n);
    } else if (arg == "--listen") {
      if (!parse_number(value, 65535, &n)) return usage_error("--listen " + value + ": expected a TCP port, 0-65535");
      opt.port = uint16_t(n);
      listen = true;
    } else if (arg == "--connect") {
      size_t colon = value.rfind(':');
      if (colon == std::string::npos || colon == 0 || !parse_number(value.substr(colon + 1), 65535, &n) || n == 0) {
        return usage_error("--connect " + value + ": expected HOST:PORT, e.g. 127.0.0.1:18515");
      }
      opt.port = uint16_t(n);
      opt.host = value.substr(0, colon);
      connect = true;
    } else if (arg == "--timeout") {
      char* end = nullptr;
      long seconds = std::strtol(value.c_str(), &end, 10);
      if (*end != '\0' || seconds <= 0 || seconds > 86400) {
        return usage_error("--timeout " + value + ": expected seconds, 1-86400");
      }
      opt.timeout = milliseconds(seconds * 1000);
    } else {
      return usage_error("unknown option " + arg);
    }
  }
  if (opt.device.empty() || opt.gid_index < 0) return usage_error("--device and --gid-index are required");
  if (listen == connect) {
    return usage_error("give exactly one of --listen PORT (server) and --connect HOST:PORT (client)");
  }
  opt.server = listen;

  if (auto s = run(opt); !s) {
    std::fprintf(stderr, "verbs_example: %s\n", s.error().message().c_str());
    return 1;
  }
  return 0;
}
