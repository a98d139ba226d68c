// Runs inside the VM (tests/vm/suites/foundation.sh): the real `ufab` binary
// and the VFIO layer against QEMU's e1000e / virtio-net / e1000 models behind
// its emulated intel-iommu. Environment:
//   UFAB       path of the ufab binary
//   UFAB_NICS  "MODEL=MAC,..." in PCI order, e.g. "e1000e=52:54:00:00:00:01,..."
//   UFAB_SHARED_GROUP  "BDF,BDF" of two NICs that share one IOMMU group
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "base/files.h"
#include "base/pci_address.h"
#include "core/mac_probe.h"
#include "vfio/container.h"
#include "vfio/device.h"

namespace ufab {
namespace {

const std::string kPciDevices = "/sys/bus/pci/devices/";

struct Shell {
  int status = -1;
  std::string out;  // stdout and stderr together
};

Shell sh(const std::string& command) {
  Shell r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string ufab() {
  const char* u = std::getenv("UFAB");
  return u ? u : "ufab";
}

Shell ufab_run(const std::string& args) { return sh(ufab() + " " + args); }

struct Nic {
  std::string model;
  std::string mac;
  std::string bdf;
};

std::string model_of(const std::string& bdf) {
  std::string id = read_attr(kPciDevices + bdf + "/vendor").value_or("") + ":" +
                   read_attr(kPciDevices + bdf + "/device").value_or("");
  static const std::map<std::string, std::string> models = {
      {"0x8086:0x10d3", "e1000e"}, {"0x1af4:0x1041", "virtio"}, {"0x8086:0x100e", "e1000"}, {"0x8086:0x10c9", "igb"}};
  auto it = models.find(id);
  return it == models.end() ? "" : it->second;
}

// The NICs the suite asked QEMU for, matched to PCI functions by model, in order.
std::vector<Nic> expected_nics() {
  std::vector<Nic> nics;
  const char* spec = std::getenv("UFAB_NICS");
  if (!spec) return nics;
  std::string s = spec;
  std::vector<std::string> used;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? s.size() : comma + 1;
    auto eq = item.find('=');
    Nic n{item.substr(0, eq), item.substr(eq + 1), ""};
    for (const auto& bdf : list_dir(kPciDevices)) {
      if (model_of(bdf) == n.model && std::find(used.begin(), used.end(), bdf) == used.end()) {
        n.bdf = bdf;
        used.push_back(bdf);
        break;
      }
    }
    nics.push_back(n);
  }
  return nics;
}

std::string driver_of(const std::string& bdf) { return link_basename(kPciDevices + bdf + "/driver").value_or(""); }

// Everything bind/unbind could change, for "a refused request changes nothing".
std::string sysfs_snapshot() {
  std::string snap;
  for (const auto& bdf : list_dir(kPciDevices)) {
    snap += bdf + " driver=" + driver_of(bdf) + " override=" +
            read_attr(kPciDevices + bdf + "/driver_override").value_or("?") + "\n";
  }
  for (const auto& f : list_dir("/run/ufab")) snap += "state " + f + "\n";
  return snap;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class FoundationVm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(sh("modprobe vfio-pci").status, 0) << "vfio-pci must load in the VM";
    // run-vm loads drivers for the NICs it adds; the bridged e1000s come from --qemu-arg.
    ASSERT_EQ(sh("modprobe e1000").status, 0);
    nics_ = expected_nics();
    ASSERT_FALSE(nics_.empty()) << "UFAB_NICS is not set";
    for (const auto& n : nics_) ASSERT_FALSE(n.bdf.empty()) << "no PCI function for " << n.model;
  }
  const Nic* nic(const std::string& model) const {
    for (const auto& n : nics_) {
      if (n.model == model) return &n;
    }
    return nullptr;
  }
  std::vector<Nic> nics_;
};

TEST_F(FoundationVm, ListJsonMatchesSysfs) {
  Shell r = sh(ufab() +
             " list --json | jq -r '.devices[] | [.address, .vendor_id, .device_id, .driver, "
             "(.iommu_group|tostring), .class] | @tsv'");
  ASSERT_EQ(r.status, 0) << r.out;
  std::string expected;
  for (const auto& bdf : list_dir(kPciDevices)) {
    std::string cls = read_attr(kPciDevices + bdf + "/class").value_or("");
    if (cls.rfind("0x02", 0) != 0) continue;
    auto hex4 = [&](const char* attr) { return read_attr(kPciDevices + bdf + "/" + attr).value_or("").substr(2); };
    expected += bdf + "\t" + hex4("vendor") + "\t" + hex4("device") + "\t" + driver_of(bdf) + "\t" +
                link_basename(kPciDevices + bdf + "/iommu_group").value_or("null") + "\t" + cls.substr(2) + "\n";
  }
  EXPECT_EQ(r.out, expected);
  // Every NIC the suite configured is listed, with its kernel interface's MAC.
  for (const auto& n : nics_) {
    Shell m = sh(ufab() + " list --json | jq -r '.devices[] | select(.address == \"" + n.bdf +
               "\") | .interfaces[0].mac'");
    EXPECT_EQ(trim(m.out), n.mac) << n.model;
  }
}

// The whole life of a NIC under ufab: bind, open through VFIO, read the MAC
// from its BAR, map DMA memory, wire MSI-X to eventfds, unbind.
void bind_use_unbind(const Nic& n) {
  SCOPED_TRACE(n.model + " " + n.bdf);
  std::string original = driver_of(n.bdf);
  ASSERT_FALSE(original.empty());
  ASSERT_NE(original, "vfio-pci");

  Shell bind = ufab_run("bind " + n.bdf);
  ASSERT_EQ(bind.status, 0) << bind.out;
  ASSERT_EQ(driver_of(n.bdf), "vfio-pci");
  std::string group = link_basename(kPciDevices + n.bdf + "/iommu_group").value_or("");
  ASSERT_TRUE(path_exists("/dev/vfio/" + group));

  Shell info = ufab_run("info --json " + n.bdf);
  ASSERT_EQ(info.status, 0) << info.out;
  EXPECT_EQ(trim(sh("echo '" + info.out + "' | jq -r .vfio.mac").out), n.mac) << info.out;
  EXPECT_EQ(trim(ufab_run("list --json | jq -r '.devices[] | select(.address==\"" + n.bdf + "\") | .readiness'").out),
            "ready");

  {
    auto container = vfio::Container::open();
    ASSERT_TRUE(container) << container.error().message();
    auto device = vfio::Device::open(*container, *PciAddress::parse(n.bdf));
    ASSERT_TRUE(device) << device.error().message();

    auto mac = core::read_mac(*device, model_of(n.bdf) == "virtio" ? 0x1af4 : 0x8086,
                              static_cast<uint16_t>(*parse_uint(*read_attr(kPciDevices + n.bdf + "/device"))));
    ASSERT_TRUE(mac) << mac.error().message();
    ASSERT_TRUE(mac->has_value());
    EXPECT_EQ(core::format_mac((*mac)->mac), n.mac);

    // DMA: one 2 MiB and sixteen 4 KiB mappings, IOVAs inside the reported
    // ranges and below the vIOMMU's 39-bit width; all gone after unmapping.
    auto info_now = (*container)->info();
    ASSERT_FALSE(info_now.iova_ranges.empty());
    const size_t big = 2u << 20;
    void* mem = ::mmap(nullptr, big + 16 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
    {
      std::vector<vfio::DmaMapping> maps;
      auto m = (*container)->map_dma(mem, big, vfio::DmaAccess::device_reads_and_writes);
      ASSERT_TRUE(m) << m.error().message();
      maps.push_back(std::move(*m));
      for (int i = 0; i < 16; ++i) {
        auto s = (*container)->map_dma(static_cast<char*>(mem) + big + i * 4096, 4096, vfio::DmaAccess::device_reads);
        ASSERT_TRUE(s) << s.error().message();
        maps.push_back(std::move(*s));
      }
      EXPECT_EQ((*container)->usage().mappings, 17u);
      EXPECT_EQ((*container)->usage().pinned_bytes, big + 16 * 4096);
      for (const auto& mp : maps) {
        EXPECT_LT(mp.iova() + mp.size(), uint64_t{1} << 39);
        bool inside = false;
        for (const auto& r : info_now.iova_ranges) inside |= mp.iova() >= r.first && mp.iova() + mp.size() - 1 <= r.last;
        EXPECT_TRUE(inside) << std::hex << mp.iova();
        EXPECT_NE(mp.iova(), reinterpret_cast<uintptr_t>(mp.vaddr()));
      }
      // Unmap the middle one explicitly, the rest by RAII.
      ASSERT_TRUE(maps[8].unmap());
      EXPECT_EQ((*container)->usage().mappings, 16u);
    }
    EXPECT_EQ((*container)->usage().mappings, 0u);
    EXPECT_EQ((*container)->usage().pinned_bytes, 0u);
    ::munmap(mem, big + 16 * 4096);

    // MSI-X: every vector on its own eventfd, in one SET_IRQS; a vector
    // triggered through VFIO's loopback signals exactly its eventfd.
    ASSERT_TRUE(device->enable_bus_master());
    auto irq = device->irq_info(vfio::IrqKind::msix);
    ASSERT_TRUE(irq) << irq.error().message();
    ASSERT_GT(irq->count, 0u);
    auto fds = device->enable_irqs(vfio::IrqKind::msix, irq->count);
    ASSERT_TRUE(fds) << fds.error().message();
    ASSERT_EQ(fds->size(), irq->count);
    EXPECT_EQ(device->enabled_irqs(vfio::IrqKind::msix), irq->count);
    uint32_t last = irq->count - 1;
    ASSERT_TRUE(device->trigger_irq(vfio::IrqKind::msix, last));
    for (uint32_t v = 0; v < irq->count; ++v) {
      uint64_t count = 0;
      ssize_t got = ::read((*fds)[v].get(), &count, sizeof count);
      if (v == last) {
        EXPECT_EQ(got, 8) << "vector " << v << " did not fire";
        EXPECT_EQ(count, 1u);
      } else {
        EXPECT_EQ(got, -1) << "vector " << v << " fired without a trigger";
      }
    }
    ASSERT_TRUE(device->disable_irqs(vfio::IrqKind::msix));
    EXPECT_EQ(device->enabled_irqs(vfio::IrqKind::msix), 0u);
  }

  Shell unbind = ufab_run("unbind " + n.bdf);
  ASSERT_EQ(unbind.status, 0) << unbind.out;
  EXPECT_EQ(driver_of(n.bdf), original) << "unbind must restore the driver the device had";
  EXPECT_EQ(read_attr(kPciDevices + n.bdf + "/driver_override").value_or("?"), "(null)");
}

TEST_F(FoundationVm, E1000eBindOpenMacDmaMsixUnbind) {
  ASSERT_NE(nic("e1000e"), nullptr);
  bind_use_unbind(*nic("e1000e"));
}

TEST_F(FoundationVm, VirtioNetBindOpenMacDmaMsixUnbind) {
  ASSERT_NE(nic("virtio"), nullptr);
  bind_use_unbind(*nic("virtio"));
}

// Each refused request: non-zero exit, the message names the cause and the
// remedy, and sysfs is exactly as before.
void expect_refused(const std::string& args, const std::vector<std::string>& words, const std::string& as = "") {
  SCOPED_TRACE(args);
  std::string before = sysfs_snapshot();
  Shell r = sh(as + ufab() + " " + args);
  EXPECT_NE(r.status, 0) << r.out;
  for (const auto& w : words) EXPECT_TRUE(contains(r.out, w)) << "missing '" << w << "' in: " << r.out;
  EXPECT_EQ(sysfs_snapshot(), before);
}

TEST_F(FoundationVm, BadInputsAreRefusedAndChangeNothing) {
  const Nic& e = *nic("e1000e");
  expect_refused("bind 00:02", {"not a PCI address", "0000:01:00.0"});
  expect_refused("bind 0000:42:00.0", {"0000:42:00.0", "ufab list"});
  expect_refused("bind 0000:00:00.0", {"not a network device"});
  expect_refused("unbind " + e.bdf, {"not bound to vfio-pci"});
  expect_refused("frobnicate", {"unknown command"});
  expect_refused("bind", {"usage"});
  // Not root.
  expect_refused("bind " + e.bdf, {"root"}, "setpriv --reuid=65534 --regid=65534 --clear-groups ");
  // Already bound.
  ASSERT_EQ(ufab_run("bind " + e.bdf).status, 0);
  expect_refused("bind " + e.bdf, {"already"});
  ASSERT_EQ(ufab_run("unbind " + e.bdf).status, 0);
}

TEST_F(FoundationVm, NoVfioModuleIsExplained) {
  const Nic& e = *nic("e1000e");
  ASSERT_EQ(sh("modprobe -r vfio_pci").status, 0);
  expect_refused("bind " + e.bdf, {"modprobe vfio-pci"});
  Shell doctor = ufab_run("doctor");
  EXPECT_NE(doctor.status, 0);
  EXPECT_TRUE(contains(doctor.out, "modprobe vfio")) << doctor.out;
  ASSERT_EQ(sh("modprobe vfio-pci").status, 0);
}

TEST_F(FoundationVm, NicCarryingTheHostConnectionNeedsForce) {
  const Nic& e = *nic("e1000e");
  std::string ifname = list_dir(kPciDevices + e.bdf + "/net").at(0);
  ASSERT_EQ(sh("ip link set " + ifname + " up && ip addr add 192.0.2.10/24 dev " + ifname).status, 0);
  expect_refused("bind " + e.bdf, {ifname, "192.0.2.10", "--force"});
  Shell forced = ufab_run("bind --force " + e.bdf);
  ASSERT_EQ(forced.status, 0) << forced.out;
  EXPECT_EQ(driver_of(e.bdf), "vfio-pci");
  ASSERT_EQ(ufab_run("unbind " + e.bdf).status, 0);
  EXPECT_EQ(driver_of(e.bdf), "e1000e");
}

// The operator's path through the driver plugins: `ufab info` shows the
// plugin's view, `ufab pktgen` moves verified frames between two bound NICs.
TEST_F(FoundationVm, InfoShowsThePluginViewAndPktgenCarriesFrames) {
  const Nic& e = *nic("e1000e");
  const Nic& v = *nic("virtio");
  ASSERT_EQ(ufab_run("bind " + e.bdf).status, 0);
  ASSERT_EQ(ufab_run("bind " + v.bdf).status, 0);
  for (const Nic* n : {&e, &v}) {
    Shell info = ufab_run("info --json " + n->bdf);
    ASSERT_EQ(info.status, 0) << info.out;
    EXPECT_EQ(trim(sh("echo '" + info.out + "' | jq -r .plugin.mac").out), n->mac) << info.out;
    EXPECT_EQ(trim(sh("echo '" + info.out + "' | jq -r .plugin.link.up").out), "true") << info.out;
    // The RDMA device soft-RoCE opens on it: FLUSH of both types, ATOMIC
    // WRITE, host and persistent memory (and cuda in a build with the CUDA
    // headers: the staging pipeline, docs/gpu.md); no address without --ip.
    EXPECT_EQ(trim(sh("echo '" + info.out +
                      "' | jq -r '[.rdma.provider, .rdma.flush_global, .rdma.flush_persistent, .rdma.atomic_write, "
                      "(.rdma.mem_types - [\"cuda\"] | join(\",\")), .rdma.ip] | map(tostring) | join(\" \")'")
                       .out),
              "soft-roce true true true host,persistent null")
        << info.out;
    Shell text = ufab_run("info " + n->bdf + " --ip 10.0.0.9");
    EXPECT_TRUE(contains(text.out, "placement   flush global yes, flush persistent yes, atomic write yes")) << text.out;
    EXPECT_TRUE(contains(text.out, "address     10.0.0.9")) << text.out;
  }
  EXPECT_EQ(trim(sh("echo '" + ufab_run("info --json " + e.bdf).out + "' | jq -r .plugin.name").out), "e1000e");
  EXPECT_EQ(trim(sh("echo '" + ufab_run("info --json " + v.bdf).out + "' | jq -r .plugin.name").out), "virtio_net");

  Shell gen = ufab_run("pktgen " + e.bdf + " " + v.bdf + " --count 20000 --json");
  EXPECT_EQ(gen.status, 0) << gen.out;
  EXPECT_EQ(trim(sh("echo '" + gen.out + "' | jq -r '[.sent, .received, .lost, .out_of_order, .corrupt] | @tsv'").out),
            "20000\t20000\t0\t0\t0")
      << gen.out;
  Shell plugins = ufab_run("plugins --json");
  EXPECT_EQ(trim(sh("echo '" + plugins.out + "' | jq -r '[.plugins[].name] | sort | join(\",\")'").out),
            "e1000e,swnic,virtio_net")
      << plugins.out;
  ASSERT_EQ(ufab_run("unbind " + e.bdf).status, 0);
  ASSERT_EQ(ufab_run("unbind " + v.bdf).status, 0);
}

TEST_F(FoundationVm, NonViableGroupNamesTheBlockingDevice) {
  const char* shared = std::getenv("UFAB_SHARED_GROUP");
  ASSERT_NE(shared, nullptr) << "UFAB_SHARED_GROUP is not set";
  std::string s = shared;
  std::string a = s.substr(0, s.find(',')), b = s.substr(s.find(',') + 1);
  ASSERT_EQ(link_basename(kPciDevices + a + "/iommu_group"), link_basename(kPciDevices + b + "/iommu_group"))
      << "the suite should have put both behind one PCIe-to-PCI bridge";
  std::string b_driver = driver_of(b);
  ASSERT_FALSE(b_driver.empty());

  Shell bind = ufab_run("bind " + a);
  ASSERT_EQ(bind.status, 0) << bind.out;
  EXPECT_TRUE(contains(bind.out, b)) << "bind should warn about " << b << ": " << bind.out;

  // Opening through VFIO fails and says which device blocks the group.
  auto container = vfio::Container::open();
  ASSERT_TRUE(container) << container.error().message();
  auto device = vfio::Device::open(*container, *PciAddress::parse(a));
  ASSERT_FALSE(device);
  EXPECT_TRUE(contains(device.error().message(), b)) << device.error().message();
  EXPECT_TRUE(contains(device.error().message(), b_driver)) << device.error().message();

  std::string before = sysfs_snapshot();
  Shell doctor = ufab_run("doctor " + a);
  EXPECT_NE(doctor.status, 0) << doctor.out;
  EXPECT_TRUE(contains(doctor.out, b)) << doctor.out;
  Shell info = ufab_run("info " + a);
  EXPECT_TRUE(contains(info.out, b)) << info.out;
  EXPECT_EQ(sysfs_snapshot(), before);

  // With both on vfio-pci the group is viable and the device opens.
  ASSERT_EQ(ufab_run("bind " + b).status, 0);
  {
    auto c2 = vfio::Container::open();
    ASSERT_TRUE(c2);
    auto d2 = vfio::Device::open(*c2, *PciAddress::parse(a));
    EXPECT_TRUE(d2) << d2.error().message();
  }
  ASSERT_EQ(ufab_run("unbind " + b).status, 0);
  ASSERT_EQ(ufab_run("unbind " + a).status, 0);
  EXPECT_EQ(driver_of(a), "e1000");
  EXPECT_EQ(driver_of(b), "e1000");
}

}  // namespace
}  // namespace ufab
