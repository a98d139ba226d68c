// ICRC micro-benchmark: MB/s of each CRC implementation on RoCEv2 frames
// with 64 B, 1 KiB and 4 KiB payloads, plus the whole parse (every check,
// ICRC included) and the whole build with the implementation kAuto picks.
// Then crc32_update alone over raw buffers of 16 to 4096 bytes (and 40, the
// masked header icrc_begin walks), and icrc_begin itself, per implementation.
// A benchmark, not a test: it prints a table (and JSON with --json FILE)
// and never fails on a number.
//
//   bazel build //tests/bench:icrc_bench && bazel-bin/tests/bench/icrc_bench [--json out.json] [--ms N]
//
// MB/s counts payload bytes (10^6 bytes per second); "icrc MB/s" counts
// every byte the ICRC covers (40 header bytes, extension headers, payload,
// pad), which is what the CRC code actually walks.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/json.h"
#include "core/roce/wire.h"

namespace {

using namespace ufab::roce;
using Clock = std::chrono::steady_clock;

volatile uint32_t g_sink;

// Runs `fn` in rounds until `ms` milliseconds have passed, five times, and
// returns the best nanoseconds per call.
template <typename Fn>
double best_ns_per_call(Fn&& fn, int ms) {
  double best = 1e300;
  for (int trial = 0; trial < 5; ++trial) {
    uint64_t calls = 0;
    auto start = Clock::now();
    auto stop = start + std::chrono::milliseconds(ms);
    auto now = start;
    do {
      for (int i = 0; i < 256; ++i) fn();
      calls += 256;
      now = Clock::now();
    } while (now < stop);
    double ns = std::chrono::duration<double, std::nano>(now - start).count() / static_cast<double>(calls);
    if (ns < best) best = ns;
  }
  return best;
}

struct Row {
  size_t payload;
  std::string what;
  double ns;
  double mbps;       // payload bytes
  double icrc_mbps;  // bytes covered by the ICRC
};

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  int ms = 200;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc) {
      ms = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--ms MILLISECONDS_PER_TRIAL]\n", argv[0]);
      return 2;
    }
  }

  std::vector<Row> rows;
  for (size_t payload_len : {size_t{64}, size_t{1024}, size_t{4096}}) {
    FrameSpec spec;
    spec.src_ip = 0x0A000001;
    spec.dst_ip = 0x0A000002;
    spec.bth.opcode = op::kRcWriteMiddle;  // BTH only: the common bulk packet
    spec.bth.dest_qp = 0x11;
    std::vector<uint8_t> payload(payload_len);
    for (size_t i = 0; i < payload_len; ++i) payload[i] = static_cast<uint8_t>(i * 131 + 7);
    std::vector<uint8_t> frame(frame_length(spec.bth.opcode, payload_len));
    if (!build_frame(spec, payload, frame)) return 1;
    auto datagram = std::span<const uint8_t>(frame).subspan(kEthBytes, frame.size() - kEthBytes - kIcrcBytes);
    const double covered = static_cast<double>(datagram.size());

    auto add = [&](std::string what, double ns) {
      rows.push_back({payload_len, std::move(what), ns, payload_len / ns * 1e3, covered / ns * 1e3});
    };
    for (CrcImpl impl : {CrcImpl::kBytewise, CrcImpl::kSlice8, CrcImpl::kPclmul}) {
      if (!crc_impl_available(impl)) {
        std::printf("# %s not available on this CPU\n", crc_impl_name(impl));
        continue;
      }
      add(std::string("icrc ") + crc_impl_name(impl), best_ns_per_call([&] { g_sink = icrc_ipv4(datagram, impl); }, ms));
    }
    add("parse_frame", best_ns_per_call([&] { g_sink = parse_frame(frame).packet.icrc; }, ms));
    std::vector<uint8_t> out(frame.size());
    add("build_frame", best_ns_per_call([&] { g_sink = static_cast<uint32_t>(build_frame(spec, payload, out).length); }, ms));
  }

  // Raw CRC over n bytes: payload = covered = n.
  std::vector<Row> raw;
  {
    std::vector<uint8_t> buf(4096 + 64);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + 7);
    for (size_t n : {size_t{16}, size_t{40}, size_t{64}, size_t{128}, size_t{256}, size_t{1024}, size_t{4096}}) {
      auto data = std::span<const uint8_t>(buf.data() + 1, n);  // unaligned, as frames are
      for (CrcImpl impl : {CrcImpl::kBytewise, CrcImpl::kSlice8, CrcImpl::kPclmul}) {
        if (!crc_impl_available(impl)) continue;
        double ns = best_ns_per_call([&] { g_sink = crc32_update(g_sink, data, impl); }, ms);
        raw.push_back({n, std::string("crc32 ") + crc_impl_name(impl), ns, n / ns * 1e3, n / ns * 1e3});
      }
    }
    auto hdr = std::span<const uint8_t, kIcrcHeaderBytes>(buf.data() + 3, kIcrcHeaderBytes);
    for (CrcImpl impl : {CrcImpl::kBytewise, CrcImpl::kSlice8, CrcImpl::kPclmul}) {
      if (!crc_impl_available(impl)) continue;
      double ns = best_ns_per_call([&] { g_sink = icrc_begin(hdr, impl); }, ms);
      raw.push_back({kIcrcHeaderBytes, std::string("icrc_begin ") + crc_impl_name(impl), ns, 40 / ns * 1e3, 40 / ns * 1e3});
    }
  }

  std::printf("%-8s %-16s %10s %10s %12s\n", "payload", "what", "ns/frame", "MB/s", "icrc MB/s");
  for (const auto& r : rows)
    std::printf("%-8zu %-16s %10.1f %10.0f %12.0f\n", r.payload, r.what.c_str(), r.ns, r.mbps, r.icrc_mbps);
  std::printf("\n%-8s %-20s %10s %10s\n", "bytes", "what", "ns/call", "MB/s");
  for (const auto& r : raw) std::printf("%-8zu %-20s %10.1f %10.0f\n", r.payload, r.what.c_str(), r.ns, r.mbps);
  std::printf("(best of 5 x %d ms; auto = %s)\n", ms, crc_impl_name(best_crc_impl()));

  if (json_path) {
    ufab::JsonWriter w;
    w.begin_object().field("benchmark", "icrc").field("auto", crc_impl_name(best_crc_impl()));
    w.key("rows").begin_array();
    for (const auto& r : rows)
      w.begin_object()
          .field("payload", static_cast<uint64_t>(r.payload))
          .field("what", r.what)
          .field("ns_per_frame", r.ns)
          .field("mb_per_s", r.mbps)
          .field("icrc_mb_per_s", r.icrc_mbps)
          .end_object();
    w.end_array();
    w.key("raw").begin_array();
    for (const auto& r : raw)
      w.begin_object()
          .field("bytes", static_cast<uint64_t>(r.payload))
          .field("what", r.what)
          .field("ns_per_call", r.ns)
          .field("mb_per_s", r.mbps)
          .end_object();
    w.end_array().end_object();
    FILE* f = std::fopen(json_path, "w");
    if (!f || std::fprintf(f, "%s\n", w.str().c_str()) < 0 || std::fclose(f) != 0) {
      std::perror(json_path);
      return 1;
    }
  }
  return 0;
}
