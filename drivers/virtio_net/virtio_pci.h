// Virtio over PCI, modern interface only (virtio 1.1, section 4.1), and the
// network device's own constants (section 5.1). Layout facts only; the
// driver logic lives in virtio_net.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace ufab::virtio {

// ------------------------------------------------------------ PCI identity
// 4.1.2: modern devices use 0x1040 + virtio device id; network is id 1.
inline constexpr uint16_t kVendorRedHat = 0x1af4;
inline constexpr uint16_t kDeviceNetModern = 0x1041;

// ------------------------------------------------ vendor capabilities 4.1.4
// Every virtio structure is located by a vendor-specific PCI capability
// (id 0x09) of this layout (struct virtio_pci_cap):
//   +0 cap_vndr (0x09)  +1 cap_next  +2 cap_len  +3 cfg_type  +4 bar
//   +5 id  +6..7 padding  +8 le32 offset  +12 le32 length
// The notify capability appends +16 le32 notify_off_multiplier (4.1.4.4).
inline constexpr uint8_t kPciCapVendor = 0x09;
inline constexpr uint8_t kPciCapMsix = 0x11;
inline constexpr uint32_t kPciStatus = 0x06;
inline constexpr uint16_t kPciStatusCapList = 1u << 4;
inline constexpr uint32_t kPciCapPointer = 0x34;

inline constexpr uint32_t kCapOffType = 3;
inline constexpr uint32_t kCapOffBar = 4;
inline constexpr uint32_t kCapOffOffset = 8;
inline constexpr uint32_t kCapOffLength = 12;
inline constexpr uint32_t kCapOffNotifyMultiplier = 16;

// cfg_type values (4.1.4).
inline constexpr uint8_t kCapCommonCfg = 1;
inline constexpr uint8_t kCapNotifyCfg = 2;
inline constexpr uint8_t kCapIsrCfg = 3;
inline constexpr uint8_t kCapDeviceCfg = 4;
inline constexpr uint8_t kCapPciCfg = 5;

// One located structure: which BAR, where in it, how long.
struct Region {
  bool present = false;
  uint8_t bar = 0;
  uint32_t offset = 0;
  uint32_t length = 0;
};

struct Capabilities {
  Region common;
  Region notify;
  uint32_t notify_multiplier = 0;
  Region isr;
  Region device;
  bool has_msix = false;
};

// Reads `len` (1, 2 or 4) bytes of config space at `offset`, little-endian;
// returns 0 or a negative errno (host->config_read in the driver).
using ConfigRead = std::function<int(uint32_t offset, uint32_t len, uint32_t* value)>;

// Walks the standard capability list (bounded, loop-safe) and keeps the
// first usable instance of each virtio structure type, as 4.1.4.1 asks:
// capabilities naming a reserved BAR (> 5) are ignored. Returns 0, or a
// negative errno with `error` saying what was wrong with the list.
int find_capabilities(const ConfigRead& read, Capabilities* out, std::string* error);

// -------------------------------------------- common configuration 4.1.4.3
// struct virtio_pci_common_cfg; all fields little-endian, accessed with their
// natural width. 64-bit queue addresses are written as two 32-bit halves
// (low first), which 4.1.3.1 allows and every device accepts.
namespace common {
inline constexpr uint32_t kDeviceFeatureSelect = 0;  // le32 RW
inline constexpr uint32_t kDeviceFeature = 4;        // le32 RO
inline constexpr uint32_t kDriverFeatureSelect = 8;  // le32 RW
inline constexpr uint32_t kDriverFeature = 12;       // le32 RW
inline constexpr uint32_t kMsixConfig = 16;          // le16 RW
inline constexpr uint32_t kNumQueues = 18;           // le16 RO
inline constexpr uint32_t kDeviceStatus = 20;        // u8 RW
inline constexpr uint32_t kConfigGeneration = 21;    // u8 RO
inline constexpr uint32_t kQueueSelect = 22;         // le16 RW
inline constexpr uint32_t kQueueSize = 24;           // le16 RW (max on reset)
inline constexpr uint32_t kQueueMsixVector = 26;     // le16 RW
inline constexpr uint32_t kQueueEnable = 28;         // le16 RW
inline constexpr uint32_t kQueueNotifyOff = 30;      // le16 RO
inline constexpr uint32_t kQueueDescLo = 32;         // le64 RW
inline constexpr uint32_t kQueueDescHi = 36;
inline constexpr uint32_t kQueueDriverLo = 40;  // avail ring
inline constexpr uint32_t kQueueDriverHi = 44;
inline constexpr uint32_t kQueueDeviceLo = 48;  // used ring
inline constexpr uint32_t kQueueDeviceHi = 52;
inline constexpr uint32_t kMinLength = 56;  // bytes the fields above span
}  // namespace common

// 4.1.4.3 / 4.1.5.1.2: "no vector" for msix_config and queue_msix_vector;
// also what the device reads back when it refused a vector.
inline constexpr uint16_t kNoVector = 0xffff;

// --------------------------------------------------- device status 2.1
inline constexpr uint8_t kStatusAcknowledge = 1;
inline constexpr uint8_t kStatusDriver = 2;
inline constexpr uint8_t kStatusDriverOk = 4;
inline constexpr uint8_t kStatusFeaturesOk = 8;
inline constexpr uint8_t kStatusNeedsReset = 64;
inline constexpr uint8_t kStatusFailed = 128;

// --------------------------------------------------------- features 6, 5.1.3
inline constexpr unsigned kFeatureNetMac = 5;            // VIRTIO_NET_F_MAC
inline constexpr unsigned kFeatureNetMrgRxbuf = 15;      // not used
inline constexpr unsigned kFeatureNetStatus = 16;        // VIRTIO_NET_F_STATUS
inline constexpr unsigned kFeatureNetCtrlVq = 17;        // VIRTIO_NET_F_CTRL_VQ: taken only with MQ
// Multiqueue (VIRTIO_NET_F_MQ, 5.1.3, 5.1.6.5.5): taken with CTRL_VQ when
// both are offered. QEMU offers MQ only with mq=on and gives the device as
// many queue pairs as its backend has queues (1 for -netdev hubport, N for
// tap queues=N). RSS (VIRTIO_NET_F_RSS, 5.1.6.5.7) hashes addresses and
// ports, never the BTH: not negotiated. docs/drivers/virtio_net.md.
inline constexpr unsigned kFeatureNetMq = 22;
inline constexpr unsigned kFeatureNetRss = 60;            // not used
inline constexpr unsigned kFeatureRingIndirectDesc = 28; // not used
inline constexpr unsigned kFeatureRingEventIdx = 29;     // not used
inline constexpr unsigned kFeatureVersion1 = 32;         // VIRTIO_F_VERSION_1
inline constexpr unsigned kFeatureAccessPlatform = 33;   // VIRTIO_F_ACCESS_PLATFORM

inline constexpr uint64_t feature_bit(unsigned bit) { return uint64_t{1} << bit; }

// ------------------------------------------------ network device 5.1.4
// struct virtio_net_config: mac[6] (valid with VIRTIO_NET_F_MAC), le16 status
// (valid with VIRTIO_NET_F_STATUS), le16 max_virtqueue_pairs (valid with
// VIRTIO_NET_F_MQ).
namespace netcfg {
inline constexpr uint32_t kMac = 0;
inline constexpr uint32_t kStatus = 6;
inline constexpr uint16_t kStatusLinkUp = 1;
inline constexpr uint32_t kMinLength = 8;
inline constexpr uint32_t kMaxVirtqueuePairs = 8;
inline constexpr uint32_t kMqLength = 10;  // bytes up to the end of max_virtqueue_pairs
}  // namespace netcfg

// 5.1.6.5: control virtqueue commands, {u8 class; u8 command; data...} read
// by the device, then one u8 ack the device writes (0 OK, 1 ERR).
namespace ctrl {
inline constexpr uint8_t kClassMq = 4;          // VIRTIO_NET_CTRL_MQ
inline constexpr uint8_t kMqVqPairsSet = 0;     // data: le16 virtqueue_pairs
inline constexpr uint8_t kAckOk = 0;
inline constexpr uint16_t kMinPairs = 1, kMaxPairs = 0x8000;
}  // namespace ctrl

// 5.1.6: struct virtio_net_hdr as used once VERSION_1 is negotiated (the
// num_buffers field is always present): 12 bytes in front of every frame,
// both directions. All zero on TX means "no offload, no GSO".
struct NetHeader {
  uint8_t flags;
  uint8_t gso_type;
  uint16_t hdr_len;
  uint16_t gso_size;
  uint16_t csum_start;
  uint16_t csum_offset;
  uint16_t num_buffers;
};
static_assert(sizeof(NetHeader) == 12, "virtio_net_hdr_v1 is 12 bytes");
inline constexpr uint32_t kNetHeaderSize = sizeof(NetHeader);

// Virtqueue indices (5.1.2): receiveqN = 2(N-1), transmitqN = 2(N-1) + 1;
// controlq = 2 * max_virtqueue_pairs with MQ, 2 without.
inline constexpr uint16_t kRxQueue = 0;
inline constexpr uint16_t kTxQueue = 1;
constexpr uint16_t rx_vq(uint16_t pair) { return static_cast<uint16_t>(2 * pair); }
constexpr uint16_t tx_vq(uint16_t pair) { return static_cast<uint16_t>(2 * pair + 1); }

}  // namespace ufab::virtio
