// ufab perf TEST DEVICE --ip A.B.C.D [SERVER_HOST]: perftest's RC tests on
// a ufab port (tools/ufab/perf/), against perftest's ib_* tools or another
// ufab; `ufab perf TEST shm:DOMAIN [SERVER_HOST]` (no --ip) between two
// processes of this host over the shared-memory provider. Options are
// perftest's, with its defaults per test; the output is perftest's, or one
// JSON object with --json. ufab's own: --flush global|persistent (a FLUSH
// behind every WRITE), the flush-lat test, --pmem PATH (durable memory as
// the buffer).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include "base/json.h"
#include "core/roce/gid.h"
#include "tools/ufab/cli.h"
#include "tools/ufab/render.h"
#include "tools/ufab/perf/session.h"

namespace ufab::cli {
namespace {

using perf::Config;
using perf::Kind;
using perf::Verb;

struct TestName {
  const char* name;
  Verb verb;
  Kind kind;
};
constexpr TestName kTests[] = {
    {"write-lat", Verb::kWrite, Kind::kLatency}, {"write-bw", Verb::kWrite, Kind::kBandwidth},
    {"read-lat", Verb::kRead, Kind::kLatency},   {"read-bw", Verb::kRead, Kind::kBandwidth},
    {"send-lat", Verb::kSend, Kind::kLatency},   {"send-bw", Verb::kSend, Kind::kBandwidth},
    {"atomic-lat", Verb::kAtomic, Kind::kLatency}, {"atomic-bw", Verb::kAtomic, Kind::kBandwidth},
    {"flush-lat", Verb::kFlush, Kind::kLatency},
};

int usage_failure(const Options& opts, const Error& err) {
  report_error(opts, "perf", err);
  std::fprintf(stderr, "(run `ufab --help` for usage)\n");
  return kExitUsage;
}

// "-s 64K" as perftest reads it: K and M multiply by 2^10 and 2^20.
Result<uint64_t> size_value(const std::string& text) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return fail(EINVAL, "-s " + text + ": expected a size such as 64, 4K or 1M");
  std::string unit(end);
  if (unit == "K" || unit == "k") v <<= 10;
  else if (unit == "M" || unit == "m") v <<= 20;
  else if (!unit.empty()) return fail(EINVAL, "-s " + text + ": expected a size such as 64, 4K or 1M");
  if (v < 1 || v > (1ull << 31)) return fail(EINVAL, "-s " + text + ": expected 1 byte to 2 GiB");
  return uint64_t(v);
}

Result<uint64_t> whole(const Options& opts, const std::string& name, uint64_t fallback, uint64_t min, uint64_t max) {
  auto v = number_option(opts, name, double(fallback), double(min), double(max));
  if (!v) return std::unexpected(v.error());
  if (*v != std::floor(*v)) return fail(EINVAL, "--" + name + " " + *opts.value(name) + ": expected a whole number");
  return uint64_t(*v);
}

// "shm:DOMAIN": the shared-memory provider (docs/drivers/shm.md).
bool shared_memory(const std::string& device) { return device.rfind("shm:", 0) == 0; }

// perftest's defaults and the rules that tie its options together
// (perftest_parameters.c init_perftest_params and force_dependecies).
Result<Config> configure(const Options& opts, const TestName& t) {
  Config c;
  c.test = t.name;
  c.verb = t.verb;
  c.kind = t.kind;
  c.json = opts.json;
  c.device = opts.args[1];
  if (opts.args.size() > 2) c.server_host = opts.args[2];
  // A port on a NIC (soft-RoCE) needs its IPv4 address; a shared-memory
  // device has its own address (an endpoint id, ufab_device_attr.ip), which
  // goes into the exchanged GID as an IPv4 address would.
  const std::string* ip = opts.value("ip");
  if (shared_memory(c.device)) {
    if (ip) {
      return fail(EINVAL, "--ip " + *ip + ": " + c.device + " is a shared-memory device; its address is its "
                          "endpoint id, chosen when it opens: leave --ip out");
    }
  } else {
    if (!ip) {
      return fail(EINVAL, "--ip A.B.C.D is required: this port's IPv4 address (its GID is ::ffff:A.B.C.D), in the "
                          "same subnet as the peer's (shm:DOMAIN devices take none)");
    }
    if (!roce::ipv4_from_string(*ip)) return fail(EINVAL, "--ip " + *ip + ": expected an IPv4 address, A.B.C.D");
    c.ip = *ip;
  }
  const bool lat = t.kind == Kind::kLatency;
  const bool atomic = t.verb == Verb::kAtomic;
  // --flush TYPE: a FLUSH behind every WRITE (write-lat, write-bw), or
  // flush-lat's type (global unless given). --pmem PATH: the buffer is
  // durable memory.
  if (const std::string* f = opts.value("flush")) {
    if (*f == "global") c.flush_type = rdma::kFlushTypeGlobal;
    else if (*f == "persistent") c.flush_type = rdma::kFlushTypePersistent;
    else return fail(EINVAL, "--flush " + *f + ": expected global or persistent");
    if (t.verb != Verb::kWrite && t.verb != Verb::kFlush) {
      return fail(EINVAL, "--flush applies to write-lat, write-bw (a FLUSH behind every WRITE) and flush-lat; " +
                              std::string(t.name) + " has no WRITE to flush");
    }
  } else if (t.verb == Verb::kFlush) {
    c.flush_type = rdma::kFlushTypeGlobal;
  }
  if (const std::string* p = opts.value("pmem")) {
    if (p->empty()) return fail(EINVAL, "--pmem: expected a path (a file on a disk, a block device or /dev/daxN.M)");
    c.pmem = *p;
  }
  // -R: perftest's rdma_cm mode (the exchange and the test QPs through
  // the connection manager; tools/exchange/perftest_cm.h).
  c.rdma_cm = opts.flags.count("rdma_cm");
  if (c.rdma_cm) {
    if (shared_memory(c.device)) {
      return fail(EINVAL, "-R: " + c.device + " is a shared-memory device, which has no connection manager (no GSI "
                          "QP); -R needs a soft-RoCE port (swnic:LINK:PORT or a NIC on vfio-pci)");
    }
    if (c.flush_type != 0) {
      return fail(EINVAL, "-R with --flush: the connection manager grants the QPs RDMA WRITE, READ and atomic "
                          "access, not FLUSH; run --flush without -R");
    }
    if (opts.value("mtu")) {
      return fail(EINVAL, "-R with -m: the connection manager sets the path MTU (the smaller of the two ports'); "
                          "leave -m out");
    }
    if (!c.server() && !roce::ipv4_from_string(c.server_host)) {
      return fail(EINVAL, "-R: the server " + c.server_host + " must be its RoCE IPv4 address (A.B.C.D), which "
                          "rdma_cm connects to");
    }
    if (const std::string* p = opts.value("port"); p && *p == "0") {
      return fail(EINVAL, "-R with -p 0: rdma_cm needs a port both sides know (18515 unless -p)");
    }
  }
  c.all_sizes = opts.flags.count("all");
  if (const std::string* s = opts.value("size")) {
    if (atomic) return fail(EINVAL, "-s: the message size of the atomic tests is 8 bytes and cannot be changed");
    auto v = size_value(*s);
    if (!v) return std::unexpected(v.error());
    c.size = *v;
  } else {
    c.size = atomic ? 8 : lat ? 2 : 65536;
  }
  if (c.all_sizes) {
    if (atomic) return fail(EINVAL, "-a: the atomic tests have one size (8 bytes)");
    c.size = perf::kAllSizesMax;
  }
  auto iters = whole(opts, "iters", t.verb == Verb::kWrite && !lat ? 5000 : 1000, 5, 100000000);
  auto duration = whole(opts, "duration", 0, 1, 86400);
  auto qps = whole(opts, "qps", 1, 1, 1024);
  auto tx = whole(opts, "tx-depth", lat ? 1 : 128, 1, 15000);
  auto port = whole(opts, "port", exchange::kPerftestPort, c.server() ? 0 : 1, 65535);
  auto mtu = whole(opts, "mtu", 0, 256, 4096);
  auto gid = whole(opts, "gid-index", 0, 0, 255);
  auto timeout = whole(opts, "timeout", 30, 1, 86400);
  auto cq_mod = whole(opts, "cq-mod", 100, 1, 1024);
  auto rx_depth = whole(opts, "rx-depth", 512, 1, 16384);
  auto inl = whole(opts, "inline", 0, 0, 912);
  for (auto* r : {&iters, &duration, &qps, &tx, &port, &mtu, &gid, &timeout, &cq_mod, &rx_depth, &inl}) {
    if (!*r) return std::unexpected(r->error());
  }
  if (*gid != 0) {
    return fail(EINVAL, "-x " + std::to_string(*gid) +
                            ": a ufab port has one GID, index 0 (::ffff:<--ip>, or ::ffff:<endpoint id> "
                            "on shm); use -x 0 or leave it out");
  }
  if (opts.value("mtu") && (*mtu & (*mtu - 1)) != 0) {
    return fail(EINVAL, "-m " + std::to_string(*mtu) + ": expected 256, 512, 1024, 2048 or 4096");
  }
  if (lat && *qps != 1) return fail(EINVAL, "-q: multiple QPs only in the bandwidth tests, as in perftest");
  if (opts.value("duration")) {
    if (c.all_sizes) return fail(EINVAL, "-D with -a: duration mode runs one size, as in perftest");
    if (*duration / 4 * 2 >= *duration) return fail(EINVAL, "-D " + std::to_string(*duration) + ": at least 3 seconds");
    c.duration_s = uint32_t(*duration);
  }
  if (opts.value("inline") && (t.verb == Verb::kRead || atomic || t.verb == Verb::kFlush)) {
    return fail(EINVAL, "-I: inline data is for WRITE and SEND, as in perftest");
  }
  // FLUSH PERSISTENT to memory that is not durable is refused by the
  // target's registration: say so before anything opens.
  if (c.flush_target() && c.flush_type == rdma::kFlushTypePersistent && c.pmem.empty()) {
    return fail(EINVAL, std::string("--flush persistent: ") +
                            (c.server() ? "the client flushes this server's buffer"
                                        : "in write-lat the server flushes this client's buffer too") +
                            ", which must be durable memory: give --pmem PATH (a file on a disk, a block device or "
                            "/dev/daxN.M)");
  }
  if (const std::string* a = opts.value("atomic-type")) {
    if (!atomic) return fail(EINVAL, "-A applies to atomic-lat and atomic-bw");
    if (*a == "CMP_AND_SWAP") c.cmp_and_swap = true;
    else if (*a != "FETCH_AND_ADD") return fail(EINVAL, "-A " + *a + ": expected CMP_AND_SWAP or FETCH_AND_ADD");
  }
  c.iters = c.duration_s ? 0 : *iters;
  c.qps = uint32_t(*qps);
  c.tx_depth = uint32_t(c.duration_s ? *tx : std::min<uint64_t>(*tx, *iters));
  c.port = uint16_t(*port);
  c.mtu = uint32_t(opts.value("mtu") ? *mtu : 0);
  c.timeout = std::chrono::milliseconds(*timeout * 1000);
  // Completion moderation: every cq_mod-th request signaled; large
  // bandwidth messages every one unless -Q says otherwise; never more than
  // the send queue holds.
  uint64_t mod = *cq_mod;
  if (!lat && !opts.value("cq-mod") && c.size > 8192 && !c.all_sizes) mod = 1;
  c.cq_mod = uint32_t(std::min<uint64_t>(mod, c.tx_depth));
  // Receives for the send tests: at most one per message, an even count.
  uint64_t rx = t.verb == Verb::kSend ? *rx_depth : 1;
  if (t.verb == Verb::kSend && !c.duration_s) {
    rx = std::min(rx, *iters);
    if (!c.all_sizes && rx % 2) ++rx;
  }
  c.rx_depth = uint32_t(rx);
  // Inline: perftest's defaults for its tests (220 for write-lat, 236 for
  // send-lat, none for the rest).
  c.inline_size = uint32_t(opts.value("inline") ? *inl
                           : lat && t.verb == Verb::kWrite ? 220
                           : lat && t.verb == Verb::kSend  ? 236
                                                           : 0);
  // --use_cuda[=DEV]: the buffer in GPU memory, as perftest's --use_cuda;
  // what perftest refuses with device memory is refused here too.
  if (opts.value("use_cuda")) {
    auto dev = whole(opts, "use_cuda", 0, 0, 1023);
    if (!dev) return std::unexpected(dev.error());
    c.cuda_device = int(*dev);
    const std::string why = "--use_cuda: ";
    if (lat && t.verb == Verb::kWrite) {
      return fail(EINVAL, why + "write-lat polls the last byte of each arriving WRITE from the CPU, which cannot "
                                "read GPU memory (perftest refuses it too); use write-bw, read-lat or send-lat");
    }
    if (atomic) return fail(EINVAL, why + "atomics on GPU memory are not supported (the target's CPU performs them)");
    if (t.verb == Verb::kFlush || c.flush_type != 0) return fail(EINVAL, why + "GPU memory is no FLUSH target");
    if (!c.pmem.empty()) return fail(EINVAL, why + "--pmem gives the buffer too; choose one");
    if (opts.value("inline") && *inl > 0) {
      return fail(EINVAL, why + "inline data is copied by the CPU from the buffer at post time, which cannot "
                                "read GPU memory (perftest refuses it too); leave -I out");
    }
    c.inline_size = 0;  // as perftest: "inline size set to 0"
  }
  // --data_validation: every byte of every message slot checked where it
  // lands (tools/ufab/perf/bandwidth.cc).
  c.data_validation = opts.flags.count("data_validation");
  if (c.data_validation) {
    if (lat || atomic) {
      return fail(EINVAL, "--data_validation applies to write-bw, read-bw and send-bw (as in perftest: bandwidth tests)");
    }
    if (c.all_sizes) return fail(EINVAL, "--data_validation with -a: validation checks one size (as in perftest)");
  }
  c.report_gbits = opts.flags.count("report_gbits");
  if (auto it = opts.values.find("param"); it != opts.values.end()) {
    for (const auto& kv : it->second) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) return fail(EINVAL, "--param " + kv + ": expected KEY=VALUE");
      c.params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return c;
}

}  // namespace

int cmd_perf(const Options& opts) {
  const TestName* test = nullptr;
  for (const auto& t : kTests) {
    if (opts.args[0] == t.name) test = &t;
  }
  if (!test) {
    return usage_failure(opts, Error(EINVAL, "unknown test '" + opts.args[0] +
                                                 "'; expected write-lat, write-bw, read-lat, read-bw, send-lat, "
                                                 "send-bw, atomic-lat, atomic-bw or flush-lat"));
  }
  auto cfg = configure(opts, *test);
  if (!cfg) return usage_failure(opts, cfg.error());

  perf::Session session(*cfg);
  if (cfg->server() && !cfg->json) {
    std::printf("\n************************************\n* Waiting for client to connect... *\n"
                "************************************\n");
    std::fflush(stdout);
  }
  // The progress line: on stderr, once a second after the first two.
  const bool tty = isatty(STDERR_FILENO);
  perf::Progress progress = [tty](const std::string& line) {
    std::fprintf(stderr, tty ? "\rperf: %s   " : "perf: %s\n", line.c_str());
    std::fflush(stderr);
  };
  std::vector<perf::LatencyResult> lat;
  std::vector<perf::BandwidthResult> bw;
  FILE* out = cfg->json ? stderr : stdout;
  Status run = session.open();
  if (run) {
    if (cfg->kind == Kind::kLatency) {
      run = perf::run_latency(session, progress, [&](const perf::LatencyResult& r) {
        if (tty) std::fputc('\n', stderr);
        if (cfg->duration_s) {
          std::fprintf(out, " %-7llu       %-10llu            %-7.2f        %-7.2f\n",
                       static_cast<unsigned long long>(r.size), static_cast<unsigned long long>(r.iters), r.t_avg, r.tps);
        } else {
          std::fprintf(out,
                       " %-7llu %llu          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f "
                       "\t\t%-7.2f\n",
                       static_cast<unsigned long long>(r.size), static_cast<unsigned long long>(r.iters), r.t_min,
                       r.t_max, r.t_typical, r.t_avg, r.t_stdev, r.p99, r.p999);
        }
        std::fflush(out);
        lat.push_back(r);
      });
    } else {
      run = perf::run_bandwidth(session, progress, [&](const perf::BandwidthResult& r) {
        if (tty) std::fputc('\n', stderr);
        std::fprintf(out, " %-7llu    %-10llu       %-7.2f            %-7.2f\t\t   %-7.6f\n",
                     static_cast<unsigned long long>(r.size), static_cast<unsigned long long>(r.iters), r.bw_peak_mb,
                     r.bw_avg_mb, r.msg_rate_mpps);
        std::fflush(out);
        bw.push_back(r);
      });
    }
  }
  // -R: the test QPs disconnected, as perftest ends.
  if (run) run = session.finish();
  // The counters on failure too: what the transport went through says
  // much about why.
  if (session.device_open()) std::fprintf(stderr, "perf: transport: %s\n", session.counters().c_str());
  if (!run) return report_error(opts, "perf", run.error());

  if (cfg->json) {
    JsonWriter w;
    w.begin_object().field("ok", true).field("command", "perf").field("test", cfg->test);
    w.field("role", cfg->role()).field("device", cfg->device).field("path_mtu", session.path_mtu());
    w.field("qps", cfg->qps).field("tx_depth", cfg->tx_depth).field("cq_mod", cfg->cq_mod);
    if (cfg->duration_s) w.field("duration_s", cfg->duration_s);
    w.key("flush");
    if (cfg->flush_type != 0) {
      w.value(perf::flush_type_name(cfg->flush_type));
    } else {
      w.null();
    }
    w.field("memory", session.memory_kind());
    w.field("rdma_cm", cfg->rdma_cm);
    if (!cfg->pmem.empty()) w.field("pmem", cfg->pmem);
    if (cfg->cuda_device >= 0) w.field("cuda_device", cfg->cuda_device);
    if (cfg->data_validation) {
      w.key("validated_bytes");
      if (session.validated_bytes) {
        w.value(*session.validated_bytes);
      } else {
        w.null();  // this side had nothing land: its peer checked
      }
    }
    w.field("units", cfg->report_gbits ? "Gb/s" : "MiB/s");
    w.key("results").begin_array();
    for (const auto& r : lat) {
      w.begin_object().field("size", r.size).field("iters", r.iters);
      if (cfg->duration_s) {
        w.field("t_avg_usec", r.t_avg).field("tps", r.tps);
      } else {
        w.field("t_min_usec", r.t_min).field("t_max_usec", r.t_max).field("t_typical_usec", r.t_typical);
        w.field("t_avg_usec", r.t_avg).field("t_stdev_usec", r.t_stdev).field("p99_usec", r.p99);
        w.field("p999_usec", r.p999);
      }
      w.end_object();
    }
    for (const auto& r : bw) {
      w.begin_object().field("size", r.size).field("iters", r.iters);
      if (r.peak_valid) w.field("bw_peak", r.bw_peak_mb);
      w.field("bw_avg", r.bw_avg_mb).field("msg_rate_mpps", r.msg_rate_mpps).end_object();
    }
    w.end_array();
    write_transport_stats(w, session.device().stats());
    w.end_object();
    std::printf("%s\n", w.str().c_str());
  }
  return kExitOk;
}

}  // namespace ufab::cli
