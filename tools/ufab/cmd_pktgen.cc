// ufab pktgen FROM TO: raw frame rate between two ports, counted at TO.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "base/json.h"
#include "core/nic_open.h"
#include "core/traffic.h"
#include "drivers/builtin.h"
#include "tools/ufab/cli.h"

namespace ufab::cli {
namespace {

struct Port {
  std::unique_ptr<core::Nic> nic;
  std::shared_ptr<dma::BufferPool> pool;
};

Result<Port> open_port(const core::PluginRegistry& registry, const std::string& spec, const core::NicParams& params) {
  Port p;
  auto nic = core::open_nic(registry, spec, core::OpenOptions{.params = params, .env = {}});
  if (!nic) return std::unexpected(nic.error());
  p.nic = std::move(*nic);
  auto pool = p.nic->create_pool(4096);
  if (!pool) return std::unexpected(pool.error());
  p.pool = *pool;
  // The RX ring is twice the TX ring so a receiver that keeps up never runs
  // dry behind a full sender (see docs/drivers/virtio_net.md on QEMU's hub).
  uint32_t rx_ring = std::min<uint32_t>(256, p.nic->info().max_ring_size);
  if (auto s = p.nic->setup_rx_queue(0, rx_ring, *p.pool); !s) return std::unexpected(s.error());
  if (auto s = p.nic->setup_tx_queue(0, rx_ring / 2); !s) return std::unexpected(s.error());
  if (auto s = p.nic->start(); !s) return std::unexpected(s.error());
  return p;
}

Result<std::pair<uint32_t, uint32_t>> size_option(const Options& opts) {
  const std::string* v = opts.value("size");
  if (!v) return std::pair<uint32_t, uint32_t>{core::kMinTestFrame, core::kMaxTestFrame};
  unsigned lo = 0, hi = 0;
  char tail = 0;
  int n = std::sscanf(v->c_str(), "%u-%u%c", &lo, &hi, &tail);
  if (n == 1) hi = lo;
  if ((n != 1 && n != 2) || lo < core::kMinTestFrame || hi > core::kMaxTestFrame || lo > hi) {
    return fail(EINVAL, "--size " + *v + ": expected N or MIN-MAX within 60..1514 bytes (frame without FCS)");
  }
  return std::pair<uint32_t, uint32_t>{lo, hi};
}

}  // namespace

int cmd_pktgen(const Options& opts) {
  core::TransferSpec spec;
  auto count = number_option(opts, "count", 100000, 1, 1e12);
  auto duration = number_option(opts, "duration", 0, 0, 3600);
  auto burst = number_option(opts, "burst", 32, 1, 256);
  auto timeout = number_option(opts, "timeout", 120, 1, 86400);
  auto sizes = size_option(opts);
  for (const auto* r : {&count, &duration, &burst, &timeout}) {
    if (!*r) return report_error(opts, "pktgen", r->error());
  }
  if (!sizes) return report_error(opts, "pktgen", sizes.error());
  spec.frames = static_cast<uint64_t>(*count);
  spec.duration_s = *duration;
  spec.burst = static_cast<uint16_t>(*burst);
  spec.timeout_s = std::max(*timeout, *duration + 5);
  spec.min_size = sizes->first;
  spec.max_size = sizes->second;
  if (const std::string* v = opts.value("verify")) {
    if (*v == "header") {
      spec.verify = core::Verify::kHeader;
    } else if (*v != "full") {
      return report_error(opts, "pktgen", Error(EINVAL, "--verify " + *v + ": expected full or header"));
    }
  }
  core::NicParams params;
  if (auto it = opts.values.find("param"); it != opts.values.end()) {
    for (const auto& kv : it->second) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        return report_error(opts, "pktgen", Error(EINVAL, "--param " + kv + ": expected KEY=VALUE"));
      }
      params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }

  core::PluginRegistry registry = core::default_registry(drivers::builtin_drivers());
  auto from = open_port(registry, opts.args[0], params);
  if (!from) return report_error(opts, "pktgen", from.error());
  auto to = open_port(registry, opts.args[1], params);
  if (!to) return report_error(opts, "pktgen", to.error());
  if (!opts.json) {
    char amount[64];
    if (spec.duration_s > 0) {
      std::snprintf(amount, sizeof amount, "frames for %.1f s", spec.duration_s);
    } else {
      std::snprintf(amount, sizeof amount, "%llu frames", static_cast<unsigned long long>(spec.frames));
    }
    std::fprintf(stderr, "pktgen: %s -> %s, %s of %u..%u bytes, bursts of %u, verifying %s\n", opts.args[0].c_str(),
                 opts.args[1].c_str(), amount, spec.min_size, spec.max_size, spec.burst,
                 spec.verify == core::Verify::kFull ? "every byte" : "headers");
  }
  auto rep = core::run_transfer(*from->nic, *from->pool, *to->nic, *to->pool, spec);
  if (!rep) return report_error(opts, "pktgen", rep.error());
  auto tx_stats = from->nic->stats();
  auto rx_stats = to->nic->stats();

  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", rep->intact()).field("from", opts.args[0]).field("to", opts.args[1]);
    w.field("min_size", spec.min_size).field("max_size", spec.max_size).field("burst", spec.burst);
    w.field("verify", spec.verify == core::Verify::kFull ? "full" : "header");
    w.field("sent", rep->sent).field("received", rep->received).field("lost", rep->sent - std::min(rep->sent, rep->received));
    w.field("out_of_order", rep->out_of_order).field("corrupt", rep->corrupt).field("foreign", rep->foreign);
    w.field("timed_out", rep->timed_out).field("seconds", rep->seconds);
    w.field("frames_per_second", rep->frames_per_second()).field("bits_per_second", rep->bits_per_second());
    if (tx_stats) w.field("tx_device_packets", tx_stats->tx_packets);
    if (rx_stats) w.field("rx_device_packets", rx_stats->rx_packets).field("rx_device_dropped", rx_stats->rx_dropped);
    w.end_object();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("sent %llu, received %llu (lost %llu, out of order %llu, corrupt %llu) in %.3f s\n",
                static_cast<unsigned long long>(rep->sent), static_cast<unsigned long long>(rep->received),
                static_cast<unsigned long long>(rep->sent - std::min(rep->sent, rep->received)),
                static_cast<unsigned long long>(rep->out_of_order), static_cast<unsigned long long>(rep->corrupt),
                rep->seconds);
    std::printf("%.0f frames/s, %.1f Mbit/s at %s\n", rep->frames_per_second(), rep->bits_per_second() / 1e6,
                opts.args[1].c_str());
    if (rep->timed_out) std::printf("timed out after %.0f s (raise --timeout)\n", spec.timeout_s);
  }
  return rep->intact() ? kExitOk : kExitFailed;
}

}  // namespace ufab::cli
