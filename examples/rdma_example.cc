// rdma_example: a complete program over ufab's RDMA API (<ufab/rdma.hpp>).
// Two processes, each on its own device, connect one RC queue pair; the client
// then runs SEND, RDMA WRITE, RDMA READ, RDMA WRITE_WITH_IMM, FETCH_AND_ADD
// and CMP_AND_SWP against the server's memory and checks every result.
//
//   rdma_example --device swnic:demo:0 --ip 10.0.0.1 --listen 18515
//   rdma_example --device swnic:demo:1 --ip 10.0.0.2 --connect 127.0.0.1:18515
//   rdma_example --device shm:demo --listen 18516          (shared memory, no --ip)
//   rdma_example --device shm:demo --connect 127.0.0.1:18516
//
// docs/rdma-api.md walks through this file.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "base/hex.h"

#include "tools/exchange/exchange.h"
#include "ufab/rdma.hpp"

namespace {

namespace rdma = ufab::rdma;
namespace exchange = ufab::exchange;
using std::chrono::milliseconds;
using ufab::Error;
using ufab::hex;
using ufab::Result;
using ufab::Status;

constexpr const char* kUsage = R"(usage: rdma_example --device SPEC [--ip A.B.C.D] --listen PORT   (server)
       rdma_example --device SPEC [--ip A.B.C.D] --connect HOST:PORT   (client)

Connects one RC queue pair between two ufab ports and runs SEND/RECV,
RDMA_WRITE, RDMA_READ, RDMA_WRITE_WITH_IMM, FETCH_AND_ADD and CMP_AND_SWP,
checking each. The queue-pair data is exchanged over TCP.

options:
  --device SPEC      the port: a PCI address bound to vfio-pci (0000:01:00.0),
                     a software NIC (swnic:NAME:0, swnic:NAME:1), or a
                     shared-memory domain (shm:NAME)
  --ip A.B.C.D       this port's IPv4 address (GID ::ffff:A.B.C.D); required
                     on a NIC, unused on shm
  --listen PORT      be the server; TCP port for the exchange (0: any free
                     port, printed)
  --connect H:P      be the client; the server's TCP address
  --param K=V        driver parameter (repeatable), e.g. stale=reset on swnic
  --timeout S        bound on each wait, in seconds (default 30)
  -h, --help         this text

exit status: 0 every step passed, 1 a step failed, 2 usage error.
)";

// Both sides register one buffer with this layout, so one rkey covers all
// the peer may touch. The peer learns only the buffer's address; where the
// counter and the data lie inside it is the protocol both programs share.
struct Buffer {
  uint64_t counter;     // target of the peer's atomics: must be 8-byte aligned
  uint64_t fetched;     // where our atomics put the value they replaced
  char message[64];     // SEND / RECV
  uint8_t data[16384];  // RDMA WRITE / READ: 16 packets at the 1024-byte path MTU
  // RDMA WRITE_WITH_IMM: 4 packets and a last one of 3 bytes, which
  // carries the immediate and a pad byte.
  uint8_t data_with_imm[4099];
};

constexpr uint64_t kInitialCounter = 1000;  // the server's counter before the client's atomics
constexpr uint64_t kSwapped = 2000;         // what CMP_AND_SWP stores
constexpr std::string_view kHello = "hello from the rdma_example client";
constexpr uint32_t kImm = 0x1a2b3c4d;  // RDMA_WRITE_WITH_IMM's immediate: 4 different bytes show their order

// Content that differs at every offset of a packet-sized stride, so a packet
// that lands in the wrong place cannot go unnoticed.
uint8_t pattern(size_t i) { return static_cast<uint8_t>((static_cast<uint32_t>(i) * 2654435761u) >> 24); }
// RDMA_WRITE_WITH_IMM's content, unlike the RDMA_WRITE's at every offset.
uint8_t imm_pattern(size_t i) { return static_cast<uint8_t>(~pattern(i)); }

struct Options {
  std::string device;
  std::string ip;
  std::map<std::string, std::string> params;
  bool server = false;
  uint16_t port = 0;
  std::string host;  // client
  milliseconds timeout{30000};
};

std::unexpected<Error> failed(const std::string& what, const Error& error) {
  return std::unexpected(error.context(what));
}

// One line per step; the test (tests/examples/rdma_example_test.sh) reads
// the last one.
class Steps {
 public:
  explicit Steps(int total) : total_(total) {}
  void ok(const std::string& what) { std::printf("rdma_example: step %d/%d OK: %s\n", ++done_, total_, what.c_str()); }
  void summary() const { std::printf("rdma_example: all %d steps OK\n", done_); }

 private:
  int total_;
  int done_ = 0;
};

// Waits for the next completion. A completion with an error status is an
// error here: a request either did what it was asked or says why not.
Result<rdma::WorkCompletion> next_completion(rdma::CompletionQueue& cq, milliseconds timeout) {
  rdma::WorkCompletion wc;
  auto n = cq.wait(std::span(&wc, 1), timeout);
  if (!n) return failed("polling the completion queue", n.error());
  if (*n == 0) {
    return std::unexpected(Error(ETIMEDOUT, "no completion within " + std::to_string(timeout.count()) +
                                                " ms: is the peer running, and are both ports on one link?"));
  }
  if (wc.status != rdma::WcStatus::kSuccess) {
    return std::unexpected(Error(EIO, std::string("completion status \"") + rdma::wc_status_name(wc.status) + "\"" +
                                          (wc.error.empty() ? "" : ": " + wc.error)));
  }
  return wc;
}

// Posts one signaled request and waits for it. One request at a time keeps
// the example linear; a real application keeps many in flight and matches
// completions by wr_id.
Result<rdma::WorkCompletion> execute(rdma::QueuePair& qp, rdma::CompletionQueue& cq, rdma::SendWr wr,
                                     milliseconds timeout) {
  wr.flags |= rdma::kSendSignaled;  // unsignaled sends complete silently
  if (auto posted = qp.post_send(wr); !posted) return failed("posting", posted.error());
  auto wc = next_completion(cq, timeout);
  if (!wc) return std::unexpected(wc.error());
  if (wc->wr_id != wr.wr_id) {
    return std::unexpected(
        Error(EPROTO, "completion for wr_id " + std::to_string(wc->wr_id) + ", expected " + std::to_string(wr.wr_id)));
  }
  return wc;
}

std::string dotted(uint32_t ip) {  // host order, as ConnectionData holds it
  return std::to_string(ip >> 24) + "." + std::to_string(ip >> 16 & 255) + "." + std::to_string(ip >> 8 & 255) + "." +
         std::to_string(ip & 255);
}

// The client's six operations against the server's buffer, which `peer`
// describes (its address and rkey travelled in the TCP exchange).
Status run_client_steps(rdma::QueuePair& qp, rdma::CompletionQueue& cq, Buffer& buf, const rdma::MemoryRegion& mr,
                        const rdma::ConnectionData& peer, milliseconds timeout, Steps& steps) {
  const uint64_t base = reinterpret_cast<uint64_t>(&buf);
  // An SGE names local memory by (address, length, lkey); sge() computes
  // that for a range of the region.
  auto sge_of = [&](const void* field, uint32_t length) {
    return mr.sge(reinterpret_cast<uint64_t>(field) - base, length);
  };
  const uint64_t remote_data = peer.addr + offsetof(Buffer, data);
  const uint64_t remote_counter = peer.addr + offsetof(Buffer, counter);

  // SEND: the server chose where it lands by posting a receive beforehand.
  std::memcpy(buf.message, kHello.data(), kHello.size());
  rdma::Sge send_sge = sge_of(buf.message, kHello.size());
  rdma::SendWr send;
  send.wr_id = 1;
  send.opcode = rdma::WrOpcode::kSend;
  send.sgl = {&send_sge, 1};
  if (auto wc = execute(qp, cq, send, timeout); !wc) return failed("SEND", wc.error());
  steps.ok("SEND of " + std::to_string(kHello.size()) + " bytes");

  // RDMA WRITE: we choose where it lands, inside the region the rkey opens.
  // The server's CPU takes no part and sees no completion.
  for (size_t i = 0; i < sizeof buf.data; ++i) buf.data[i] = pattern(i);
  rdma::Sge data_sge = sge_of(buf.data, sizeof buf.data);
  rdma::SendWr write;
  write.wr_id = 2;
  write.opcode = rdma::WrOpcode::kRdmaWrite;
  write.sgl = {&data_sge, 1};
  write.remote_addr = remote_data;
  write.rkey = peer.rkey;
  if (auto wc = execute(qp, cq, write, timeout); !wc) return failed("RDMA_WRITE", wc.error());
  steps.ok("RDMA_WRITE of " + std::to_string(sizeof buf.data) + " bytes to " + hex(remote_data));

  // RDMA READ: fetch the same bytes back into a cleared buffer. Its
  // completion means the data is in our memory, not only on its way.
  std::memset(buf.data, 0, sizeof buf.data);
  rdma::SendWr read = write;
  read.wr_id = 3;
  read.opcode = rdma::WrOpcode::kRdmaRead;
  auto read_wc = execute(qp, cq, read, timeout);
  if (!read_wc) return failed("RDMA_READ", read_wc.error());
  for (size_t i = 0; i < sizeof buf.data; ++i) {
    if (buf.data[i] != pattern(i)) {
      return std::unexpected(Error(EIO, "RDMA_READ: byte " + std::to_string(i) + " is " + hex(buf.data[i]) +
                                            ", the RDMA_WRITE put " + hex(pattern(i))));
    }
  }
  steps.ok("RDMA_READ of " + std::to_string(read_wc->byte_len) + " bytes back, all equal to what was written");

  // RDMA WRITE_WITH_IMM: a WRITE whose last packet also carries a 32-bit
  // immediate, which consumes one of the server's receives and tells its
  // CPU, with a completion, that the data is there.
  for (size_t i = 0; i < sizeof buf.data_with_imm; ++i) buf.data_with_imm[i] = imm_pattern(i);
  rdma::Sge imm_sge = sge_of(buf.data_with_imm, sizeof buf.data_with_imm);
  rdma::SendWr write_imm;
  write_imm.wr_id = 4;
  write_imm.opcode = rdma::WrOpcode::kRdmaWriteWithImm;
  write_imm.sgl = {&imm_sge, 1};
  write_imm.remote_addr = peer.addr + offsetof(Buffer, data_with_imm);
  write_imm.rkey = peer.rkey;
  write_imm.imm_data = kImm;
  if (auto wc = execute(qp, cq, write_imm, timeout); !wc) return failed("RDMA_WRITE_WITH_IMM", wc.error());
  steps.ok("RDMA_WRITE_WITH_IMM of " + std::to_string(sizeof buf.data_with_imm) + " bytes, immediate " + hex(kImm));

  // Atomics operate on 8 aligned bytes of the peer's memory and return the
  // value they found into an 8-byte SGE of ours.
  rdma::Sge fetched_sge = sge_of(&buf.fetched, sizeof buf.fetched);
  rdma::SendWr add;
  add.wr_id = 5;
  add.opcode = rdma::WrOpcode::kAtomicFetchAndAdd;
  add.sgl = {&fetched_sge, 1};
  add.remote_addr = remote_counter;
  add.rkey = peer.rkey;
  add.compare_add = 1;
  if (auto wc = execute(qp, cq, add, timeout); !wc) return failed("FETCH_AND_ADD", wc.error());
  if (buf.fetched != kInitialCounter) {
    return std::unexpected(Error(EIO, "FETCH_AND_ADD returned " + std::to_string(buf.fetched) + ", expected " +
                                          std::to_string(kInitialCounter)));
  }
  steps.ok("FETCH_AND_ADD 1: the counter was " + std::to_string(buf.fetched));

  // CMP_AND_SWP stores `swap` only if the counter still equals
  // `compare_add`; the value returned tells whether it did.
  rdma::SendWr cas = add;
  cas.wr_id = 6;
  cas.opcode = rdma::WrOpcode::kAtomicCmpAndSwp;
  cas.compare_add = kInitialCounter + 1;
  cas.swap = kSwapped;
  if (auto wc = execute(qp, cq, cas, timeout); !wc) return failed("CMP_AND_SWP", wc.error());
  if (buf.fetched != kInitialCounter + 1) {
    return std::unexpected(Error(EIO, "CMP_AND_SWP found " + std::to_string(buf.fetched) + ", expected " +
                                          std::to_string(kInitialCounter + 1) + " (so nothing was swapped)"));
  }
  steps.ok("CMP_AND_SWP " + std::to_string(cas.compare_add) + " -> " + std::to_string(kSwapped) + ": swapped");
  return {};
}

// The server's side: it receives the SEND and the WRITE_WITH_IMM's
// immediate, then waits for the client to say it is done and checks what
// the one-sided operations left in its memory.
Status run_server_steps(rdma::CompletionQueue& cq, const Buffer& buf, exchange::TcpChannel& channel,
                        milliseconds timeout, Steps& steps) {
  auto wc = next_completion(cq, timeout);
  if (!wc) return failed("receiving the SEND", wc.error());
  std::string_view got(buf.message, wc->byte_len);
  if (wc->opcode != rdma::WcOpcode::kRecv || got != kHello) {
    return std::unexpected(
        Error(EIO, "received \"" + std::string(got) + "\", expected \"" + std::string(kHello) + "\""));
  }
  steps.ok("RECV of " + std::to_string(wc->byte_len) + " bytes: \"" + std::string(got) + "\"");

  // The WRITE_WITH_IMM's immediate takes the second receive. Its completion
  // says the whole write has landed, so the data can be checked now.
  wc = next_completion(cq, timeout);
  if (!wc) return failed("receiving the RDMA_WRITE_WITH_IMM", wc.error());
  if (wc->opcode != rdma::WcOpcode::kRecvRdmaWithImm || !(wc->wc_flags & rdma::kWcWithImm)) {
    return std::unexpected(Error(EIO, std::string("RDMA_WRITE_WITH_IMM: a ") + rdma::wc_opcode_name(wc->opcode) +
                                          " completion with wc_flags " + hex(wc->wc_flags) +
                                          ", expected RECV_RDMA_WITH_IMM with kWcWithImm"));
  }
  if (wc->imm_data != kImm || wc->byte_len != sizeof buf.data_with_imm) {
    return std::unexpected(Error(EIO, "RDMA_WRITE_WITH_IMM: immediate " + hex(wc->imm_data) + " and length " +
                                          std::to_string(wc->byte_len) + ", expected " + hex(kImm) + " and " +
                                          std::to_string(sizeof buf.data_with_imm)));
  }
  for (size_t i = 0; i < sizeof buf.data_with_imm; ++i) {
    if (buf.data_with_imm[i] != imm_pattern(i)) {
      return std::unexpected(Error(EIO, "RDMA_WRITE_WITH_IMM: byte " + std::to_string(i) + " is " +
                                            hex(buf.data_with_imm[i]) + ", expected " + hex(imm_pattern(i))));
    }
  }
  steps.ok("RECV_RDMA_WITH_IMM: immediate " + hex(wc->imm_data) + ", the " + std::to_string(wc->byte_len) +
           " bytes written are in our buffer");

  // WRITE, READ and the atomics leave no completion here, so the client
  // tells us over TCP when they have completed at its end. Meanwhile the
  // progress thread answers them.
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

  // A progress thread answers the peer (ACKs, READ responses, atomics) even
  // while this thread blocks in TCP calls; without one, progress happens
  // only inside poll/wait/post calls.
  auto device = rdma::Device::open(opt.device, {.ip = opt.ip, .params = opt.params, .progress_thread = true});
  if (!device) return failed("opening " + opt.device, device.error());
  rdma::Device& dev = **device;

  auto pd = dev.alloc_pd();
  if (!pd) return failed("allocating a protection domain", pd.error());

  // The memory is the application's; ufab checks every remote access
  // against the region's rights and bounds before touching it. Remote
  // write and atomics require local write, as in verbs.
  auto buf = std::make_unique<Buffer>();
  buf->counter = kInitialCounter;
  auto mr = pd->register_mr(buf.get(), sizeof(Buffer),
                            rdma::kLocalWrite | rdma::kRemoteWrite | rdma::kRemoteRead | rdma::kRemoteAtomic);
  if (!mr) return failed("registering " + std::to_string(sizeof(Buffer)) + " bytes", mr.error());

  // One CQ for both queues, deep enough for every request they can hold,
  // so it cannot overflow (an overflow puts the QPs in ERROR).
  auto cq = dev.create_cq(32);
  if (!cq) return failed("creating a completion queue", cq.error());
  auto qp = pd->create_qp({.type = rdma::QpType::kRc,
                           .send_cq = cq->get(),
                           .recv_cq = cq->get(),
                           .caps = {.max_send_wr = 16, .max_recv_wr = 16}});
  if (!qp) return failed("creating a queue pair", qp.error());

  // What the peer needs: our QP's address, number and first PSN, plus the
  // buffer its one-sided operations may target.
  rdma::ConnectionData local = (*qp)->local();
  local.addr = reinterpret_cast<uint64_t>(mr->addr());
  local.rkey = mr->rkey();
  local.length = static_cast<uint32_t>(mr->length());
  auto line = exchange::encode_connection_line(local);
  if (!line) return failed("encoding our connection data", line.error());

  // The exchange, with the server reading first as ibv_rc_pingpong's does:
  // it connects its QP before it answers, so the client's first packet
  // never reaches a QP that is not ready for it. The connection then stays
  // open for the client's final "done".
  Result<exchange::TcpChannel> channel = std::unexpected(Error(ENOTCONN, "not connected"));
  if (opt.server) {
    auto listener = exchange::TcpChannel::listen(opt.port);
    if (!listener) return failed("listening on TCP port " + std::to_string(opt.port), listener.error());
    std::printf("rdma_example: server %s at %s, QP %s, listening on TCP port %u\n", dev.name().c_str(), opt.ip.empty() ? dev.provider().c_str() : opt.ip.c_str(),
                hex((*qp)->qp_num()).c_str(), listener->port());
    channel = listener->accept(opt.timeout);
    if (!channel) return failed("waiting for the client", channel.error());
  } else {
    channel = exchange::TcpChannel::connect(opt.host, opt.port, opt.timeout);
    if (!channel) return std::unexpected(channel.error());  // it names the address and what to check
    if (auto sent = channel->send_all(*line, opt.timeout); !sent) {
      return failed("sending our connection data", sent.error());
    }
  }
  auto peer_line = channel->recv_line(exchange::kConnectionLineMax, opt.timeout);
  if (!peer_line) return failed("reading the peer's connection data", peer_line.error());
  auto decoded = exchange::decode_connection_line(*peer_line);
  if (!decoded) return failed("the peer's connection data", decoded.error());
  const rdma::ConnectionData peer = *decoded;

  // RESET -> INIT -> RTR -> RTS in one call. The peer's WRITE, READ and
  // atomics need the QP's consent (verbs' qp_access_flags) as well as the
  // region's, and QpAttr grants none by default. Timeouts, retries and the
  // MTU keep QpAttr's defaults.
  rdma::QpAttr tuning;
  tuning.access_flags = rdma::kRemoteWrite | rdma::kRemoteRead | rdma::kRemoteAtomic;
  if (auto connected = (*qp)->connect(peer, tuning); !connected) {
    return failed("connecting the queue pair", connected.error());
  }
  if (opt.server) {
    // Receives can be posted from INIT on, and must be before the peer
    // sends: an RC SEND that finds no receive is refused (RNR NAK) and
    // retried, which costs time. The client cannot send before it has our
    // answer.
    rdma::Sge recv_sge = mr->sge(offsetof(Buffer, message), sizeof buf->message);
    if (auto posted = (*qp)->post_recv({.wr_id = 100, .sgl = {&recv_sge, 1}}); !posted) {
      return failed("posting a receive", posted.error());
    }
    // The WRITE_WITH_IMM's immediate needs a receive too, but no buffer:
    // its data goes where the client points.
    if (auto posted = (*qp)->post_recv({.wr_id = 101}); !posted) return failed("posting a receive", posted.error());
    if (auto sent = channel->send_all(*line, opt.timeout); !sent) return failed("answering the client", sent.error());
  }
  steps.ok("QP " + hex((*qp)->qp_num()) + " connected to QP " + hex(peer.qpn) + " at " + dotted(peer.ip) +
           " (path MTU " + std::to_string((*qp)->attr().path_mtu) + ")");

  if (opt.server) {
    if (auto s = run_server_steps(**cq, *buf, *channel, opt.timeout, steps); !s) return s;
  } else {
    if (auto s = run_client_steps(**qp, **cq, *buf, *mr, peer, opt.timeout, steps); !s) return s;
    // Every request has completed, so the server has answered them all and
    // may check its memory and go away.
    if (auto sent = channel->send_all("done\n", opt.timeout); !sent) return failed("telling the server", sent.error());
  }
  steps.summary();
  // Locals go in reverse: the TCP channel, QP, CQ, the region (before the
  // buffer it covers), buffer, PD and device, whose transport then stops
  // its progress thread and closes the NIC.
  return {};
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "rdma_example: %s\n(run `rdma_example --help` for usage)\n", message.c_str());
  return 2;
}

bool parse_port(std::string_view text, uint16_t* port) {
  if (text.empty() || text.size() > 5) return false;
  unsigned value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return false;
  *port = static_cast<uint16_t>(value);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe or file as they happen
  Options opt;
  bool listen = false, connect = false;
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
    } else if (arg == "--ip") {
      opt.ip = value;
    } else if (arg == "--listen") {
      if (!parse_port(value, &opt.port)) return usage_error("--listen " + value + ": expected a TCP port, 0-65535");
      listen = true;
    } else if (arg == "--connect") {
      size_t colon = value.rfind(':');
      if (colon == std::string::npos || colon == 0 || !parse_port(value.substr(colon + 1), &opt.port) ||
          opt.port == 0) {
        return usage_error("--connect " + value + ": expected HOST:PORT, e.g. 127.0.0.1:18515");
      }
      opt.host = value.substr(0, colon);
      connect = true;
    } else if (arg == "--param") {
      size_t eq = value.find('=');
      if (eq == std::string::npos || eq == 0) return usage_error("--param " + value + ": expected KEY=VALUE");
      opt.params[value.substr(0, eq)] = value.substr(eq + 1);
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
  if (opt.device.empty()) return usage_error("--device is required");
  if (listen == connect) {
    return usage_error("give exactly one of --listen PORT (server) and --connect HOST:PORT (client)");
  }
  opt.server = listen;

  if (auto s = run(opt); !s) {
    std::fprintf(stderr, "rdma_example: %s\n", s.error().message().c_str());
    return 1;
  }
  return 0;
}
