// The power-loss durability test's program (docs/persistence.md; the host
// side is tests/bench/power_loss.sh). Three roles:
//
//   power_loss target --map PATH [--device SPEC] [--ip A.B.C.D] [--port P]
//                     [--length BYTES] [--seconds S] [--control-only]
//     Maps PATH (a block device or a file on a disk) MAP_SHARED, registers
//     it as durable memory (UFAB_MEM_PERSISTENT, REMOTE_WRITE |
//     FLUSH_GLOBAL | FLUSH_PERSISTENT), hands the initiator its QP, address
//     and rkey over TCP on 127.0.0.1:P and serves it for S seconds.
//   power_loss initiator --seed N [--device SPEC] [--ip A.B.C.D] [--port P]
//                        [--seconds S] [--control-only] [--commit-style flag|flush]
//     Writes 4 KiB blocks into the target's mapping, in a random order (from
//     the seed), alternating two areas: the commit area (first half), each
//     WRITE commit-complete (UFAB_SEND_COMMIT: its completion comes once the
//     target answered a FLUSH PERSISTENT of its range; --commit-style flush
//     posts that WRITE and FLUSH PERSISTENT itself, the same on the wire), and
//     the control area (second half), each WRITE followed only by a FLUSH
//     GLOBAL. After each completion it prints
//     "power_loss: committed block N" or "power_loss: control block N",
//     flushed at once. Then it idles until S seconds are up: the host kills
//     the VM before that.
//   power_loss check --image FILE --log FILE
//     On the host, after the VM was killed: every block the log says was
//     committed must be in FILE byte for byte (each missing one is named);
//     control blocks are counted; if every control block is there the run
//     proves nothing (the guest's page cache was not what the kill lost).
//     Exit 0 pass, 1 fail, 2 usage or I/O error. The last line is
//     "power_loss: result committed=N lost=M control=K control_present=P PASS|FAIL".
//
// --control-only: the target registers the mapping as host memory with
// FLUSH_GLOBAL only and the initiator writes only control blocks (the
// kill/check mechanics without a durable target).
//
// A block's 4096 bytes follow from (seed, area, block number) alone: a
// 32-byte header ("UFABPLB1", seed, area, number) and a splitmix64 stream, so
// the check regenerates them and can say what a wrong block holds instead.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/fd.h"
#include "tools/exchange/exchange.h"
#include "ufab/rdma.hpp"

namespace ufab {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint32_t kBlock = 4096;
constexpr char kMagic[8] = {'U', 'F', 'A', 'B', 'P', 'L', 'B', '1'};
constexpr const char* kProg = "power_loss";

enum Area : uint32_t { kCommit = 0, kControl = 1 };
const char* area_name(uint32_t a) { return a == kCommit ? "committed" : "control"; }

// ------------------------------------------------------------ the pattern

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint64_t get64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Block `n` of `area` in the run with `seed`.
void fill_block(std::span<uint8_t, kBlock> out, uint64_t seed, uint32_t area, uint32_t n) {
  std::memcpy(out.data(), kMagic, 8);
  put64(out.data() + 8, seed);
  put32(out.data() + 16, area);
  put32(out.data() + 20, n);
  put64(out.data() + 24, 0);
  uint64_t state = seed ^ (static_cast<uint64_t>(area) << 32 | n) * 0xD6E8FEB86659FD93ull;
  for (size_t at = 32; at < kBlock; at += 8) put64(out.data() + at, splitmix(state));
}

// What a block that is not the expected one holds, in words.
std::string describe(std::span<const uint8_t, kBlock> got, std::span<const uint8_t, kBlock> want) {
  if (std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == 0; })) {
    return "all zeros: the write never reached the disk";
  }
  if (std::memcmp(got.data(), kMagic, 8) == 0) {
    uint64_t seed = get64(got.data() + 8);
    uint32_t area = get32(got.data() + 16), n = get32(got.data() + 20);
    if (seed != get64(want.data() + 8)) return "holds a block of another run (seed " + std::to_string(seed) + ")";
    if (area != get32(want.data() + 16) || n != get32(want.data() + 20)) {
      return std::string("holds ") + area_name(area) + " block " + std::to_string(n) + "'s header";
    }
  }
  size_t first = 0;
  while (first < kBlock && got[first] == want[first]) ++first;
  size_t differ = 0;
  for (size_t i = 0; i < kBlock; ++i) differ += got[i] != want[i];
  return "differs from byte " + std::to_string(first) + " on (" + std::to_string(differ) + " of 4096 bytes differ)";
}

// The order blocks of an area are written in: a permutation from the seed.
std::vector<uint32_t> order(uint64_t seed, uint32_t area, uint32_t blocks) {
  std::vector<uint32_t> v(blocks);
  for (uint32_t i = 0; i < blocks; ++i) v[i] = i;
  uint64_t state = seed * 31 + area + 1;
  for (uint32_t i = blocks; i > 1; --i) std::swap(v[i - 1], v[splitmix(state) % i]);
  return v;
}

// --------------------------------------------------------------- options

struct Options {
  std::string role;
  std::string device;
  std::string ip;
  std::string map;
  std::string image;
  std::string log;
  uint16_t port = 18620;
  uint64_t length = 0;  // 0: the whole mapping
  uint64_t seed = 0;
  bool have_seed = false;
  int seconds = 600;
  bool control_only = false;
  std::string commit_style = "flag";
};

void say(const std::string& line) {
  std::printf("%s: %s\n", kProg, line.c_str());
  std::fflush(stdout);
}
void complain(const std::string& line) {
  std::fprintf(stderr, "%s: %s\n", kProg, line.c_str());
  std::fflush(stderr);
}

template <typename T>
bool parse_number(std::string_view s, T& out) {
  int base = 10;
  if (s.starts_with("0x")) s.remove_prefix(2), base = 16;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

constexpr const char* kUsage =
    "usage: power_loss target --map PATH [--device SPEC] [--ip A.B.C.D] [--port P] [--length BYTES]\n"
    "                         [--seconds S] [--control-only]\n"
    "       power_loss initiator --seed N [--device SPEC] [--ip A.B.C.D] [--port P] [--seconds S]\n"
    "                            [--control-only] [--commit-style flag|flush]\n"
    "       power_loss check --image FILE --log FILE\n";

Result<Options> parse(int argc, char** argv) {
  Options o;
  if (argc < 2) return fail(EINVAL, "no role given");
  o.role = argv[1];
  if (o.role != "target" && o.role != "initiator" && o.role != "check") {
    return fail(EINVAL, "unknown role '" + o.role + "' (target, initiator or check)");
  }
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return fail(EINVAL, a + " needs a value");
      return std::string(argv[++i]);
    };
    auto number = [&](auto& out) -> Status {
      auto v = value();
      if (!v) return std::unexpected(v.error());
      if (!parse_number(*v, out)) return fail(EINVAL, a + " '" + *v + "' is not a whole number in range");
      return {};
    };
    auto text = [&](std::string& out) -> Status {
      auto v = value();
      if (!v) return std::unexpected(v.error());
      out = *v;
      return {};
    };
    Status s;
    if (a == "--device") {
      s = text(o.device);
    } else if (a == "--ip") {
      s = text(o.ip);
    } else if (a == "--map") {
      s = text(o.map);
    } else if (a == "--image") {
      s = text(o.image);
    } else if (a == "--log") {
      s = text(o.log);
    } else if (a == "--commit-style") {
      s = text(o.commit_style);
      if (s && o.commit_style != "flag" && o.commit_style != "flush") {
        return fail(EINVAL, "--commit-style '" + o.commit_style +
                                "': flag (WRITE with UFAB_SEND_COMMIT) or flush (WRITE, then FLUSH PERSISTENT)");
      }
    } else if (a == "--port") {
      s = number(o.port);
    } else if (a == "--length") {
      s = number(o.length);
    } else if (a == "--seed") {
      s = number(o.seed);
      o.have_seed = true;
    } else if (a == "--seconds") {
      s = number(o.seconds);
    } else if (a == "--control-only") {
      o.control_only = true;
    } else {
      return fail(EINVAL, "unknown option '" + a + "'");
    }
    if (!s) return std::unexpected(s.error());
  }
  if (o.seconds <= 0) return fail(EINVAL, "--seconds must be at least 1");
  if (o.role == "target") {
    if (o.map.empty()) return fail(EINVAL, "target needs --map PATH (the disk or a file on it)");
    if (o.device.empty()) o.device = "swnic:powerloss:0";
    if (o.ip.empty()) o.ip = "10.0.0.1";
  } else if (o.role == "initiator") {
    if (!o.have_seed) return fail(EINVAL, "initiator needs --seed N (the host keeps it to check the blocks)");
    if (o.device.empty()) o.device = "swnic:powerloss:1";
    if (o.ip.empty()) o.ip = "10.0.0.2";
  } else {
    if (o.image.empty() || o.log.empty()) return fail(EINVAL, "check needs --image FILE and --log FILE");
  }
  return o;
}

// ---------------------------------------------------------------- target

// The mapping's length: a block device's size, or a regular file's.
Result<uint64_t> size_of(int fd, const std::string& path) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return fail_errno("fstat " + path);
  if (S_ISBLK(st.st_mode)) {
    uint64_t bytes = 0;
    if (::ioctl(fd, BLKGETSIZE64, &bytes) != 0) return fail_errno("BLKGETSIZE64 on " + path);
    return bytes;
  }
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  return fail(EINVAL, path + " is neither a block device nor a regular file");
}

int run_target(const Options& o) {
  UniqueFd fd(::open(o.map.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    complain("cannot open " + o.map + " read-write: " + std::strerror(errno));
    return 1;
  }
  auto size = size_of(fd.get(), o.map);
  if (!size) {
    complain(size.error().message());
    return 1;
  }
  uint64_t length = o.length != 0 ? std::min(o.length, *size) : *size;
  length &= ~uint64_t{2 * kBlock - 1};  // two areas of whole blocks
  if (length < 4 * kBlock || length > (uint64_t{1} << 31)) {
    complain(o.map + ": " + std::to_string(length) + " bytes to map; needs 16 KiB to 2 GiB (two areas of 4 KiB blocks)");
    return 1;
  }
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) {
    complain("mmap " + o.map + " MAP_SHARED: " + std::strerror(errno));
    return 1;
  }

  auto dev = rdma::Device::open(o.device, {.ip = o.ip, .progress_thread = true});
  if (!dev) {
    complain("opening " + o.device + ": " + dev.error().message());
    return 1;
  }
  auto pd = (*dev)->alloc_pd();
  auto cq = (*dev)->create_cq(64);
  if (!pd || !cq) {
    complain("protection domain or CQ: " + (!pd ? pd.error() : cq.error()).message());
    return 1;
  }
  auto qp = pd->create_qp({.type = rdma::QpType::kRc, .send_cq = cq->get(), .recv_cq = cq->get()});
  if (!qp) {
    complain("QP: " + qp.error().message());
    return 1;
  }
  rdma::AccessFlags access = rdma::kLocalWrite | rdma::kRemoteWrite | rdma::kFlushGlobal;
  rdma::MemoryType type = rdma::MemoryType::kHost;
  if (!o.control_only) {
    access |= rdma::kFlushPersistent;
    type = rdma::MemoryType::kPersistent;
  }
  auto mr = pd->register_mr(base, length, access, type);
  if (!mr) {
    complain("registering the " + std::to_string(length) + "-byte MAP_SHARED mapping of " + o.map + " as " +
             (o.control_only ? "host memory with FLUSH_GLOBAL" : "UFAB_MEM_PERSISTENT with FLUSH_PERSISTENT") + ": " +
             mr.error().message());
    return 1;
  }
  const auto& attr = (*dev)->attr();
  say("target: " + o.map + " mapped MAP_SHARED, " + std::to_string(length) + " bytes registered as " +
      (o.control_only ? "host memory (FLUSH_GLOBAL only: --control-only)" : "UFAB_MEM_PERSISTENT") + " on " +
      (*dev)->transport() + "; device caps FLUSH_PERSISTENT " +
      ((attr.caps & UFAB_DEVICE_CAP_FLUSH_PERSISTENT) ? "yes" : "no"));

  auto listener = exchange::TcpChannel::listen(o.port, "127.0.0.1");
  if (!listener) {
    complain("listening on 127.0.0.1:" + std::to_string(o.port) + ": " + listener.error().message());
    return 1;
  }
  rdma::ConnectionData local = (*qp)->local();
  local.addr = reinterpret_cast<uint64_t>(base);
  local.length = static_cast<uint32_t>(length);
  local.rkey = mr->rkey();
  auto remote = exchange::exchange_as_server(*listener, local, seconds(120));
  if (!remote) {
    complain(remote.error().message());
    return 1;
  }
  rdma::QpAttr tuning;
  tuning.access_flags = rdma::kRemoteWrite | rdma::kFlushGlobal | (o.control_only ? 0u : rdma::kFlushPersistent);
  if (auto s = (*qp)->connect(*remote, tuning); !s) {
    complain("connecting the target's QP: " + s.error().message());
    return 1;
  }
  say("target: serving QP " + std::to_string((*qp)->qp_num()) + " for up to " + std::to_string(o.seconds) + " s");
  // The progress thread answers the initiator; this thread only waits, and
  // reports a QP that went to ERROR.
  auto deadline = Clock::now() + seconds(o.seconds);
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(200));
    if ((*qp)->state() == rdma::QpState::kError) {
      complain("target: the QP went to ERROR");
      return 1;
    }
  }
  say("target: " + std::to_string(o.seconds) + " s are up (the host was to kill the VM before)");
  return 0;
}

// ------------------------------------------------------------- initiator

int run_initiator(const Options& o) {
  auto dev = rdma::Device::open(o.device, {.ip = o.ip, .progress_thread = true});
  if (!dev) {
    complain("opening " + o.device + ": " + dev.error().message());
    return 1;
  }
  auto pd = (*dev)->alloc_pd();
  auto cq = (*dev)->create_cq(64);
  if (!pd || !cq) {
    complain("protection domain or CQ: " + (!pd ? pd.error() : cq.error()).message());
    return 1;
  }
  auto qp = pd->create_qp({.type = rdma::QpType::kRc, .send_cq = cq->get(), .recv_cq = cq->get()});
  if (!qp) {
    complain("QP: " + qp.error().message());
    return 1;
  }
  std::vector<uint8_t> buf(kBlock);
  auto mr = pd->register_mr(buf.data(), buf.size(), rdma::kLocalWrite);
  if (!mr) {
    complain("registering the source buffer: " + mr.error().message());
    return 1;
  }
  auto remote = exchange::exchange_as_client("127.0.0.1", o.port, (*qp)->local(), seconds(120));
  if (!remote) {
    complain(remote.error().message());
    return 1;
  }
  if (auto s = (*qp)->connect(*remote); !s) {
    complain("connecting the initiator's QP: " + s.error().message());
    return 1;
  }
  const uint64_t length = remote->length;
  const uint32_t per_area = static_cast<uint32_t>(length / 2 / kBlock);
  if (per_area == 0) {
    complain("the target offers " + std::to_string(length) + " bytes: too few for two areas of 4 KiB blocks");
    return 1;
  }
  // The check on the host reads the seed and the layout lines.
  say("seed " + std::to_string(o.seed));
  say(std::string("committed blocks: ") +
      (o.control_only ? "none (--control-only)"
       : o.commit_style == "flag" ? "WRITE with UFAB_SEND_COMMIT"
                                  : "WRITE, then FLUSH PERSISTENT of its range") +
      "; control blocks: WRITE, then FLUSH GLOBAL of its range");
  say("layout length " + std::to_string(length) + " block " + std::to_string(kBlock) + " control_at " +
      std::to_string(length / 2) + " blocks_per_area " + std::to_string(per_area));
  const auto commit_order = order(o.seed, kCommit, per_area);
  const auto control_order = order(o.seed, kControl, per_area);
  auto deadline = Clock::now() + seconds(o.seconds);

  // One block: WRITE it, then make it durable (commit) or only visible
  // (control), and wait for the last completion.
  auto write_block = [&](uint32_t area, uint32_t n) -> Status {
    fill_block(std::span<uint8_t, kBlock>(buf.data(), kBlock), o.seed, area, n);
    const uint64_t at = remote->addr + (area == kCommit ? 0 : length / 2) + uint64_t{n} * kBlock;
    const rdma::Sge sge = mr->sge(0, kBlock);
    std::vector<rdma::SendWr> wrs;
    const uint64_t id = (uint64_t{area} << 32) | n;
    const bool commit_flag = area == kCommit && o.commit_style == "flag";
    // The completion that ends the block: the WRITE's with the commit
    // flag, the FLUSH's otherwise.
    const rdma::WcOpcode last = commit_flag ? rdma::WcOpcode::kRdmaWrite : rdma::WcOpcode::kFlush;
    if (commit_flag) {
      wrs.push_back({.wr_id = id, .opcode = rdma::WrOpcode::kRdmaWrite, .flags = rdma::kSendSignaled | rdma::kSendCommit,
                     .sgl = {&sge, 1}, .remote_addr = at, .rkey = remote->rkey});
    } else {
      wrs.push_back({.wr_id = id, .opcode = rdma::WrOpcode::kRdmaWrite, .sgl = {&sge, 1}, .remote_addr = at,
                     .rkey = remote->rkey});
      wrs.push_back({.wr_id = id,
                     .opcode = rdma::WrOpcode::kFlush,
                     .flags = rdma::kSendSignaled,
                     .remote_addr = at,
                     .rkey = remote->rkey,
                     .flush_type = area == kCommit ? rdma::kFlushTypePersistent : rdma::kFlushTypeGlobal,
                     .flush_level = rdma::kFlushRange,
                     .flush_length = kBlock});
    }
    if (auto s = (*qp)->post_send(wrs); !s) return std::unexpected(s.error().context("posting"));
    const auto limit = Clock::now() + seconds(60);
    rdma::WorkCompletion wc[8];
    while (Clock::now() < limit) {
      auto got = (*cq)->wait(wc, milliseconds(1000));
      if (!got) return std::unexpected(got.error().context("waiting for the completion"));
      for (size_t i = 0; i < *got; ++i) {
        if (wc[i].status != rdma::WcStatus::kSuccess) {
          return fail(EIO, std::string(rdma::wc_opcode_name(wc[i].opcode)) + " failed: " +
                               rdma::wc_status_name(wc[i].status) + ": " + wc[i].error);
        }
        if (wc[i].wr_id == id && wc[i].opcode == last) return {};
        return fail(EPROTO, std::string("unexpected completion: ") + rdma::wc_opcode_name(wc[i].opcode) +
                                " for wr_id " + std::to_string(wc[i].wr_id) + ", waiting for the " +
                                rdma::wc_opcode_name(last) + " of wr_id " + std::to_string(id));
      }
    }
    return fail(ETIMEDOUT, "no completion within 60 s");
  };

  auto t0 = Clock::now();
  uint32_t done = 0;
  for (uint32_t i = 0; i < per_area && Clock::now() < deadline; ++i) {
    if (!o.control_only) {
      if (auto s = write_block(kCommit, commit_order[i]); !s) {
        complain("committed block " + std::to_string(commit_order[i]) + ": " + s.error().message());
        return 1;
      }
      say("committed block " + std::to_string(commit_order[i]));
    }
    if (auto s = write_block(kControl, control_order[i]); !s) {
      complain("control block " + std::to_string(control_order[i]) + ": " + s.error().message());
      return 1;
    }
    say("control block " + std::to_string(control_order[i]));
    ++done;
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f", done / std::max(secs, 1e-3));
  say("initiator: wrote every block it had time or room for (" + std::to_string(done) + " per area, " + rate +
      " pairs/s); idling until the kill");
  while (Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(200));
  return 0;
}

// ----------------------------------------------------------------- check

struct Log {
  std::optional<uint64_t> seed;
  uint64_t length = 0;
  std::vector<uint32_t> committed, control;
};

// Only whole lines count: the kill may cut the last one short.
Result<Log> read_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail_errno("reading the log " + path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Log log;
  size_t at = 0;
  auto number_after = [](std::string_view line, std::string_view prefix, uint64_t& out) {
    return line.starts_with(prefix) && parse_number(line.substr(prefix.size()), out);
  };
  while (true) {
    size_t nl = all.find('\n', at);
    if (nl == std::string::npos) break;
    std::string_view line(all.data() + at, nl - at);
    at = nl + 1;
    uint64_t v = 0;
    if (number_after(line, "power_loss: committed block ", v)) {
      log.committed.push_back(static_cast<uint32_t>(v));
    } else if (number_after(line, "power_loss: control block ", v)) {
      log.control.push_back(static_cast<uint32_t>(v));
    } else if (number_after(line, "power_loss: seed ", v)) {
      log.seed = v;
    } else if (line.starts_with("power_loss: layout length ")) {
      std::string_view rest = line.substr(std::string_view("power_loss: layout length ").size());
      rest = rest.substr(0, rest.find(' '));
      if (!parse_number(rest, log.length)) return fail(EINVAL, path + ": bad layout line '" + std::string(line) + "'");
    }
  }
  if (!log.seed || log.length == 0) {
    return fail(EINVAL, path + " has no 'power_loss: seed' and 'layout' lines: the initiator never got going");
  }
  return log;
}

int run_check(const Options& o) {
  auto log = read_log(o.log);
  if (!log) {
    complain("check: " + log.error().message());
    return 2;
  }
  UniqueFd fd(::open(o.image.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    complain("check: cannot open the image " + o.image + ": " + std::strerror(errno));
    return 2;
  }
  std::array<uint8_t, kBlock> got{}, want{};
  auto read_block = [&](uint32_t area, uint32_t n) -> Status {
    uint64_t off = (area == kCommit ? 0 : log->length / 2) + uint64_t{n} * kBlock;
    ssize_t r = ::pread(fd.get(), got.data(), kBlock, static_cast<off_t>(off));
    if (r < 0) return fail_errno("pread at " + std::to_string(off) + " of " + o.image);
    if (r != kBlock) return fail(EIO, o.image + " ends before block " + std::to_string(n) + " (offset " + std::to_string(off) + ")");
    fill_block(want, *log->seed, area, n);
    return {};
  };
  uint64_t lost = 0, control_present = 0;
  std::set<uint32_t> seen;
  for (uint32_t n : log->committed) {
    if (!seen.insert(n).second) continue;
    if (auto s = read_block(kCommit, n); !s) {
      complain("check: " + s.error().message());
      return 2;
    }
    if (got != want) {
      ++lost;
      say("FAIL: committed block " + std::to_string(n) + " is not on the disk: " + describe(got, want));
    }
  }
  std::string present_list;  // "block 1733 (completed 1st of the control blocks), ...", the first 10
  for (size_t i = 0; i < log->control.size(); ++i) {
    const uint32_t n = log->control[i];
    if (auto s = read_block(kControl, n); !s) {
      complain("check: " + s.error().message());
      return 2;
    }
    if (got != want) continue;
    if (++control_present <= 10) {
      present_list += (present_list.empty() ? "" : ", ") + std::string("block ") + std::to_string(n) +
                      " (completed as control block number " + std::to_string(i + 1) + ")";
    }
  }
  if (control_present > 0) {
    say("control blocks on the disk although only FLUSH GLOBAL followed them (the guest wrote them back on its "
        "own): " + present_list + (control_present > 10 ? ", ..." : ""));
  }
  const uint64_t committed = seen.size(), control = log->control.size();
  std::string verdict = "PASS";
  if (lost > 0) {
    verdict = "FAIL";
    say("FAIL: " + std::to_string(lost) + " of " + std::to_string(committed) + " committed blocks lost");
  }
  if (control == 0) {
    verdict = "FAIL";
    say("FAIL: no control block was reported complete: nothing shows the kill lost the guest's page cache");
  } else if (control_present == control) {
    verdict = "FAIL";
    say("FAIL: all " + std::to_string(control) +
        " control blocks (FLUSH GLOBAL only) are on the disk: the guest's page cache reached the disk without a "
        "FLUSH PERSISTENT, so this run proves nothing about it (check the guest's vm.dirty_* settings and QEMU's cache mode)");
  }
  say("result committed=" + std::to_string(committed) + " lost=" + std::to_string(lost) + " control=" +
      std::to_string(control) + " control_present=" + std::to_string(control_present) + " " + verdict);
  return verdict == "PASS" ? 0 : 1;
}

}  // namespace
}  // namespace ufab

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  auto o = ufab::parse(argc, argv);
  if (!o) {
    std::fprintf(stderr, "power_loss: %s\n%s", o.error().message().c_str(), ufab::kUsage);
    return 2;
  }
  if (o->role == "target") return ufab::run_target(*o);
  if (o->role == "initiator") return ufab::run_initiator(*o);
  return ufab::run_check(*o);
}
