// perftest's latency tests (write_lat.c, read_lat.c, send_lat.c,
// atomic_lat.c and run_iter_lat* in perftest_resources.c): the same TCP
// handshakes, in the same places, the same loop on the wire.
//
//   write-lat: both sides write `size` bytes to each other, ping-pong; the
//     last byte carries the iteration number (mod 256) and its arrival is
//     what the other side waits for. The server writes first.
//   send-lat: the same with SEND/RECV; the client sends first. Receives are
//     posted, and the sides synchronised by a handshake, before each size.
//   read-lat, atomic-lat: only the client works, one READ (FETCH_AND_ADD 1
//     or CMP_AND_SWP 0/0) at a time; the server waits in the closing
//     handshake, answering the client's requests meanwhile.
//   flush-lat (ufab's, not perftest's): as read-lat, one FLUSH of `size`
//     bytes (RANGE) of the server's buffer at a time.
//   write-lat --flush: every WRITE is followed by a FLUSH of its range
//     (one doorbell); an iteration's send completes with the FLUSH. With
//     persistent, a commit-complete WRITE (kSendCommit): the same wire.
// Nothing of the test (size, count, -a, -D) is exchanged: both sides must
// be given the same options, as with perftest.
#include <cstdio>
#include <string>
#include <vector>

#include "tools/ufab/perf/session.h"
#include "tools/ufab/perf/stats.h"

namespace ufab::cli::perf {
namespace {

using std::chrono::milliseconds;

const char* verb_title(const Config& cfg) {
  switch (cfg.verb) {
    case Verb::kSend: return "Send Latency Test";
    case Verb::kWrite: return "RDMA_Write Latency Test";
    case Verb::kRead: return "RDMA_Read Latency Test";
    case Verb::kAtomic: return cfg.cmp_and_swap ? "Atomic CMP_AND_SWAP Latency Test" : "Atomic FETCH_AND_ADD Latency Test";
    case Verb::kFlush: return "RDMA_Flush Latency Test";
  }
  return "";
}

// write and send measure round trips and report half; read and atomic
// measure one operation.
int round_trips(Verb verb) { return verb == Verb::kWrite || verb == Verb::kSend ? 2 : 1; }

class LatencyTest {
 public:
  LatencyTest(Session& s, const Progress& progress) : s_(s), cfg_(s.config()), ticker_(progress) {}

  Result<LatencyResult> run(uint64_t size) {
    size_ = size;
    posted_.clear();
    if (!cfg_.duration_s) posted_.reserve(cfg_.iters);
    clock_.reset();
    if (cfg_.duration_s) clock_.emplace(cfg_.duration_s);
    Status st;
    switch (cfg_.verb) {
      case Verb::kWrite: st = write_loop(); break;
      case Verb::kSend: st = send_loop(); break;
      default: st = request_loop(); break;
    }
    if (!st) return std::unexpected(st.error());
    if (clock_) return latency_from_duration(counted_, clock_->sample_ns(), size, round_trips(cfg_.verb));
    return latency_from_posts(posted_, size, round_trips(cfg_.verb));
  }

  Status post_receives(uint64_t size) {
    rdma::Sge sge = s_.mr().sge(s_.remote_area(0) - static_cast<uint8_t*>(s_.mr().addr()), uint32_t(size));
    for (uint32_t i = 0; i < cfg_.rx_depth; ++i) {
      if (auto r = s_.qp(0).post_recv({.wr_id = 0, .sgl = {&sge, 1}}); !r) {
        return std::unexpected(r.error().context("posting receive " + std::to_string(i + 1)));
      }
    }
    return {};
  }

 private:
  bool ended() { return clock_ && clock_->state() == DurationClock::State::kEnd; }
  void count_completion() {
    if (clock_ && clock_->state() == DurationClock::State::kSample) ++counted_;
  }
  std::string where(uint64_t done) const {
    return "iteration " + std::to_string(done + 1) + (clock_ ? "" : " of " + std::to_string(cfg_.iters)) + " at " +
           std::to_string(size_) + " bytes";
  }
  void tick(uint64_t done) {
    ticker_.tick([&] {
      char line[160];
      std::snprintf(line, sizeof line, "%s %llu B: %llu iterations%s, %.0f s", cfg_.test.c_str(),
                    static_cast<unsigned long long>(size_), static_cast<unsigned long long>(done),
                    clock_ ? "" : (" of " + std::to_string(cfg_.iters)).c_str(), ticker_.seconds());
      return std::string(line);
    });
  }

  Status post(rdma::WrOpcode opcode, bool signaled) {
    if (opcode == rdma::WrOpcode::kFlush) return s_.qp(0).post_send(flush_wr(signaled));
    rdma::Sge sge = s_.mr().sge(s_.local_area(0) - static_cast<uint8_t*>(s_.mr().addr()),
                                uint32_t(cfg_.verb == Verb::kAtomic ? 8 : size_));
    rdma::SendWr wr;
    wr.opcode = opcode;
    wr.flags = signaled ? rdma::kSendSignaled : 0;
    if ((opcode == rdma::WrOpcode::kRdmaWrite || opcode == rdma::WrOpcode::kSend) && size_ <= cfg_.inline_size) {
      wr.flags |= rdma::kSendInline;
    }
    wr.sgl = {&sge, 1};
    wr.remote_addr = s_.remote(0).vaddr;
    wr.rkey = s_.remote(0).rkey;
    wr.compare_add = cfg_.cmp_and_swap ? 0 : 1;  // perftest: FETCH_AND_ADD 1; CMP_AND_SWP 0 -> 0
    wr.swap = 0;
    if (cfg_.flush_type == rdma::kFlushTypePersistent && opcode == rdma::WrOpcode::kRdmaWrite) {
      // --flush persistent: a commit-complete WRITE, which is the WRITE and
      // a FLUSH PERSISTENT of its range on the wire, one completion.
      wr.flags |= rdma::kSendCommit;
      return s_.qp(0).post_send(wr);
    }
    if (cfg_.flush_type != 0 && opcode == rdma::WrOpcode::kRdmaWrite) {
      // --flush global: the WRITE unsignaled, a FLUSH of its range behind
      // it, one doorbell; the FLUSH's completion says the WRITE is placed.
      wr.flags &= ~rdma::kSendSignaled;
      rdma::SendWr pair[2] = {wr, flush_wr(signaled)};
      return s_.qp(0).post_send(std::span<const rdma::SendWr>(pair, 2));
    }
    return s_.qp(0).post_send(wr);
  }

  // A FLUSH of the message's range at the peer's buffer.
  rdma::SendWr flush_wr(bool signaled) const {
    rdma::SendWr f;
    f.opcode = rdma::WrOpcode::kFlush;
    f.flags = signaled ? rdma::kSendSignaled : 0;
    f.remote_addr = s_.remote(0).vaddr;
    f.rkey = s_.remote(0).rkey;
    f.flush_type = cfg_.flush_type;
    f.flush_level = rdma::kFlushRange;
    f.flush_length = size_;
    return f;
  }

  // run_iter_lat_write.
  Status write_loop() {
    const uint64_t iters = cfg_.iters;
    uint8_t* post_byte = s_.local_area(0) + size_ - 1;
    const uint8_t* poll_byte = s_.remote_area(0) + size_ - 1;
    uint64_t scnt = 0, ccnt = 0, rcnt = 0;
    auto more = [&](uint64_t n) { return clock_ ? !ended() : n < iters; };
    while (more(scnt) || more(ccnt) || more(rcnt)) {
      if (more(rcnt) && !(scnt < 1 && cfg_.server())) {
        ++rcnt;
        if (auto w = s_.wait_byte(poll_byte, uint8_t(rcnt), "the peer's write " + where(rcnt - 1),
                                  [&] { return ended(); });
            !w) {
          return w;
        }
      }
      if (more(scnt)) {
        if (!clock_) posted_.push_back(now_ns());
        *post_byte = uint8_t(++scnt);
        if (auto p = post(rdma::WrOpcode::kRdmaWrite, true); !p) return p;
      }
      if (ended()) break;
      if (more(ccnt)) {
        auto wc = s_.wait_completion(s_.send_cq(), std::string(cfg_.flush_type ? "the FLUSH behind our RDMA WRITE "
                                                                                   : "our RDMA WRITE ") +
                                                         where(ccnt));
        if (!wc) return std::unexpected(wc.error());
        ++ccnt;
        count_completion();
      }
      tick(ccnt);
    }
    return {};
  }

  // run_iter_lat_send.
  Status send_loop() {
    const uint64_t iters = cfg_.iters;
    uint64_t scnt = 0, rcnt = 0;
    auto more = [&](uint64_t n) { return clock_ ? !ended() : n < iters; };
    rdma::Sge rsge = s_.mr().sge(s_.remote_area(0) - static_cast<uint8_t*>(s_.mr().addr()), uint32_t(size_));
    while (more(scnt) || more(rcnt)) {
      if (more(rcnt) && !(scnt < 1 && !cfg_.server())) {
        auto wc = s_.wait_completion(s_.recv_cq(), "the peer's SEND " + where(rcnt), [&] { return ended(); });
        if (!wc) return std::unexpected(wc.error());
        if (!*wc) break;  // -D ended while waiting
        // perftest's send-lat starts -D's clock at the first receive.
        if (clock_ && rcnt == 0) clock_.emplace(cfg_.duration_s);
        ++rcnt;
        count_completion();
        if (clock_ || rcnt + cfg_.rx_depth <= iters) {
          if (auto r = s_.qp(0).post_recv({.wr_id = 0, .sgl = {&rsge, 1}}); !r) return r;
        }
      }
      if (more(scnt)) {
        if (!clock_) posted_.push_back(now_ns());
        ++scnt;
        const bool signaled = scnt % cfg_.cq_mod == 0 || (!clock_ && scnt == iters);
        if (auto p = post(rdma::WrOpcode::kSend, signaled); !p) return p;
        if (signaled) {
          auto wc = s_.wait_completion(s_.send_cq(), "our SEND " + where(scnt - 1));
          if (!wc) return std::unexpected(wc.error());
        }
      }
      if (ended()) break;
      tick(rcnt);
    }
    return {};
  }

  // run_iter_lat: one READ, atomic or FLUSH at a time (client only).
  Status request_loop() {
    const rdma::WrOpcode op = cfg_.verb == Verb::kRead    ? rdma::WrOpcode::kRdmaRead
                              : cfg_.verb == Verb::kFlush ? rdma::WrOpcode::kFlush
                              : cfg_.cmp_and_swap         ? rdma::WrOpcode::kAtomicCmpAndSwp
                                                          : rdma::WrOpcode::kAtomicFetchAndAdd;
    const char* name = cfg_.verb == Verb::kRead ? "our RDMA READ " : cfg_.verb == Verb::kFlush ? "our FLUSH " : "our atomic ";
    for (uint64_t scnt = 0; clock_ ? !ended() : scnt < cfg_.iters; ++scnt) {
      if (!clock_) posted_.push_back(now_ns());
      if (auto p = post(op, true); !p) return p;
      auto wc = s_.wait_completion(s_.send_cq(), name + where(scnt));
      if (!wc) return std::unexpected(wc.error());
      count_completion();
      tick(scnt + 1);
    }
    return {};
  }

  Session& s_;
  const Config& cfg_;
  Ticker ticker_;
  std::optional<DurationClock> clock_;
  std::vector<int64_t> posted_;
  uint64_t size_ = 0, counted_ = 0;
};

}  // namespace

Status run_latency(Session& s, const Progress& progress, const LatencyReport& report) {
  const Config& cfg = s.config();
  const bool send = cfg.verb == Verb::kSend;
  s.print_banner(verb_title(cfg));
  // Handshakes where perftest's mains have them: write/read/atomic swap
  // QP 0's keys, then every QP's, connect, every QP's again (printing), and
  // QP 0's once both are in RTR; send swaps every QP's, connects, swaps QP
  // 0's, then every QP's (printing).
  if (!send) {
    if (auto r = s.swap_keys(true); !r) return r;
  }
  if (auto r = s.swap_keys(); !r) return r;
  if (auto r = s.connect(); !r) return r;
  if (send) {
    if (auto r = s.swap_keys(true); !r) return r;
  }
  s.print_addresses(false);
  if (auto r = s.swap_keys(); !r) return r;
  s.print_addresses(true);
  if (!send) {
    if (auto r = s.swap_keys(true); !r) return r;
  }

  const bool measures = send || cfg.verb == Verb::kWrite || !cfg.server();
  if (measures) {
    s.print_rule();
    std::fputs(cfg.duration_s ? " #bytes        #iterations       t_avg[usec]    tps average\n"
                              : " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
                                "t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n",
               s.out());
  }
  if (!measures) {
    // read-lat / atomic-lat server: answer the client until it closes.
    if (auto r = s.close(); !r) return r;
    s.print_rule();
    return {};
  }

  LatencyTest test(s, progress);
  for (uint64_t size : test_sizes(cfg)) {
    if (send) {
      // Receives for this size, then a handshake so the client does not
      // send before the server's receives are posted.
      if (auto r = test.post_receives(size); !r) return r;
      if (auto r = s.swap_keys(true); !r) return r;
    }
    auto result = test.run(size);
    if (!result) return std::unexpected(result.error());
    report(*result);
  }
  if (send) s.print_rule();
  if (cfg.verb != Verb::kWrite) {
    if (auto r = s.close(); !r) return r;
  }
  // Our last message's peer may still need our ACK of its last one.
  s.linger(milliseconds(250));
  if (!send) s.print_rule();
  return {};
}

}  // namespace ufab::cli::perf
