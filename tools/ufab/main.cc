// ufab: list, query, bind and diagnose NICs for user-space drivers over VFIO.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "base/json.h"
#include "tools/ufab/cli.h"

namespace ufab::cli {
namespace {

constexpr const char* kUsage = R"(usage: ufab [--json] <command> [args]

commands:
  list                 network PCI devices: driver, IOMMU group, NUMA node,
                       interface, readiness for ufab
  info BDF             one device: BARs, capabilities, MSI-X, IOMMU group;
                       through VFIO (MAC, regions, IRQs) when bound to
                       vfio-pci, and its RDMA device: FLUSH global/persistent,
                       ATOMIC_WRITE, memory types, limits
  info swnic:LINK:PORT | shm:DOMAIN
                       a software device's RDMA view (as above)
      --ip A.B.C.D     the address to open a soft-RoCE port with (not needed)
      --param K=V      driver parameter (repeatable)
  bind BDF [--force]   hand a NIC to vfio-pci; refuses the NIC that carries
                       this machine's connection unless --force
  unbind BDF           give a NIC back to the driver it had before bind
  doctor [BDF]         check IOMMU, vfio modules, /dev/vfio, group viability,
                       memlock and hugepages; prints the fix for each failure
  plugins              driver plugins: ABI version, origin, devices they match
  pktgen FROM TO       send test frames from port FROM to port TO and count
                       them at TO: frames/s, bits/s, loss, order, integrity
      --count N        frames to send (default 100000)
      --duration S     send for S seconds instead of --count
      --size N|MIN-MAX frame bytes without FCS, 60..1514 (default 60-1514)
      --burst N        frames per doorbell (default 32)
      --verify full|header  check every byte (default) or only each
                       frame's header and sequence, as testpmd's txonly
      --timeout S      bound on the whole run (default 120)
      --param K=V      driver parameter for both ports (repeatable)
  pingpong DEVICE --ip A.B.C.D [SERVER_HOST]
                       ibv_rc_pingpong's RC ping-pong on port DEVICE, against
                       ibv_rc_pingpong (rdma_rxe, any RoCE NIC) or another
                       ufab; server without SERVER_HOST, client with it
      --ip A.B.C.D     this port's IPv4 address (GID ::ffff:A.B.C.D); required
      -p, --port N     TCP port of the exchange (default 18515; server: 0 = any)
      -s, --size N     bytes per message (default 4096)
      -n, --iters N    round trips (default 1000)
      -r, --rx-depth N receives posted at a time (default 500)
      -m, --mtu N      path MTU: 256..4096 (default 1024)
      --timeout S      bound on each wait: client, exchange, each completion
                       (default 30)
      --param K=V      driver parameter (repeatable), e.g. stale=reset

  perf TEST DEVICE --ip A.B.C.D [SERVER_HOST]
  perf TEST shm:DOMAIN [SERVER_HOST]
                       perftest's RC tests on port DEVICE, against perftest
                       (ib_write_bw, ib_read_lat, ...: rdma_rxe, any RoCE
                       NIC) or another ufab; server without SERVER_HOST.
                       shm:DOMAIN (shared memory, two processes of this
                       host) takes no --ip.
                       TEST: write-lat write-bw read-lat read-bw send-lat
                       send-bw atomic-lat atomic-bw, and ufab's flush-lat
                       (FLUSH of -s bytes, one at a time). Options as
                       perftest's, with its defaults per test; give both
                       sides the same:
      -s, --size N[K|M] message size (lat 2, bw 65536, atomic 8)
      -n, --iters N    iterations (1000; write-bw 5000)
      -a, --all        every size from 2 to 8 MiB
      -D, --duration S run S seconds (warm-up and tail S/4 each) instead
      -q, --qps N      QPs (bandwidth tests)
      -t, --tx-depth N requests in flight per QP (lat 1, bw 128)
      -Q, --cq-mod N   a completion every N requests (bw: 100; 1 above 8 KiB)
      -r, --rx-depth N receives posted (send tests, 512)
      -I, --inline N   inline data up to N bytes (write-lat 220, send-lat 236)
      -A, --atomic-type FETCH_AND_ADD|CMP_AND_SWAP
      -m, --mtu N      path MTU (default: the port's; the smaller side wins)
      -R, --rdma_cm    perftest's -R: the exchange and the test QPs over
                       rdma_cm (ufab's connection manager; port -p);
                       SERVER_HOST is then the server's RoCE address
      -p, --port N     TCP port (18515; with -R the rdma_cm port)
      -x, --gid-index 0  the port's one GID; -F is accepted and ignored
      --report_gbits   Gb/s instead of MB/s (2^20 bytes)
      --timeout S      bound on each wait (default 30); --param K=V
      --flush global|persistent  write-lat/-bw: a FLUSH of each WRITE's
                       range behind it, done when the FLUSH completes
                       (persistent: commit-complete WRITEs, the same wire);
                       flush-lat: the FLUSH's type (global). ufab peers only
      --use_cuda[=DEV] the buffer is device memory on GPU DEV (default 0),
                       as perftest's --use_cuda (not write-lat, atomics,
                       --flush or -I; inline off)
      --data_validation  write-bw, read-bw, send-bw: messages carry a known
                       pattern and the side they land on checks every byte
                       of every message slot after the run (both sides)
      --pmem PATH      the buffer is PATH mapped shared (file: created or
                       extended; block device; /dev/daxN.M), registered as
                       persistent memory: needed where --flush persistent
                       flushes this side (server; write-lat: both)
  cmatose DEVICE --ip A.B.C.D [-s SERVER]
                       rdma-core's ucmatose over ufab's connection manager
                       (rdma_cm's protocol), against the kernel's ucmatose
                       or another ufab; server without -s, client with it
      -s, --server A.B.C.D  the server to connect to
      -p, --port N     rdma_cm port (default 7471)
      -c, --connections N  connections (default 1)
      -C, --count N    messages each way per connection (default 10)
      -S, --size N     bytes per message (default 100)
      -b, --bind A.B.C.D  accepted if it is --ip (ucmatose's bind address)
      --timeout S      bound on each wait (default 30); --param K=V
  rping DEVICE --ip A.B.C.D -s|-c [-a ADDR]
                       rdma-core's rping over ufab's connection manager:
                       SEND, RDMA READ and RDMA WRITE pings, against the
                       kernel's rping or another ufab; -s serves one client
                       (until it disconnects), -c connects to -a
      -a ADDR          the server's address (-c); -s: --ip or 0.0.0.0
      -p PORT          rdma_cm port (default 7174)
      -C N             pings (client; default 0: until interrupted); on the
                       server: the pings the client must make
      -S N             bytes per ping, 23..65535 (default 64)
      -v               print each ping's data as rping does
      -V               validate: the client compares what came back, the
                       server what it read with rping's payload
      -d               debug lines (events, advertisements) on stderr
      -q               accepted (rping's "self-created QP": ufab's always is)
      -I ADDR          accepted if it is --ip (rping's source address)
      --quiet          no progress lines and no summary line
      --timeout S      bound on each wait (default 30); --param K=V

options:
  --json               machine-readable output on stdout
  --force              (bind) bind even a NIC that is up with an address
  -h, --help           this text

BDF is a PCI address such as 0000:01:00.0 or 01:00.0. A port is a BDF
bound to vfio-pci or a software device such as swnic:lab:0.
environment: UFAB_SYSFS_ROOT, UFAB_PROC_ROOT, UFAB_DEV_ROOT, UFAB_STATE_DIR
override /sys, /proc, /dev and /run/ufab (for tests and containers).
exit status: 0 success, 1 failed or refused, 2 usage error.
)";

// Options that take a value, and the commands each belongs to.
const std::map<std::string, std::set<std::string>> kValueOptions = {
    {"count", {"pktgen", "cmatose", "rping"}},
    {"addr", {"rping"}},
    {"source", {"rping"}},
    {"server", {"cmatose"}},
    {"bind", {"cmatose"}},
    {"connections", {"cmatose"}},
    {"duration", {"pktgen", "perf"}},
    {"size", {"pktgen", "pingpong", "perf", "cmatose", "rping"}},
    {"burst", {"pktgen"}},
    {"timeout", {"pktgen", "pingpong", "perf", "cmatose", "rping"}},
    {"param", {"info", "pktgen", "pingpong", "perf", "cmatose", "rping"}},
    {"verify", {"pktgen"}},
    {"ip", {"info", "pingpong", "perf", "cmatose", "rping"}},
    {"port", {"pingpong", "perf", "cmatose", "rping"}},
    {"iters", {"pingpong", "perf"}},
    {"rx-depth", {"pingpong", "perf"}},
    {"mtu", {"pingpong", "perf"}},
    {"qps", {"perf"}},
    {"tx-depth", {"perf"}},
    {"cq-mod", {"perf"}},
    {"inline", {"perf"}},
    {"atomic-type", {"perf"}},
    {"gid-index", {"perf"}},
    {"flush", {"perf"}},
    {"pmem", {"perf"}},
    {"use_cuda", {"perf"}},  // --use_cuda alone: GPU 0
};

// Options without a value, and their commands.
const std::map<std::string, std::set<std::string>> kFlagOptions = {
    {"all", {"perf"}},
    {"report_gbits", {"perf"}},
    {"rdma_cm", {"perf"}},
    {"data_validation", {"perf"}},
    {"F", {"perf"}},  // perftest's "do not warn about the CPU frequency": nothing to do
    {"server-side", {"rping"}},
    {"client-side", {"rping"}},
    {"verbose", {"rping"}},
    {"validate", {"rping"}},
    {"debug", {"rping"}},
    {"quiet", {"rping"}},
    {"self-qp", {"rping"}},     // rping's -q: ufab's application always creates its QP
    {"persistent", {"rping"}},  // rping's -P: refused with a reason
};

// Short forms, as ibv_rc_pingpong and perftest spell them ("-s 64" or
// "-s64").
const std::map<char, std::string> kShortOptions = {
    {'p', "port"}, {'s', "size"},     {'n', "iters"},     {'r', "rx-depth"}, {'m', "mtu"},       {'D', "duration"},
    {'q', "qps"},  {'t', "tx-depth"}, {'Q', "cq-mod"},    {'I', "inline"},   {'A', "atomic-type"}, {'x', "gid-index"},
};
const std::map<char, std::string> kShortFlags = {{'a', "all"}, {'F', "F"}, {'R', "rdma_cm"}};

// Commands that speak another tool's command line (ucmatose's, rping's) spell
// short options their own way: their tables replace the two above.
struct ShortTables {
  std::map<char, std::string> options, flags;
};
const std::map<std::string, ShortTables> kCommandShort = {
    {"cmatose",
     {{{'s', "server"}, {'b', "bind"}, {'p', "port"}, {'c', "connections"}, {'C', "count"}, {'S', "size"}}, {}}},
    {"rping",
     {{{'a', "addr"}, {'I', "source"}, {'p', "port"}, {'C', "count"}, {'S', "size"}},
      {{'s', "server-side"},
       {'c', "client-side"},
       {'v', "verbose"},
       {'V', "validate"},
       {'d', "debug"},
       {'q', "self-qp"},
       {'P', "persistent"}}}},
};

std::string joined(const std::set<std::string>& commands) {
  std::string out;
  for (const auto& c : commands) out += (out.empty() ? "`ufab " : " and `ufab ") + c + "`";
  return out;
}

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "ufab: %s\n(run `ufab --help` for usage)\n", msg.c_str());
  return kExitUsage;
}

void apply_env(pci::HostPaths& paths) {
  if (const char* v = std::getenv("UFAB_SYSFS_ROOT")) paths.sysfs = v;
  if (const char* v = std::getenv("UFAB_PROC_ROOT")) paths.proc = v;
  if (const char* v = std::getenv("UFAB_DEV_ROOT")) paths.dev = v;
  if (const char* v = std::getenv("UFAB_STATE_DIR")) paths.state_dir = v;
}

}  // namespace

int report_error(const Options& opts, const std::string& command, const Error& err) {
  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", false).field("command", command).field("errno", err.code());
    w.field("error", std::string(strerrorname_np(err.code()) ? strerrorname_np(err.code()) : "EUNKNOWN"));
    w.field("message", err.message()).end_object();
    std::printf("%s\n", w.str().c_str());
  }
  std::fprintf(stderr, "ufab %s: %s\n", command.c_str(), err.message().c_str());
  return kExitFailed;
}

Result<double> number_option(const Options& opts, const std::string& name, double fallback, double min, double max) {
  const std::string* v = opts.value(name);
  if (!v) return fallback;
  char* end = nullptr;
  double d = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || d < min || d > max) {
    return fail(EINVAL, "--" + name + " " + *v + ": expected a number from " + std::to_string(static_cast<long long>(min)) +
                            " to " + std::to_string(static_cast<long long>(max)));
  }
  return d;
}

int run(int argc, char** argv) {
  Options opts;
  apply_env(opts.host.paths);
  std::string command;
  // The short-option tables of the command named so far.
  auto short_options = [&]() -> const std::map<char, std::string>& {
    auto it = kCommandShort.find(command);
    return it != kCommandShort.end() ? it->second.options : kShortOptions;
  };
  auto short_flags = [&]() -> const std::map<char, std::string>& {
    auto it = kCommandShort.find(command);
    return it != kCommandShort.end() ? it->second.flags : kShortFlags;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      opts.json = true;
    } else if (a == "--force") {
      opts.force = true;
    } else if (a == "-h" || a == "--help" || a == "help") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else if (a.size() > 2 && a.rfind("--", 0) == 0 && kValueOptions.count(a.substr(2, a.find('=') - 2))) {
      auto eq = a.find('=');
      std::string name = a.substr(2, eq - 2);
      if (eq != std::string::npos) {
        opts.values[name].push_back(a.substr(eq + 1));
      } else if (name == "use_cuda") {
        // perftest's --use_cuda takes its GPU as the next word; ufab's
        // value is optional (--use_cuda alone: GPU 0), so only a number is
        // taken from the next word.
        bool number = i + 1 < argc && argv[i + 1][0] != '\0' &&
                      std::string(argv[i + 1]).find_first_not_of("0123456789") == std::string::npos;
        opts.values[name].push_back(number ? argv[++i] : "0");
      } else if (i + 1 < argc) {
        opts.values[name].push_back(argv[++i]);
      } else {
        return usage_error("option --" + name + " needs a value");
      }
    } else if (a.size() > 2 && a.rfind("--", 0) == 0 && kFlagOptions.count(a.substr(2))) {
      opts.flags.insert(a.substr(2));
    } else if (a.size() == 2 && a[0] == '-' && short_flags().count(a[1])) {
      opts.flags.insert(short_flags().at(a[1]));
    } else if (a.size() >= 2 && a[0] == '-' && a[1] != '-' && short_options().count(a[1])) {
      const std::string& name = short_options().at(a[1]);
      if (a.size() > 2) {
        opts.values[name].push_back(a.substr(2));
      } else if (i + 1 < argc) {
        opts.values[name].push_back(argv[++i]);
      } else {
        return usage_error("option -" + std::string(1, a[1]) + " needs a value");
      }
    } else if (a.size() > 1 && a[0] == '-') {
      return usage_error("unknown option '" + a + "'");
    } else if (command.empty()) {
      command = a;
    } else {
      opts.args.push_back(a);
    }
  }
  if (command.empty()) return usage_error("no command given");

  struct Spec {
    int (*fn)(const Options&);
    size_t min_args, max_args;
    const char* synopsis;
  };
  static const std::map<std::string, Spec> commands = {
      {"list", {cmd_list, 0, 0, "ufab list"}},
      {"info", {cmd_info, 1, 1, "ufab info BDF|swnic:LINK:PORT|shm:DOMAIN|gpu"}},
      {"bind", {cmd_bind, 1, 1, "ufab bind BDF [--force]"}},
      {"unbind", {cmd_unbind, 1, 1, "ufab unbind BDF"}},
      {"doctor", {cmd_doctor, 0, 1, "ufab doctor [BDF]"}},
      {"plugins", {cmd_plugins, 0, 0, "ufab plugins"}},
      {"pktgen", {cmd_pktgen, 2, 2, "ufab pktgen FROM TO [--count N|--duration S] [--size N|MIN-MAX]"}},
      {"pingpong",
       {cmd_pingpong, 1, 2, "ufab pingpong DEVICE --ip A.B.C.D [SERVER_HOST] [-p PORT] [-s SIZE] [-n ITERS]"}},
      {"perf", {cmd_perf, 2, 3, "ufab perf TEST DEVICE --ip A.B.C.D [SERVER_HOST] [perftest options]"}},
      {"cmatose",
       {cmd_cmatose, 1, 1, "ufab cmatose DEVICE --ip A.B.C.D [-s SERVER] [-p PORT] [-c CONNS] [-C COUNT] [-S SIZE]"}},
      {"rping",
       {cmd_rping, 1, 1,
        "ufab rping DEVICE --ip A.B.C.D -s|-c [-a ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [-d] [--quiet]"}},
  };
  auto it = commands.find(command);
  if (it == commands.end()) return usage_error("unknown command '" + command + "'");
  const Spec& spec = it->second;
  if (opts.args.size() < spec.min_args || opts.args.size() > spec.max_args) {
    return usage_error(std::string("wrong number of arguments; usage: ") + spec.synopsis);
  }
  if (opts.force && command != "bind") return usage_error("--force applies only to `ufab bind`");
  for (const auto& name : opts.flags) {
    if (!kFlagOptions.at(name).count(command)) {
      return usage_error("--" + name + " applies only to " + joined(kFlagOptions.at(name)));
    }
  }
  for (const auto& [name, values] : opts.values) {
    if (!kValueOptions.at(name).count(command)) {
      return usage_error("--" + name + " applies only to " + joined(kValueOptions.at(name)));
    }
  }
  return spec.fn(opts);
}

}  // namespace ufab::cli

int main(int argc, char** argv) { return ufab::cli::run(argc, argv); }
