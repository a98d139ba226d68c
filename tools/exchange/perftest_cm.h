// perftest's -R (--rdma_cm) over ufab's connection manager (<ufab/cm.hpp>):
// the control connection that carries perftest's exchange, and the test
// QPs, connected the way perftest 6.06 (Debian's 4.5-0.17) connects them
// (perftest_communication.c: rdma_client_connect, rdma_server_connect,
// create_rdma_cm_connection, rdma_cm_disconnect_nodes).
//
// Both connections go to the same rdma_cm port (18515 unless -p), in turn:
//   1. the control connection: one RC QP, SENDs of at most 56 bytes, one
//      56-byte receive posted at all times (PerftestLink below);
//   2. after one key exchange over it, the test QPs, one connection each;
//      then another key exchange. READ and atomic tests ask for out_reads
//      responder resources and initiator depth; perftest asks for 0 in the
//      others, which ufab_cm_conn_param cannot say (0 means its default),
//      so ufab asks for 1;
//   3. at the end the test QPs are disconnected (DREQ/DREP); the control
//      connection goes with the process (ufab: DREQ when it closes).
// Where ufab differs, so as not to race: its server listens from the start
// until it has every test QP (perftest's server listens again only after
// the key exchange, so a client may hear "nobody listens" first; both
// clients, perftest's and ufab's, then try again). ufab's client keeps
// trying a port where nobody listens (REJ 8) every 100 ms until its
// timeout, as its TCP client does while refused.
//
// Every wait is bounded by the timeout given to open(); every failure says
// what was sent and what came back. Progress: the caller drives the
// device's (a progress thread, say) while these calls block; the
// connection manager's own thread answers CM messages meanwhile.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "tools/exchange/perftest.h"
#include "ufab/cm.hpp"
#include "ufab/rdma.hpp"

namespace ufab::exchange {

class PerftestCm {
 public:
  // The device's connection manager (it takes QP 1) and the control
  // connection's QP, in INIT with its receive posted.
  static Result<std::unique_ptr<PerftestCm>> open(rdma::Device& dev, uint16_t port, std::chrono::milliseconds timeout);
  ~PerftestCm();
  PerftestCm(const PerftestCm&) = delete;
  PerftestCm& operator=(const PerftestCm&) = delete;

  // Server: listens on the port and accepts the first connection as the
  // control connection (the listener stays for accept_qps).
  Result<std::unique_ptr<PerftestLink>> accept_control();
  // Client: connects the control connection to server_ip (host order).
  Result<std::unique_ptr<PerftestLink>> connect_control(uint32_t server_ip);

  // The test QPs (RC, in INIT, receives posted or not), one connection
  // each, in order. `depth`: responder resources and initiator depth to
  // ask for (out_reads for READ and atomics, else 1).
  Status connect_qps(std::span<rdma::QueuePair* const> qps, uint32_t server_ip, uint8_t depth);
  // Server: the next qps.size() connection requests, accepted in order;
  // then the listener closes.
  Status accept_qps(std::span<rdma::QueuePair* const> qps, uint8_t depth);
  // Disconnects every test QP not disconnected yet (DREQ) and waits until
  // each has ended (the peer's DREP or its own DREQ).
  Status disconnect_qps();

  // For PerftestLink: one message over the control connection.
  Status send_control(std::span<const uint8_t> block, std::chrono::milliseconds timeout);
  Status recv_control(std::span<uint8_t> block, std::chrono::milliseconds timeout);
  const std::string& peer() const { return peer_; }
  // Warnings to show (a DREQ the peer never answered, say); cleared.
  std::vector<std::string> take_warnings() { return std::exchange(warnings_, {}); }

 private:
  using Clock = std::chrono::steady_clock;
  PerftestCm(rdma::Device& dev, uint16_t port, std::chrono::milliseconds timeout)
      : dev_(dev), port_(port), timeout_(timeout) {}
  Status setup();

  // Events: what a wait does not want is kept (in order) for a later one;
  // DISCONNECTED marks its connection; a connection request that comes
  // while none is expected is rejected.
  Result<cm::Event> wait_event(const std::function<bool(const cm::Event&)>& want, Clock::time_point deadline,
                               const std::string& waiting_for);
  void route(cm::Event ev);
  void pump();  // routes what has come, without waiting
  std::string where(uint32_t ip) const;
  // Connects `qp`, trying again while the peer's CM says nobody listens.
  Result<cm::Id> connect_one(rdma::QueuePair& qp, uint32_t ip, uint8_t depth, const std::string& what);
  Status wait_control(rdma::CompletionQueue& cq, rdma::WorkCompletion& wc, std::chrono::milliseconds timeout,
                      const std::string& what);

  rdma::Device& dev_;
  uint16_t port_;
  std::chrono::milliseconds timeout_;
  std::string peer_;
  // Declared in the order they are made; they go in reverse: ids before
  // the connection manager, the manager (its thread) before the QPs it
  // was given.
  std::optional<rdma::ProtectionDomain> pd_;
  std::vector<uint8_t> buffer_;  // the receive slot, then the send slot
  std::optional<rdma::MemoryRegion> mr_;
  std::unique_ptr<rdma::CompletionQueue> send_cq_, recv_cq_;
  std::unique_ptr<rdma::QueuePair> control_qp_;
  std::unique_ptr<cm::ConnectionManager> cm_;
  std::optional<cm::Listener> listener_;
  cm::Id control_;
  bool control_down_ = false;
  int control_down_status_ = 0;
  struct Test {
    cm::Id id;
    bool disconnected = false;
  };
  std::vector<Test> tests_;
  bool accepting_ = false;
  std::deque<cm::Event> pending_;
  std::vector<std::string> warnings_;
};

// The control connection as the exchange sees it (binary keys, no "done").
class CmPerftestLink final : public PerftestLink {
 public:
  explicit CmPerftestLink(PerftestCm& cm) : cm_(cm) {}
  Status send_block(std::span<const uint8_t> block, std::chrono::milliseconds timeout) override {
    return cm_.send_control(block, timeout);
  }
  Status recv_block(std::span<uint8_t> block, std::chrono::milliseconds timeout) override {
    return cm_.recv_control(block, timeout);
  }
  const std::string& peer() const override { return cm_.peer(); }
  bool rdma_cm() const override { return true; }

 private:
  PerftestCm& cm_;
};

}  // namespace ufab::exchange
