// ufab info BDF: everything ufab knows about one device. From sysfs always;
// through VFIO (regions, IRQs, IOMMU, MAC) when the device is on vfio-pci,
// and then also as an RDMA device (its provider's capabilities: FLUSH,
// ATOMIC_WRITE, memory types, limits). `ufab info swnic:LINK:PORT` or
// `ufab info shm:DOMAIN`: the RDMA device view of a software device.
#include <cstdio>
#include <map>
#include <memory>

#include "core/provider/registries.h"
#include "base/hex.h"

#include "core/mac_probe.h"
#include "core/nic_open.h"
#include "core/pci/details.h"
#include "core/pci/discovery.h"
#include "drivers/builtin.h"
#include "tools/ufab/cli.h"
#include "tools/ufab/gpu_report.h"
#include "tools/ufab/render.h"
#include "tools/ufab/table.h"
#include "ufab/rdma.hpp"
#include "vfio/container.h"
#include "vfio/device.h"

namespace ufab::cli {
namespace {

struct RegionView {
  vfio::RegionInfo info;
  std::string name;
};

struct VfioView {
  vfio::DeviceInfo device;
  std::vector<RegionView> regions;
  std::vector<std::pair<std::string, uint32_t>> irqs;  // name, count
  vfio::IommuInfo iommu;
  std::optional<core::MacReading> mac;
  std::string mac_error;
};

std::string region_name(uint32_t index) {
  if (index < 6) return "BAR" + std::to_string(index);
  if (index == vfio::kRomRegion) return "ROM";
  if (index == vfio::kConfigRegion) return "config";
  if (index == 8) return "VGA";
  return "region " + std::to_string(index);
}

Result<VfioView> inspect_through_vfio(const Options& opts, const pci::DeviceInfo& d) {
  vfio::Environment env;
  env.sysfs_root = opts.host.paths.sysfs;
  env.dev_root = opts.host.paths.dev;
  env.proc_root = opts.host.paths.proc;
  auto container = vfio::Container::open(env);
  if (!container) return std::unexpected(container.error());
  auto device = vfio::Device::open(*container, d.address);
  if (!device) return std::unexpected(device.error());

  VfioView view;
  view.device = device->info();
  for (uint32_t i = 0; i < view.device.num_regions; ++i) {
    auto r = device->region_info(i);
    if (r && r->size > 0) view.regions.push_back({*r, region_name(i)});
  }
  for (auto kind : {vfio::IrqKind::intx, vfio::IrqKind::msi, vfio::IrqKind::msix}) {
    auto irq = device->irq_info(kind);
    if (irq) view.irqs.emplace_back(vfio::irq_kind_name(kind), irq->count);
  }
  view.iommu = (*container)->info();
  auto mac = core::read_mac(*device, d.vendor_id, d.device_id);
  if (!mac) {
    view.mac_error = mac.error().message();
  } else if (!*mac) {
    view.mac_error = "ufab does not know where this model keeps its MAC";
  } else {
    view.mac = **mac;
  }
  return view;
}

// What the driver plugin reports once it has the device open.
struct PluginView {
  std::string plugin;
  std::string origin;
  ufab_dev_info info{};
  std::optional<ufab_link> link;
  std::optional<ufab_stats> stats;
  std::string rdma_provider;  // which RDMA provider Device::open would use
};

// The provider the RDMA API picks for this device, or why none.
std::string rdma_provider_for(const std::string& name) {
  auto p = provider::providers().for_device(name);
  return p ? (*p)->name : "none (" + p.error().message() + ")";
}

Result<PluginView> inspect_through_plugin(const Options& opts, const pci::DeviceInfo& d) {
  core::PluginRegistry registry = core::default_registry(drivers::builtin_drivers());
  vfio::Environment env;
  env.sysfs_root = opts.host.paths.sysfs;
  env.dev_root = opts.host.paths.dev;
  env.proc_root = opts.host.paths.proc;
  auto plugin = core::plugin_for(registry, d.address.str(), env);
  if (!plugin) return std::unexpected(plugin.error());
  auto nic = core::Nic::open_pci((*plugin)->ops, d.address, {}, env);
  if (!nic) return std::unexpected(nic.error());
  PluginView v{(*plugin)->name, (*plugin)->origin, (*nic)->info(), std::nullopt, std::nullopt,
               rdma_provider_for(d.address.str())};
  if (auto l = (*nic)->link()) v.link = *l;
  if (auto st = (*nic)->stats()) v.stats = *st;
  return v;
}

std::string mac_text(const uint8_t* m) {
  core::MacAddress mac;
  std::copy(m, m + 6, mac.begin());
  return core::format_mac(mac);
}

std::string region_flags(const vfio::RegionInfo& r) {
  std::string s = r.readable() ? "r" : "-";
  s += r.writable() ? "w" : "-";
  s += r.mappable() ? "m" : "-";
  return s;
}

void print_plugin(const std::optional<Result<PluginView>>& plugin) {
  if (!plugin) return;
  if (!*plugin) {
    std::printf("  driver plugin unavailable: %s\n", plugin->error().message().c_str());
    return;
  }
  const PluginView& p = **plugin;
  std::printf("  driver plugin %s (%s): %s\n", p.plugin.c_str(), p.origin.c_str(), p.info.model);
  std::printf("    mac         %s\n", mac_text(p.info.mac).c_str());
  std::printf("    rdma        %s (over this plugin)\n", p.rdma_provider.c_str());
  if (p.link) {
    std::printf("    link        %s, %u Mb/s\n", p.link->up ? "up" : "down", p.link->speed_mbps);
  }
  std::printf("    queues      rx %u, tx %u, ring %u..%u descriptors, mtu %u (max %u)%s\n", p.info.max_rx_queues,
              p.info.max_tx_queues, p.info.min_ring_size, p.info.max_ring_size, p.info.mtu, p.info.max_mtu,
              (p.info.caps & UFAB_DEV_CAP_RX_IRQ) ? ", rx interrupts" : "");
  if (p.stats) {
    std::printf("    statistics  rx %llu frames %llu bytes, tx %llu frames %llu bytes, dropped %llu, errors %llu\n",
                static_cast<unsigned long long>(p.stats->rx_packets), static_cast<unsigned long long>(p.stats->rx_bytes),
                static_cast<unsigned long long>(p.stats->tx_packets), static_cast<unsigned long long>(p.stats->tx_bytes),
                static_cast<unsigned long long>(p.stats->rx_dropped),
                static_cast<unsigned long long>(p.stats->rx_errors + p.stats->tx_errors));
  }
}

void print_text(const pci::DeviceInfo& d, const Result<pci::DeviceDetails>& details,
                const std::optional<Result<VfioView>>& vfio) {
  std::printf("%s  %s [%s:%s]\n", d.address.str().c_str(), device_title(d).c_str(), hex_digits(d.vendor_id, 4).c_str(),
              hex_digits(d.device_id, 4).c_str());
  std::printf("  class         %s %s\n", hex_digits(d.class_code, 6).c_str(), d.class_name.c_str());
  std::printf("  driver        %s\n", d.driver.empty() ? "none" : d.driver.c_str());
  std::printf("  ufab          %s: %s\n", pci::readiness_name(d.readiness), d.readiness_reason.c_str());
  std::string members;
  for (const auto& m : d.group_members) {
    members += (members.empty() ? "" : ", ") + m.name + " (" + (m.driver.empty() ? "no driver" : m.driver) + ")";
  }
  std::printf("  iommu group   %s%s%s\n", group_text(d).c_str(), members.empty() ? "" : ": ", members.c_str());
  std::printf("  numa node     %s\n", d.numa_node < 0 ? "-" : std::to_string(d.numa_node).c_str());
  // Emulated and virtual functions report "Unknown" speed and widths of 0 or 255.
  bool link_known = d.current_link_speed && d.current_link_speed->rfind("Unknown", 0) != 0 &&
                    d.current_link_width.value_or(0) > 0 && d.current_link_width.value_or(0) <= 32;
  if (link_known) {
    std::printf("  pcie link     %s x%u (max %s x%u)\n", d.current_link_speed->c_str(), *d.current_link_width,
                d.max_link_speed.value_or("?").c_str(), d.max_link_width.value_or(0));
  } else if (d.current_link_speed) {
    std::printf("  pcie link     not reported by the device\n");
  }
  for (const auto& nic : d.interfaces) {
    std::string addrs;
    for (const auto& a : nic.addresses) addrs += " " + a.str();
    std::printf("  netdev        %s %s mac %s%s\n", nic.name.c_str(), nic.operstate.c_str(), nic.mac.c_str(),
                addrs.c_str());
  }
  if (!details) {
    std::printf("  details       unavailable: %s\n", details.error().message().c_str());
  } else {
    Table bars({"  RESOURCE", "TYPE", "SIZE", "ADDRESS"});
    for (const auto& r : details->resources) {
      std::string type = r.io ? "I/O" : (std::string(r.is_64bit ? "mem64" : "mem32") + (r.prefetchable ? " pref" : ""));
      bars.add({"  " + r.name(), type, human_size(r.size), hex(r.start)});
    }
    if (!bars.empty()) std::fputs(bars.render().c_str(), stdout);
    std::printf("  capabilities\n");
    for (const auto& c : details->capabilities.capabilities) {
      std::printf("    %03x %-28s %s\n", c.offset, c.name.c_str(), c.detail.c_str());
    }
    if (details->capabilities.msix) std::printf("  msi-x         %u vectors\n", details->capabilities.msix->vectors);
    for (const auto& n : details->notes) std::printf("  note          %s\n", n.c_str());
  }
  if (!vfio) return;
  if (!*vfio) {
    std::printf("  vfio          unavailable: %s\n", vfio->error().message().c_str());
    return;
  }
  const VfioView& v = **vfio;
  std::printf("  vfio          %u regions, %u irq indexes, reset %s\n", v.device.num_regions, v.device.num_irqs,
              v.device.reset_supported() ? "supported" : "not supported");
  Table regions({"    REGION", "SIZE", "FLAGS", "MMAP AREAS"});
  for (const auto& r : v.regions) {
    std::string areas;
    if (r.info.mappable()) {
      for (const auto& a : r.info.mappable_areas()) {
        areas += (areas.empty() ? "" : " ") + hex(a.offset) + "+" + human_size(a.size);
      }
    }
    regions.add({"    " + r.name, human_size(r.info.size), region_flags(r.info), areas.empty() ? "-" : areas});
  }
  std::fputs(regions.render().c_str(), stdout);
  std::string irqs;
  for (const auto& [name, count] : v.irqs) irqs += (irqs.empty() ? "" : ", ") + name + " " + std::to_string(count);
  std::printf("    irqs        %s\n", irqs.c_str());
  std::string ranges;
  for (const auto& r : v.iommu.iova_ranges) {
    ranges += (ranges.empty() ? "" : ", ") + hex(r.first) + "-" + hex(r.last);
  }
  std::printf("    iommu       page sizes 0x%llx, iova %s\n", static_cast<unsigned long long>(v.iommu.page_sizes),
              ranges.c_str());
  if (v.mac) {
    std::printf("    mac         %s (read from %s)\n", core::format_mac(v.mac->mac).c_str(), v.mac->source.c_str());
  } else {
    std::printf("    mac         unknown: %s\n", v.mac_error.c_str());
  }
}

// ---------------------------------------------------------- the RDMA view

struct RdmaView {
  ufab_device_attr attr{};
  bool placeholder_ip = false;  // opened with kQueryIp: the address means nothing
};

// A soft-RoCE port needs an IPv4 address to open; none of what info shows
// depends on it. Without --ip, this one (TEST-NET-1, RFC 5737) is used for
// the query and not shown. Nothing is sent.
constexpr const char* kQueryIp = "192.0.2.1";

// Opens `name` through the RDMA API (the provider the name picks), reads
// its attributes, closes it again.
Result<RdmaView> inspect_rdma(const Options& opts, const std::string& name) {
  auto p = provider::providers().for_device(name);
  if (!p) return std::unexpected(p.error());
  RdmaView v;
  std::string ip;
  if (const std::string* given = opts.value("ip")) {
    ip = *given;
  } else if ((*p)->name == "soft-roce") {
    ip = kQueryIp;
    v.placeholder_ip = true;
  }
  std::map<std::string, std::string> params;
  if (auto it = opts.values.find("param"); it != opts.values.end()) {
    for (const auto& kv : it->second) {
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) return fail(EINVAL, "--param " + kv + ": expected KEY=VALUE");
      params[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  auto dev = rdma::Device::open(name, {.ip = ip, .params = params});
  if (!dev) return std::unexpected(dev.error().context("opening " + name + " as an RDMA device"));
  v.attr = (*dev)->attr();
  return v;
}

struct CapName {
  uint32_t bit;
  const char* name;
};
constexpr CapName kCaps[] = {
    {UFAB_DEVICE_CAP_UD, "ud"},
    {UFAB_DEVICE_CAP_ATOMICS, "atomics"},
    {UFAB_DEVICE_CAP_WIRE_ROCEV2, "rocev2"},
    {UFAB_DEVICE_CAP_FLUSH_GLOBAL, "flush_global"},
    {UFAB_DEVICE_CAP_FLUSH_PERSISTENT, "flush_persistent"},
    {UFAB_DEVICE_CAP_ATOMIC_WRITE, "atomic_write"},
};
constexpr CapName kMemTypes[] = {
    {UFAB_MEM_HOST, "host"},
    {UFAB_MEM_CUDA, "cuda"},
    {UFAB_MEM_PERSISTENT, "persistent"},
};

std::vector<std::string> cap_names(uint32_t caps) {
  std::vector<std::string> out;
  uint32_t known = 0;
  for (const auto& c : kCaps) {
    known |= c.bit;
    if (caps & c.bit) out.emplace_back(c.name);
  }
  for (uint32_t b = 0; b < 32; ++b) {
    if ((caps & ~known) & (1u << b)) out.push_back("bit" + std::to_string(b));
  }
  return out;
}

std::vector<std::string> mem_type_names(uint32_t mask) {
  std::vector<std::string> out;
  uint32_t known = 0;
  for (const auto& m : kMemTypes) {
    known |= 1u << m.bit;
    if (mask & (1u << m.bit)) out.emplace_back(m.name);
  }
  for (uint32_t b = 0; b < 32; ++b) {
    if ((mask & ~known) & (1u << b)) out.push_back("type" + std::to_string(b));
  }
  return out;
}

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out.empty() ? "none" : out;
}

std::string ipv4_text(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string((ip >> 16) & 255) + "." + std::to_string((ip >> 8) & 255) +
         "." + std::to_string(ip & 255);
}

const char* yes(bool b) { return b ? "yes" : "no"; }

void print_rdma(const Result<RdmaView>& r, const char* indent) {
  if (!r) {
    std::printf("%srdma device   unavailable: %s\n", indent, r.error().message().c_str());
    return;
  }
  const ufab_device_attr& a = r->attr;
  std::printf("%srdma device   %s (provider %s): %s\n", indent, a.name, a.provider, a.transport);
  if (!r->placeholder_ip) {
    std::printf("%s  address     %s\n", indent, ipv4_text(a.ip).c_str());
  }
  std::printf("%s  mtu         %u (active)\n", indent, a.active_mtu);
  std::printf("%s  caps        %s\n", indent, joined(cap_names(a.caps), " ").c_str());
  // IBA's memory placement extensions.
  std::printf("%s  placement   flush global %s, flush persistent %s, atomic write %s\n", indent,
              yes(a.caps & UFAB_DEVICE_CAP_FLUSH_GLOBAL), yes(a.caps & UFAB_DEVICE_CAP_FLUSH_PERSISTENT),
              yes(a.caps & UFAB_DEVICE_CAP_ATOMIC_WRITE));
  std::printf("%s  memory      %s\n", indent, joined(mem_type_names(a.mem_types), ", ").c_str());
  std::printf("%s  limits      qp %u, wr %u, sge %u, inline %u, cqe %u, rd_atom %u, mr %s\n", indent, a.max_qp,
              a.max_qp_wr, a.max_sge, a.max_inline_data, a.max_cqe, a.max_qp_rd_atom, human_size(a.max_mr_size).c_str());
}

void write_rdma_json(JsonWriter& w, const std::optional<Result<RdmaView>>& r) {
  w.key("rdma");
  if (!r) {
    w.null();
    return;
  }
  if (!*r) {
    w.begin_object().field("error", r->error().message()).end_object();
    return;
  }
  const ufab_device_attr& a = (*r)->attr;
  w.begin_object().field("name", std::string(a.name)).field("provider", std::string(a.provider));
  w.field("transport", std::string(a.transport)).key("ip");
  if ((*r)->placeholder_ip) {
    w.null();
  } else {
    w.value(ipv4_text(a.ip));
  }
  w.field("active_mtu", a.active_mtu).field("caps_mask", a.caps).key("caps").begin_array();
  for (const auto& c : cap_names(a.caps)) w.value(c);
  w.end_array();
  w.field("flush_global", (a.caps & UFAB_DEVICE_CAP_FLUSH_GLOBAL) != 0);
  w.field("flush_persistent", (a.caps & UFAB_DEVICE_CAP_FLUSH_PERSISTENT) != 0);
  w.field("atomic_write", (a.caps & UFAB_DEVICE_CAP_ATOMIC_WRITE) != 0);
  w.field("mem_types_mask", a.mem_types).key("mem_types").begin_array();
  for (const auto& m : mem_type_names(a.mem_types)) w.value(m);
  w.end_array();
  w.field("max_qp", a.max_qp).field("max_qp_wr", a.max_qp_wr).field("max_sge", a.max_sge);
  w.field("max_inline_data", a.max_inline_data).field("max_cqe", a.max_cqe).field("max_qp_rd_atom", a.max_qp_rd_atom);
  w.field("max_mr_size", a.max_mr_size).end_object();
}

void write_plugin_json(JsonWriter& w, const std::optional<Result<PluginView>>& plugin) {
  w.key("plugin");
  if (!plugin) {
    w.null();
    return;
  }
  if (!*plugin) {
    w.begin_object().field("error", plugin->error().message()).end_object();
    return;
  }
  const PluginView& p = **plugin;
  w.begin_object().field("name", p.plugin).field("origin", p.origin).field("model", std::string(p.info.model));
  w.field("mac", mac_text(p.info.mac)).field("rdma_provider", p.rdma_provider).field("max_rx_queues", p.info.max_rx_queues);
  w.field("max_tx_queues", p.info.max_tx_queues).field("min_ring_size", p.info.min_ring_size);
  w.field("max_ring_size", p.info.max_ring_size).field("mtu", p.info.mtu).field("max_mtu", p.info.max_mtu);
  w.field("rx_irq", (p.info.caps & UFAB_DEV_CAP_RX_IRQ) != 0);
  if (p.link) {
    w.key("link").begin_object().field("up", p.link->up != 0).field("speed_mbps", p.link->speed_mbps).end_object();
  }
  if (p.stats) {
    w.key("stats").begin_object().field("rx_packets", p.stats->rx_packets).field("rx_bytes", p.stats->rx_bytes);
    w.field("tx_packets", p.stats->tx_packets).field("tx_bytes", p.stats->tx_bytes);
    w.field("rx_dropped", p.stats->rx_dropped).field("rx_errors", p.stats->rx_errors);
    w.field("tx_errors", p.stats->tx_errors).end_object();
  }
  w.end_object();
}

void write_json(const pci::DeviceInfo& d, const Result<pci::DeviceDetails>& details,
                const std::optional<Result<VfioView>>& vfio, const std::optional<Result<PluginView>>& plugin,
                const std::optional<Result<RdmaView>>& rdma) {
  JsonWriter w;
  w.begin_object().field("ok", true);
  write_device_fields(w, d);
  if (details) {
    w.key("resources").begin_array();
    for (const auto& r : details->resources) {
      w.begin_object().field("name", r.name()).field("start", r.start).field("size", r.size);
      w.field("io", r.io).field("is_64bit", r.is_64bit).field("prefetchable", r.prefetchable).end_object();
    }
    w.end_array().key("capabilities").begin_array();
    for (const auto& c : details->capabilities.capabilities) {
      w.begin_object().field("id", hex_digits(c.id, 2)).field("offset", hex_digits(c.offset, 3)).field("extended", c.extended);
      w.field("name", c.name).field("detail", c.detail).end_object();
    }
    w.end_array().key("msix_vectors");
    if (details->capabilities.msix) {
      w.value(details->capabilities.msix->vectors);
    } else {
      w.null();
    }
  } else {
    w.field("details_error", details.error().message());
  }
  w.key("vfio");
  if (!vfio) {
    w.null();
  } else if (!*vfio) {
    w.begin_object().field("error", vfio->error().message()).end_object();
  } else {
    const VfioView& v = **vfio;
    w.begin_object().field("num_regions", v.device.num_regions).field("num_irqs", v.device.num_irqs);
    w.field("reset_supported", v.device.reset_supported());
    w.key("regions").begin_array();
    for (const auto& r : v.regions) {
      w.begin_object().field("index", r.info.index).field("name", r.name).field("size", r.info.size);
      w.field("readable", r.info.readable()).field("writable", r.info.writable());
      w.field("mappable", r.info.mappable()).key("mmap_areas").begin_array();
      if (r.info.mappable()) {
        for (const auto& a : r.info.mappable_areas()) {
          w.begin_object().field("offset", a.offset).field("size", a.size).end_object();
        }
      }
      w.end_array().end_object();
    }
    w.end_array().key("irqs").begin_object();
    for (const auto& [name, count] : v.irqs) w.field(name, count);
    w.end_object().key("iommu").begin_object().field("page_sizes", v.iommu.page_sizes).key("iova_ranges").begin_array();
    for (const auto& r : v.iommu.iova_ranges) {
      w.begin_object().field("first", r.first).field("last", r.last).end_object();
    }
    w.end_array().end_object();
    if (v.mac) {
      w.field("mac", core::format_mac(v.mac->mac)).field("mac_source", v.mac->source);
    } else {
      w.key("mac").null().field("mac_error", v.mac_error);
    }
    w.end_object();
  }
  write_plugin_json(w, plugin);
  write_rdma_json(w, rdma);
  w.end_object();
  std::printf("%s\n", w.str().c_str());
}

// `ufab info swnic:LINK:PORT`, `ufab info shm:DOMAIN`: a device that is no
// PCI function, only its RDMA view.
int info_software_device(const Options& opts, const std::string& name) {
  auto r = inspect_rdma(opts, name);
  if (!r) return report_error(opts, "info", r.error());
  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", true).field("device", name);
    write_rdma_json(w, std::optional<Result<RdmaView>>(std::move(r)));
    w.end_object();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("%s  software device\n", name.c_str());
    print_rdma(r, "  ");
  }
  return kExitOk;
}

// `ufab info gpu`: the GPU support found (gpu_report.h). No GPU is a
// report, not an error: the reason is printed and the exit status is 0.
int info_gpu(const Options& opts) {
  GpuReport r = gpu_report();
  std::string built = r.built ? "CUDA " + gpu::cuda_version_string(r.built_version) + " headers" : "no";
  if (opts.json) {
    JsonWriter w;
    w.begin_object().field("ok", true).field("built_with_cuda", r.built).field("built_cuda_version", r.built_version);
    w.field("available", r.unavailable.empty() && r.count_error.empty()).field("reason", r.unavailable + r.count_error);
    w.field("driver_version", r.driver_version).field("library", r.library).key("devices").begin_array();
    for (const auto& d : r.devices) {
      w.begin_object().field("ordinal", d.ordinal);
      if (d.info) {
        w.field("name", d.info->name).field("pci_address", d.info->pci_address);
        w.field("memory_bytes", d.info->memory_bytes);
        w.field("compute_capability", std::to_string(d.info->compute_major) + "." + std::to_string(d.info->compute_minor));
        w.field("stream_memops", d.memops).field("stream_memops_error", d.memops_error);
      } else {
        w.field("error", d.error);
      }
      w.end_object();
    }
    w.end_array().end_object();
    std::printf("%s\n", w.str().c_str());
    return kExitOk;
  }
  std::printf("GPU support\n  built with:  %s\n", built.c_str());
  if (!r.unavailable.empty()) {
    std::printf("  driver:      none: %s\n", r.unavailable.c_str());
    return kExitOk;
  }
  std::printf("  driver:      CUDA %s (%s)\n", gpu::cuda_version_string(r.driver_version).c_str(), r.library.c_str());
  if (!r.count_error.empty()) std::printf("  GPUs:        %s\n", r.count_error.c_str());
  for (const auto& d : r.devices) {
    if (!d.info) {
      std::printf("  gpu %d:       %s\n", d.ordinal, d.error.c_str());
      continue;
    }
    std::printf("  gpu %d:       %s\n               stream memory operations: %s\n", d.ordinal,
                gpu_device_line(*d.info).c_str(), d.memops ? "work" : d.memops_error.c_str());
  }
  return kExitOk;
}

}  // namespace

int cmd_info(const Options& opts) {
  if (opts.args[0] == "gpu") return info_gpu(opts);
  // A name with a prefix (swnic:, shm:) that is no PCI address.
  if (!PciAddress::parse(opts.args[0]) && opts.args[0].find(':') != std::string::npos) {
    return info_software_device(opts, opts.args[0]);
  }
  auto d = pci::describe(opts.host, opts.args[0]);
  if (!d) return report_error(opts, "info", d.error());
  auto details = pci::read_details(opts.host, d->address);
  std::optional<Result<VfioView>> vfio;
  std::optional<Result<PluginView>> plugin;
  std::optional<Result<RdmaView>> rdma;
  if (d->driver == "vfio-pci") {
    vfio = inspect_through_vfio(opts, *d);  // closes the device again before the plugin opens it
    plugin = inspect_through_plugin(opts, *d);  // and the plugin before the RDMA provider does
    rdma = inspect_rdma(opts, d->address.str());
  }
  if (opts.json) {
    write_json(*d, details, vfio, plugin, rdma);
  } else {
    print_text(*d, details, vfio);
    print_plugin(plugin);
    if (rdma) print_rdma(*rdma, "  ");
  }
  return kExitOk;
}

}  // namespace ufab::cli
