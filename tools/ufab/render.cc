#include "tools/ufab/render.h"

#include <cstdio>

#include "base/hex.h"

namespace ufab::cli {

std::string human_size(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + " " + units[u];
}

std::string device_title(const pci::DeviceInfo& d) {
  std::string vendor = d.vendor_name.empty() ? "vendor " + hex_digits(d.vendor_id, 4) : d.vendor_name;
  std::string device = d.device_name.empty() ? "device " + hex_digits(d.device_id, 4) : d.device_name;
  return vendor + " " + device;
}

std::string interfaces_summary(const pci::DeviceInfo& d) {
  if (d.interfaces.empty()) return "-";
  std::string out;
  for (const auto& nic : d.interfaces) {
    if (!out.empty()) out += ",";
    out += nic.name + " (" + (nic.operstate.empty() ? "?" : nic.operstate) + ")";
  }
  return out;
}

std::string group_text(const pci::DeviceInfo& d) {
  return d.iommu_group ? std::to_string(*d.iommu_group) : "-";
}

void write_device_fields(JsonWriter& w, const pci::DeviceInfo& d) {
  w.field("address", d.address.str());
  w.field("vendor_id", hex_digits(d.vendor_id, 4)).field("device_id", hex_digits(d.device_id, 4));
  w.field("subsystem_vendor_id", hex_digits(d.subsystem_vendor_id, 4));
  w.field("subsystem_device_id", hex_digits(d.subsystem_device_id, 4));
  w.field("revision", hex_digits(d.revision, 2)).field("class", hex_digits(d.class_code, 6));
  w.field("vendor_name", d.vendor_name).field("device_name", d.device_name);
  w.field("class_name", d.class_name);
  w.field("driver", d.driver).field("driver_override", d.driver_override);
  w.key("iommu_group");
  if (d.iommu_group) {
    w.value(*d.iommu_group);
  } else {
    w.null();
  }
  w.field("group_viable", d.group_viable);
  w.key("group_members").begin_array();
  for (const auto& m : d.group_members) {
    w.begin_object().field("address", m.name).field("driver", m.driver);
    w.field("class", hex_digits(m.class_code, 6)).field("keeps_group_viable", m.keeps_group_viable).end_object();
  }
  w.end_array();
  w.field("numa_node", d.numa_node);
  w.key("link").begin_object();
  auto opt_str = [&](const char* k, const std::optional<std::string>& v) {
    w.key(k);
    if (v) {
      w.value(*v);
    } else {
      w.null();
    }
  };
  auto opt_uint = [&](const char* k, const std::optional<unsigned>& v) {
    w.key(k);
    if (v) {
      w.value(*v);
    } else {
      w.null();
    }
  };
  opt_str("current_speed", d.current_link_speed);
  opt_uint("current_width", d.current_link_width);
  opt_str("max_speed", d.max_link_speed);
  opt_uint("max_width", d.max_link_width);
  w.end_object();
  w.key("interfaces").begin_array();
  for (const auto& nic : d.interfaces) {
    w.begin_object().field("name", nic.name).field("operstate", nic.operstate).field("mac", nic.mac);
    w.field("admin_up", nic.admin_up);
    w.key("addresses").begin_array();
    for (const auto& a : nic.addresses) w.value(a.str());
    w.end_array();
    w.key("routes").begin_array();
    for (const auto& r : nic.routes) w.value(r.str());
    w.end_array();
    w.field("carries_host_connection", nic.carries_host_connection);
    w.field("connection_reason", nic.connection_reason).end_object();
  }
  w.end_array();
  w.key("vfio_node");
  if (d.vfio_node) {
    w.begin_object().field("path", d.vfio_node->path).field("exists", d.vfio_node->exists);
    w.field("mode", hex_digits(d.vfio_node->mode, 4)).field("accessible", d.vfio_node->accessible).end_object();
  } else {
    w.null();
  }
  w.field("readiness", pci::readiness_name(d.readiness));
  w.field("readiness_reason", d.readiness_reason);
}

void write_transport_stats(JsonWriter& w, const rdma::DeviceStats& st) {
  w.key("transport").begin_object();
  w.field("tx_frames", st.tx_frames).field("rx_frames", st.rx_frames).field("rx_roce", st.rx_roce);
  w.field("rx_arp", st.rx_arp).field("rx_parse_errors", st.rx_parse_errors).field("rx_dropped", st.rx_dropped);
  w.field("retransmits", st.retransmits).field("timeouts", st.timeouts).field("duplicates", st.duplicates);
  w.field("naks_sent", st.naks_sent).field("naks_received", st.naks_received);
  w.field("rnr_naks_sent", st.rnr_naks_sent).field("rnr_naks_received", st.rnr_naks_received);
  w.field("tx_data_packets", st.tx_data_packets).field("tx_data_resent", st.tx_data_resent);
  w.field("rx_data_packets", st.rx_data_packets).field("rx_data_unneeded", st.rx_data_unneeded);
  w.field("rx_read_responses", st.rx_read_responses).field("rx_read_response_dups", st.rx_read_response_dups);
  w.field("window_cuts", st.window_cuts).field("tx_gather_frames", st.tx_gather_frames);
  w.field("sent_per_needed", ufab_sent_per_needed(&st));
  w.end_object();
}

}  // namespace ufab::cli
