// perftest's bandwidth tests (write_bw.c, read_bw.c, send_bw.c,
// atomic_bw.c; run_iter_bw and run_iter_bw_server in perftest_resources.c),
// unidirectional, with the same handshakes in the same places.
//
//   write-bw, read-bw, atomic-bw: the client keeps up to tx_depth requests
//     in flight per QP, round-robin over the QPs, asking for a completion
//     every cq_mod-th; successive requests move through the cycle buffer
//     (4 KiB) when the message fits its half. The server does nothing but
//     answer; it learns the end from the client's handshake, then receives
//     and prints the client's report.
//   write-bw --flush: each message is a WRITE and a FLUSH of its range
//     behind it (the pair counts as one request of the window; the FLUSH
//     carries the signal); a message is done when its FLUSH completes.
//     persistent posts commit-complete WRITEs (kSendCommit), the same wire.
//   send-bw: the server posts rx_depth receives per QP, a handshake says so,
//     the client sends; both print their own figures. With -a the sides
//     meet again after every size.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/ufab/perf/session.h"
#include "tools/ufab/perf/stats.h"

namespace ufab::cli::perf {
namespace {

using std::chrono::milliseconds;

std::string title(const Config& cfg) {
  switch (cfg.verb) {
    case Verb::kSend: return "Send BW Test";
    case Verb::kWrite: return "RDMA_Write BW Test";
    case Verb::kRead: return "RDMA_Read BW Test";
    case Verb::kAtomic: return cfg.cmp_and_swap ? "Atomic CMP_AND_SWAP BW Test" : "Atomic FETCH_AND_ADD BW Test";
    case Verb::kFlush: break;  // flush-lat only
  }
  return "";
}

uint64_t inc(uint64_t size) { return size > kCacheLine ? (size + kCacheLine - 1) / kCacheLine * kCacheLine : kCacheLine; }

// Where successive messages of `msg` bytes go in a QP's area: slot k % slots
// at offset (k % slots) * inc(msg), when two fit in the cycle buffer.
uint64_t slot_count(uint64_t msg) { return msg <= kCycleBuffer / 2 ? kCycleBuffer / inc(msg) : 1; }

// --data_validation. The source (the client of write-bw and send-bw, the
// server of read-bw) fills every message slot of its areas with
// pattern_byte(qp, j) for byte j of the message; the target starts its
// areas poisoned and, after the run, checks each slot a message landed in:
// every slot the run wrote (WRITE, READ), or the first (SEND: receives
// land at the area's start).
uint8_t pattern_byte(uint32_t qp, uint64_t j) { return uint8_t(j * 151 + (j >> 8) * 13 + (j >> 16) * 7 + qp * 29 + 0x3b); }
constexpr uint8_t kPoison = 0xa5;

bool validation_source(const Config& cfg) { return (cfg.verb == Verb::kRead) == cfg.server(); }
// The server's remote area (the target of WRITE and SEND, the source of
// READ), the client's local one.
uint8_t* validation_area(Session& s, uint32_t q) { return s.config().server() ? s.remote_area(q) : s.local_area(q); }

Status prepare_validation(Session& s) {
  const Config& cfg = s.config();
  const uint64_t msg = cfg.size, slots = slot_count(msg);
  std::vector<uint8_t> bytes(s.area(), kPoison);
  for (uint32_t q = 0; q < cfg.qps; ++q) {
    if (validation_source(cfg)) {
      for (uint64_t k = 0; k < slots; ++k) {
        for (uint64_t j = 0; j < msg; ++j) bytes[k * inc(msg) + j] = pattern_byte(q, j);
      }
    }
    uint8_t* area = validation_area(s, q);
    if (auto w = s.store(s.offset_of(area), bytes.data(), bytes.size()); !w) {
      return std::unexpected(w.error().context("--data_validation: preparing QP " + std::to_string(q) + "'s area"));
    }
  }
  return {};
}

Status check_validation(Session& s) {
  const Config& cfg = s.config();
  const uint64_t msg = cfg.size;
  const uint64_t slots = cfg.verb == Verb::kSend ? 1 : cfg.duration_s ? slot_count(msg)
                                                                       : std::min(slot_count(msg), cfg.iters);
  std::vector<uint8_t> got(msg);
  uint64_t checked = 0;
  for (uint32_t q = 0; q < cfg.qps; ++q) {
    for (uint64_t k = 0; k < slots; ++k) {
      const uint64_t offset = s.offset_of(validation_area(s, q)) + k * inc(msg);
      if (auto r = s.load(offset, got.data(), msg); !r) {
        return std::unexpected(r.error().context("--data_validation: reading QP " + std::to_string(q) + "'s area"));
      }
      uint64_t bad = 0, first = msg;
      for (uint64_t j = 0; j < msg; ++j) {
        if (got[j] != pattern_byte(q, j)) {
          if (bad++ == 0) first = j;
        }
      }
      if (bad != 0) {
        char line[256];
        std::snprintf(line, sizeof line,
                      "--data_validation: QP %u, message slot %llu: %llu of %llu bytes differ, the first at byte %llu "
                      "(expected 0x%02x, found 0x%02x%s)",
                      q, static_cast<unsigned long long>(k), static_cast<unsigned long long>(bad),
                      static_cast<unsigned long long>(msg), static_cast<unsigned long long>(first),
                      pattern_byte(q, first), got[first], got[first] == kPoison ? ": nothing landed there" : "");
        return fail(EIO, std::string(line) + "; both sides must run --data_validation");
      }
      checked += msg;
    }
  }
  s.validated_bytes = checked;
  std::fprintf(s.out(), " Data validation : %llu bytes in %llu message slot(s) on %u QP(s) checked: all as sent\n",
               static_cast<unsigned long long>(checked), static_cast<unsigned long long>(slots * cfg.qps), cfg.qps);
  return {};
}

class BandwidthTest {
 public:
  BandwidthTest(Session& s, const Progress& progress) : s_(s), cfg_(s.config()), ticker_(progress) {}

  // run_iter_bw.
  Result<BandwidthResult> client(uint64_t size) {
    const uint32_t n_qps = cfg_.qps;
    const uint64_t iters = cfg_.iters;
    const uint32_t cq_mod = cfg_.cq_mod;
    std::optional<DurationClock> clock;
    if (cfg_.duration_s) clock.emplace(cfg_.duration_s);
    const bool peak = !clock && iters * n_qps <= 20000;  // perftest's noPeak rules
    const uint64_t total = clock ? 0 : iters * n_qps;
    std::vector<int64_t> posted, completed;
    if (!clock) {
      posted.reserve(total);
      completed.assign(total, 0);
    }
    std::vector<uint64_t> scnt(n_qps, 0), ccnt(n_qps, 0);
    uint64_t totscnt = 0, totccnt = 0, counted = 0;
    uint64_t signaled_posts = 0, completions = 0;
    const uint64_t msg = cfg_.verb == Verb::kAtomic ? 8 : size;
    // Successive requests walk the cycle buffer when two fit in it.
    const uint64_t slots = slot_count(msg);
    const rdma::WrOpcode op = cfg_.verb == Verb::kWrite  ? rdma::WrOpcode::kRdmaWrite
                              : cfg_.verb == Verb::kRead ? rdma::WrOpcode::kRdmaRead
                              : cfg_.verb == Verb::kSend ? rdma::WrOpcode::kSend
                              : cfg_.cmp_and_swap        ? rdma::WrOpcode::kAtomicCmpAndSwp
                                                         : rdma::WrOpcode::kAtomicFetchAndAdd;
    auto ended = [&] { return clock && clock->state() == DurationClock::State::kEnd; };
    std::array<rdma::WorkCompletion, 16> wcs;
    std::vector<rdma::Sge> sges;
    std::vector<rdma::SendWr> wrs;
    // --flush global: a FLUSH work request behind each WRITE; persistent: a
    // commit-complete WRITE (kSendCommit: WRITE and FLUSH PERSISTENT on the
    // wire, one work request, one completion).
    const bool commit = cfg_.flush_type == rdma::kFlushTypePersistent;
    const bool flush = cfg_.flush_type != 0 && !commit;
    const uint64_t per_msg = flush ? 2 : 1;  // work requests per message
    sges.reserve(cfg_.tx_depth);
    wrs.reserve(cfg_.tx_depth * per_msg);
    int64_t last_completion = now_ns();
    while ((clock && !ended()) || totscnt < total || totccnt < total) {
      // Each QP's free window as one list: one doorbell for the lot (perftest
      // posts one at a time; the wire sees the same requests).
      for (uint32_t q = 0; q < n_qps; ++q) {
        sges.clear();
        wrs.clear();
        uint64_t n = 0;  // messages in this list
        while ((clock || scnt[q] + n < iters) && scnt[q] + n - ccnt[q] + 1 <= cfg_.tx_depth) {
          if (ended()) break;
          const uint64_t k = scnt[q] + n;
          const bool signaled = k % cq_mod == cq_mod - 1 || (!clock && k == iters - 1);
          const uint64_t offset = (k % slots) * inc(msg);
          sges.push_back(s_.mr().sge(s_.local_area(q) - static_cast<uint8_t*>(s_.mr().addr()) + offset, uint32_t(msg)));
          rdma::SendWr& wr = wrs.emplace_back();
          wr.wr_id = q;
          wr.opcode = op;
          wr.flags = (signaled && !flush ? rdma::kSendSignaled : 0) | (commit ? rdma::kSendCommit : 0) |
                     (op != rdma::WrOpcode::kRdmaRead && msg <= cfg_.inline_size ? rdma::kSendInline : 0);
          wr.remote_addr = s_.remote(q).vaddr + offset;
          wr.rkey = s_.remote(q).rkey;
          wr.compare_add = cfg_.cmp_and_swap ? 0 : 1;
          if (flush) {
            rdma::SendWr& f = wrs.emplace_back();
            f.wr_id = q;
            f.opcode = rdma::WrOpcode::kFlush;
            f.flags = signaled ? rdma::kSendSignaled : 0;
            f.remote_addr = s_.remote(q).vaddr + offset;
            f.rkey = s_.remote(q).rkey;
            f.flush_type = cfg_.flush_type;
            f.flush_level = rdma::kFlushRange;
            f.flush_length = msg;
          }
          ++n;
          if (!clock) posted.push_back(now_ns());
          signaled_posts += signaled;
        }
        if (wrs.empty()) continue;
        for (size_t i = 0; i < n; ++i) wrs[i * per_msg].sgl = {&sges[i], 1};
        if (auto p = s_.qp(q).post_send(wrs); !p) {
          return std::unexpected(p.error().context("posting requests " + std::to_string(scnt[q] + 1) + ".." +
                                                   std::to_string(scnt[q] + n) + " on QP " + std::to_string(q)));
        }
        scnt[q] += n;
        totscnt += n;
      }
      if (totccnt < total || (clock && totccnt < totscnt)) {
        auto n = s_.send_cq().poll(wcs);
        if (!n) return std::unexpected(n.error());
        if (*n > 0) last_completion = now_ns();
        for (size_t i = 0; i < *n; ++i) {
          const rdma::WorkCompletion& wc = wcs[i];
          ++completions;
          if (wc.status != rdma::WcStatus::kSuccess) {
            return fail(EIO, std::string("completion with error ") + rdma::wc_status_name(wc.status) + " (" +
                                 std::to_string(int(wc.status)) + ") on QP " + std::to_string(wc.wr_id) + " after " +
                                 std::to_string(totccnt) + " completed requests" +
                                 (wc.error.empty() ? "" : ": " + wc.error) + " (" + s_.counters() + ")");
          }
          // A signaled completion stands for its batch; the last batch
          // of a QP may be shorter (perftest counts a whole cq_mod).
          const uint64_t q = wc.wr_id;
          const uint64_t batch = std::min<uint64_t>(cq_mod, (clock ? ~0ull : iters) - ccnt[q]);
          ccnt[q] += batch;
          totccnt += batch;
          if (!clock) completed[totccnt - 1] = now_ns();
          if (clock && clock->state() == DurationClock::State::kSample) counted += batch;
        }
        if (*n == 0 && now_ns() - last_completion > int64_t(cfg_.timeout.count()) * 1'000'000) {
          return fail(ETIMEDOUT, "no completion for " + std::to_string(cfg_.timeout.count() / 1000) + " s after " +
                                     std::to_string(totccnt) + " of " + std::to_string(totscnt) +
                                     " requests completed; is the peer still there? (" + s_.counters() + ")");
        }
      }
      ticker_.tick([&] {
        char line[160];
        std::snprintf(line, sizeof line, "%s %llu B: %llu messages%s, %.0f s", cfg_.test.c_str(),
                      static_cast<unsigned long long>(size), static_cast<unsigned long long>(totccnt),
                      clock ? "" : (" of " + std::to_string(total)).c_str(), ticker_.seconds());
        return std::string(line);
      });
    }
    if (clock) {
      // perftest stops at the end without draining; we let what is in
      // flight finish so the QP is quiet before the handshake.
      if (auto d = drain(signaled_posts - completions); !d) return std::unexpected(d.error());
      return bandwidth_from_duration(counted, clock->sample_ns(), size, cfg_.report_gbits);
    }
    return bandwidth_from_times(posted, completed, size, cq_mod, peak, cfg_.report_gbits);
  }

  // The send-bw server's receives for one size: rx_depth per QP.
  Status post_receives(uint64_t size) {
    for (uint32_t q = 0; q < cfg_.qps; ++q) {
      for (uint32_t i = 0; i < cfg_.rx_depth; ++i) {
        if (auto r = post_receive(q, size); !r) return r;
      }
      posted_[q] = cfg_.rx_depth;
    }
    return {};
  }

  // run_iter_bw_server: counts receives, re-posting up to iters per QP.
  Result<BandwidthResult> server(uint64_t size) {
    const uint64_t total = cfg_.iters * cfg_.qps;
    std::optional<DurationClock> clock;
    std::vector<uint64_t> rcnt(cfg_.qps, 0);
    uint64_t received = 0, counted = 0;
    int64_t first = 0, last_completion = now_ns();
    std::array<rdma::WorkCompletion, 16> wcs;
    auto ended = [&] { return clock && clock->state() == DurationClock::State::kEnd; };
    while (cfg_.duration_s ? !ended() : received < total) {
      auto n = s_.recv_cq().poll(wcs);
      if (!n) return std::unexpected(n.error());
      if (*n > 0) {
        last_completion = now_ns();
        if (first == 0) {
          first = last_completion;  // the clock starts at the first receive
          if (cfg_.duration_s) clock.emplace(cfg_.duration_s);
        }
      } else if (now_ns() - last_completion > int64_t(cfg_.timeout.count()) * 1'000'000) {
        return fail(ETIMEDOUT, "no message for " + std::to_string(cfg_.timeout.count() / 1000) + " s after " +
                                   std::to_string(received) + (cfg_.duration_s ? "" : " of " + std::to_string(total)) +
                                   "; is the client still sending with the same -n and -q? (" + s_.counters() + ")");
      }
      for (size_t i = 0; i < *n; ++i) {
        const rdma::WorkCompletion& wc = wcs[i];
        if (wc.status != rdma::WcStatus::kSuccess) {
          return fail(EIO, std::string("receive completed with error ") + rdma::wc_status_name(wc.status) +
                               (wc.error.empty() ? "" : ": " + wc.error) + " after " + std::to_string(received) +
                               " messages (" + s_.counters() + ")");
        }
        const uint64_t q = wc.wr_id;
        ++rcnt[q];
        ++received;
        if (clock && clock->state() == DurationClock::State::kSample) ++counted;
        if (cfg_.duration_s || posted_[q] + 1 <= cfg_.iters) {
          if (auto r = post_receive(uint32_t(q), size); !r) return std::unexpected(r.error());
          ++posted_[q];
        }
      }
      ticker_.tick([&] {
        char line[160];
        std::snprintf(line, sizeof line, "%s %llu B: %llu messages received%s, %.0f s", cfg_.test.c_str(),
                      static_cast<unsigned long long>(size), static_cast<unsigned long long>(received),
                      cfg_.duration_s ? "" : (" of " + std::to_string(total)).c_str(), ticker_.seconds());
        return std::string(line);
      });
    }
    if (clock) return bandwidth_from_duration(counted, clock->sample_ns(), size, cfg_.report_gbits);
    // perftest's server has no peak: first receive to last.
    return bandwidth_from_duration(total, now_ns() - first, size, cfg_.report_gbits);
  }

 private:
  Status post_receive(uint32_t q, uint64_t size) {
    rdma::Sge sge = s_.mr().sge(s_.remote_area(q) - static_cast<uint8_t*>(s_.mr().addr()), uint32_t(size));
    return s_.qp(q).post_recv({.wr_id = q, .sgl = {&sge, 1}});
  }

  // Waits for the completions of the signaled requests still in flight.
  Status drain(uint64_t expected) {
    std::array<rdma::WorkCompletion, 16> wcs;
    const int64_t deadline = now_ns() + int64_t(cfg_.timeout.count()) * 1'000'000;
    uint64_t seen = 0;
    while (seen < expected && now_ns() < deadline) {
      auto n = s_.send_cq().poll(wcs);
      if (!n) return std::unexpected(n.error());
      seen += *n;
    }
    return {};
  }

  Session& s_;
  const Config& cfg_;
  Ticker ticker_;
  std::vector<uint64_t> posted_ = std::vector<uint64_t>(cfg_.qps, 0);
};

exchange::PerftestBwReport to_wire(const BandwidthResult& r) {
  return {.size = r.size, .iters = r.iters, .bw_peak = r.bw_peak_mb, .bw_avg = r.bw_avg_mb, .msg_rate_avg = r.msg_rate_mpps};
}

BandwidthResult from_wire(const exchange::PerftestBwReport& r) {
  return {.size = r.size, .iters = r.iters, .bw_peak_mb = r.bw_peak, .bw_avg_mb = r.bw_avg, .msg_rate_mpps = r.msg_rate_avg};
}

}  // namespace

Status run_bandwidth(Session& s, const Progress& progress, const BandwidthReport& report) {
  const Config& cfg = s.config();
  const bool send = cfg.verb == Verb::kSend;
  s.print_banner(title(cfg).c_str());
  if (cfg.data_validation) {
    if (auto r = prepare_validation(s); !r) return r;
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
  s.print_rule();
  std::fputs(cfg.report_gbits ? " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
                              : " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n",
             s.out());

  BandwidthTest test(s, progress);
  if (!send && cfg.server()) {
    // Answer the client until its handshake says it is done, then print
    // its report.
    if (auto r = s.swap_keys(true); !r) return r;
    auto theirs = s.swap_bw_report({});
    if (!theirs) return std::unexpected(theirs.error());
    report(from_wire(*theirs));
    // The client's report came after its last completion: the WRITEs
    // have landed (READ: the client checks what it read).
    if (cfg.data_validation && !validation_source(cfg)) {
      if (auto r = check_validation(s); !r) return r;
    }
    if (auto r = s.close(); !r) return r;
    s.print_rule();
    return {};
  }
  BandwidthResult last;
  for (uint64_t size : test_sizes(cfg)) {
    if (send) {
      if (cfg.server()) {
        if (auto r = test.post_receives(size); !r) return r;
      }
      if (auto r = s.swap_keys(true); !r) return r;
    }
    auto mine = cfg.server() ? test.server(size) : test.client(size);
    if (!mine) return std::unexpected(mine.error());
    report(*mine);
    last = *mine;
    // send-bw's server after its receives completed, read-bw's client
    // after its READs did.
    if (cfg.data_validation && !validation_source(cfg)) {
      if (auto r = check_validation(s); !r) return r;
    }
    if (send && cfg.all_sizes) {
      if (auto r = s.swap_keys(true); !r) return r;
    }
  }
  s.print_rule();
  if (!send) {
    if (auto r = s.swap_keys(true); !r) return r;
    if (auto r = s.swap_bw_report(to_wire(last)); !r) return std::unexpected(r.error());
  }
  if (auto r = s.close(); !r) return r;
  s.linger(milliseconds(250));
  return {};
}

}  // namespace ufab::cli::perf
