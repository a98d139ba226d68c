// Intel 82574L register map: the subset ufab's e1000e driver uses, with bits.
//
// Source: Intel 82574 GbE Controller Family Datasheet (316080), chapter 10
// "Driver Programming Interface", 10.2 register descriptions. Section
// numbers are given per register as "10.2.x.y"; where a revision renumbers
// them, the register name and BAR0 offset are authoritative. Notes marked
// QEMU are about hw/net/e1000e_core.c (10.0), the model the test bed runs.
//
// All registers are 32-bit, little-endian, in BAR0 (128 KiB memory BAR).
#pragma once

#include <cstdint>

namespace ufab::e1000e {

// ------------------------------------------------------------- identity
inline constexpr uint16_t kVendorIntel = 0x8086;
inline constexpr uint16_t kDevice82574L = 0x10D3;
inline constexpr uint64_t kBar0MinSize = 0x20000;  // 128 KiB

// ------------------------------------------------ 10.2.2 general registers
// 10.2.2.1 Device Control (CTRL, 0x00000).
inline constexpr uint32_t kCtrl = 0x00000;
inline constexpr uint32_t kCtrlFd = 1u << 0;                // full duplex
inline constexpr uint32_t kCtrlGioMasterDisable = 1u << 2;  // stop issuing DMA
inline constexpr uint32_t kCtrlAsde = 1u << 5;              // auto-speed detection
inline constexpr uint32_t kCtrlSlu = 1u << 6;               // set link up
inline constexpr uint32_t kCtrlRst = 1u << 26;              // software reset, self-clearing
inline constexpr uint32_t kCtrlPhyRst = 1u << 31;           // PHY reset

// 10.2.2.2 Device Status (STATUS, 0x00008; RO).
inline constexpr uint32_t kStatus = 0x00008;
inline constexpr uint32_t kStatusFd = 1u << 0;
inline constexpr uint32_t kStatusLu = 1u << 1;    // link up
inline constexpr uint32_t kStatusSpeedShift = 6;  // bits 7:6: 00 10, 01 100, 1x 1000 Mb/s
inline constexpr uint32_t kStatusSpeedMask = 3u << kStatusSpeedShift;

// 10.2.2.3 EEPROM/Flash Control (EEC/EECD, 0x00010).
inline constexpr uint32_t kEecd = 0x00010;
inline constexpr uint32_t kEecdAutoRd = 1u << 9;  // NVM auto-read done (after reset)

// 10.2.2.4 EEPROM Read (EERD, 0x00014): write (word << 2) | START, poll DONE,
// data in 31:16. Words 0..2 hold the MAC address.
inline constexpr uint32_t kEerd = 0x00014;
inline constexpr uint32_t kEerdStart = 1u << 0;
inline constexpr uint32_t kEerdDone = 1u << 1;
inline constexpr uint32_t kEerdAddrShift = 2;
inline constexpr uint32_t kEerdDataShift = 16;

// 10.2.2.5 Extended Device Control (CTRL_EXT, 0x00018).
inline constexpr uint32_t kCtrlExt = 0x00018;
inline constexpr uint32_t kCtrlExtEiame = 1u << 24;       // IAM also applies on MSI-X auto-clear
inline constexpr uint32_t kCtrlExtIame = 1u << 27;        // ICR read/write auto-masks with IAM
inline constexpr uint32_t kCtrlExtPbaSupport = 1u << 31;  // MSI-X PBA support: set when MSI-X is used

// ---------------------------------------------- 10.2.4 interrupt registers
// Cause bits shared by ICR, ICS, IMS, IMC, EIAC and IAM.
inline constexpr uint32_t kIntLsc = 1u << 2;    // link status change
inline constexpr uint32_t kIntRxt0 = 1u << 7;   // receiver timer (non-MSI-X)
inline constexpr uint32_t kIntRxq0 = 1u << 20;  // RX queue 0 (MSI-X mode)
inline constexpr uint32_t kIntRxq1 = 1u << 21;
inline constexpr uint32_t kIntTxq0 = 1u << 22;
inline constexpr uint32_t kIntTxq1 = 1u << 23;
inline constexpr uint32_t kIntOther = 1u << 24;

inline constexpr uint32_t kIcr = 0x000C0;   // 10.2.4.1 Interrupt Cause Read (read clears, write-1 clears)
inline constexpr uint32_t kItr = 0x000C4;   // 10.2.4.2 Interrupt Throttling (not touched)
inline constexpr uint32_t kIcs = 0x000C8;   // 10.2.4.3 Interrupt Cause Set
inline constexpr uint32_t kIms = 0x000D0;   // 10.2.4.4 Interrupt Mask Set/Read
inline constexpr uint32_t kImc = 0x000D8;   // 10.2.4.5 Interrupt Mask Clear
inline constexpr uint32_t kEiac = 0x000DC;  // 10.2.4.6 Interrupt Auto Clear (bits 24:20, MSI-X)
inline constexpr uint32_t kIam = 0x000E0;   // 10.2.4.7 Interrupt Acknowledge Auto Mask

// 10.2.4.8 Interrupt Vector Allocation (IVAR, 0x000E4), MSI-X only: one
// 4-bit field per cause, bits 2:0 the vector (0..4), bit 3 valid.
//   3:0 RXQ0  7:4 RXQ1  11:8 TXQ0  15:12 TXQ1  19:16 Other
//   31: TX interrupt on every descriptor write-back
inline constexpr uint32_t kIvar = 0x000E4;
inline constexpr uint32_t kIvarValid = 0x8;
inline constexpr uint32_t kIvarRxq0Shift = 0;
inline constexpr uint32_t kIvarRxq1Shift = 4;
inline constexpr uint32_t kIvarTxq0Shift = 8;
inline constexpr uint32_t kIvarTxq1Shift = 12;
inline constexpr uint32_t kIvarOtherShift = 16;

// 10.2.4.9 Extended Interrupt Throttling (EITR, 0x000E8 + 4n, n = 0..4).
// QEMU clamps every write to at least 500 (128 us) and resets it to 500, so
// MSI-X interrupts of one vector are at least 128 us apart there.
inline constexpr uint32_t kEitr0 = 0x000E8;

// ------------------------------------------------- 10.2.5 receive registers
// 10.2.5.1 Receive Control (RCTL, 0x00100).
inline constexpr uint32_t kRctl = 0x00100;
inline constexpr uint32_t kRctlEn = 1u << 1;
inline constexpr uint32_t kRctlUpe = 1u << 3;     // unicast promiscuous
inline constexpr uint32_t kRctlMpe = 1u << 4;     // multicast promiscuous
// LPE: long packet enable. Clear, the device drops frames over 1522 bytes
// (1518 + a VLAN tag); set, it takes longer ones, spreading a frame over
// as many receive buffers as it needs (EOP on the last). QEMU
// (e1000x_is_oversized): with LPE it accepts frames up to 16 KiB - 4.
inline constexpr uint32_t kRctlLpe = 1u << 5;
inline constexpr uint32_t kRctlLbmMac = 1u << 6;  // LBM = 01: MAC loopback
inline constexpr uint32_t kRctlBam = 1u << 15;    // accept broadcast
// BSIZE (17:16) = 00 with BSEX (25) = 0: 2048-byte buffers.
inline constexpr uint32_t kRctlSecrc = 1u << 26;  // strip the Ethernet CRC
// FLXBUF (30:27): a receive buffer size in KiB (1..15) that overrides
// BSIZE/BSEX when not 0 (10.2.5.1; QEMU e1000e_parse_rxbufsize takes it
// for legacy descriptors too). Jumbo mode uses it: ceil(frame / 1 KiB)
// KiB buffers, where BSIZE/BSEX would offer only 4, 8 or 16 KiB.
inline constexpr uint32_t kRctlFlxbufShift = 27;
inline constexpr uint32_t kRctlFlxbufMax = 15;
constexpr uint32_t rctl_flxbuf(uint32_t kib) { return (kib & 0xFu) << kRctlFlxbufShift; }

// 10.2.5.x Receive Filter Control (RFCTL, 0x05008): EXTEN (bit 15) selects
// extended descriptors; clear for the legacy format this driver uses.
inline constexpr uint32_t kRfctl = 0x05008;
inline constexpr uint32_t kRfctlExten = 1u << 15;
// Receive Checksum Control (RXCSUM, 0x05000): 0 = no checksum offload.
inline constexpr uint32_t kRxcsum = 0x05000;

// RX queue 0 ring registers (10.2.5.x).
inline constexpr uint32_t kRdbal0 = 0x02800;  // base, low; 16-byte aligned
inline constexpr uint32_t kRdbah0 = 0x02804;
inline constexpr uint32_t kRdlen0 = 0x02808;  // bytes, multiple of 128
inline constexpr uint32_t kRdh0 = 0x02810;
inline constexpr uint32_t kRdt0 = 0x02818;
inline constexpr uint32_t kRdtr = 0x02820;  // RX delay timer: 0 = none
inline constexpr uint32_t kRadv = 0x0282C;  // RX absolute delay: 0 = none

// Two queues each way (datasheet 7.1.2 "Receive Queues", 7.2 "Transmit"):
// queue 1's ring registers sit 0x100 above queue 0's (RDBAL1 0x02900 ..
// RDT1 0x02918, TDBAL1 0x03900 .. TDT1 0x03918, TARC1 0x03940). QEMU
// computes the queue index the same way, (offset - queue 0's) / 0x100.
inline constexpr uint16_t kQueueCount = 2;
inline constexpr uint32_t kQueueStride = 0x100;
constexpr uint32_t queue_reg(uint32_t queue0_reg, uint16_t queue) { return queue0_reg + kQueueStride * queue; }
inline constexpr uint32_t kRdbal1 = 0x02900;
inline constexpr uint32_t kRdt1 = 0x02918;
static_assert(queue_reg(kRdbal0, 1) == kRdbal1 && queue_reg(kRdt0, 1) == kRdt1);

// 10.2.5.x Multiple Receive Queues Command (MRQC, 0x05818). Bits 1:0 = 01
// enable two-queue RSS; bits 20:16 pick the hash inputs: IPv4/TCP (16), IPv4 (17), IPv6/TCP
// (18), IPv6 extended (19), IPv6 (20). There is no UDP field: the 82574L
// spreads UDP (and so RoCEv2) by IP addresses only. RSS also needs extended
// receive descriptors (RFCTL.EXTEN) and RXCSUM.PCSD (the descriptor's
// checksum field then carries the hash); QEMU checks all three
// (e1000e_rss_enabled) and otherwise delivers every frame to queue 0. This
// driver keeps MRQC = 0.
inline constexpr uint32_t kMrqc = 0x05818;

// Multicast Table Array (MTA, 0x05200..0x053FC, 128 registers).
inline constexpr uint32_t kMta = 0x05200;
inline constexpr uint32_t kMtaCount = 128;
// Receive Address n (RAL 0x05400 + 8n, RAH 0x05404 + 8n, n = 0..15):
// RAL = MAC bytes 0-3, RAH = bytes 4-5 in 15:0 and Address Valid in bit 31.
inline constexpr uint32_t kRal0 = 0x05400;
inline constexpr uint32_t kRah0 = 0x05404;
inline constexpr uint32_t kRaCount = 16;
inline constexpr uint32_t kRahAv = 1u << 31;

// ------------------------------------------------ 10.2.6 transmit registers
// 10.2.6.1 Transmit Control (TCTL, 0x00400).
inline constexpr uint32_t kTctl = 0x00400;
inline constexpr uint32_t kTctlEn = 1u << 1;
inline constexpr uint32_t kTctlPsp = 1u << 3;       // pad short packets
inline constexpr uint32_t kTctlCt = 0x0Fu << 4;     // collision threshold 15
inline constexpr uint32_t kTctlCold = 0x3Fu << 12;  // collision distance 63 (full duplex)
inline constexpr uint32_t kTctlRtlc = 1u << 24;     // retransmit on late collision

// Transmit Inter-Packet Gap (TIPG, 0x00410): IPGT 8, IPGR1 8, IPGR2 6.
inline constexpr uint32_t kTipg = 0x00410;
inline constexpr uint32_t kTipgDefault = 0x00602008;

inline constexpr uint32_t kTdbal = 0x03800;
inline constexpr uint32_t kTdbah = 0x03804;
inline constexpr uint32_t kTdlen = 0x03808;
inline constexpr uint32_t kTdh = 0x03810;
inline constexpr uint32_t kTdt = 0x03818;
inline constexpr uint32_t kTidv = 0x03820;  // TX interrupt delay: 0 = none
inline constexpr uint32_t kTadv = 0x0382C;  // TX absolute delay: 0 = none
// Transmit Arbitration Count (TARC0, 0x03840): bit 10 enables the queue.
// QEMU: TDT writes transmit only while it is set (reset value 0x403).
inline constexpr uint32_t kTarc0 = 0x03840;
inline constexpr uint32_t kTarcEnable = 1u << 10;
// TX queue 1: TDBAL1 0x03900 .. TDT1 0x03918 and TARC1 0x03940, the same
// layout 0x100 higher (queue_reg()). QEMU transmits from ring 1 on a TDT1
// write only while TARC1 bit 10 is set (e1000e_set_tdt).
inline constexpr uint32_t kTdbal1 = 0x03900;
inline constexpr uint32_t kTarc1 = 0x03940;
static_assert(queue_reg(kTdbal, 1) == kTdbal1 && queue_reg(kTarc0, 1) == kTarc1);

// ----------------------------------------------------- 10.2.7 statistics
// On the 82574L all statistics clear on read. QEMU: GPRC, GPTC, TPR, TPT
// clear on read; the 64-bit octet counters (GORC, GOTC, TOR, TOT) must be
// read low dword first, reading the high dword clears both halves; the
// error counters CRCERRS..MPC read 0 and RNBC never counts.
inline constexpr uint32_t kCrcerrs = 0x04000;
inline constexpr uint32_t kRxerrc = 0x0400C;
inline constexpr uint32_t kMpc = 0x04010;   // missed packets
inline constexpr uint32_t kEcol = 0x04018;  // excessive collisions
inline constexpr uint32_t kLatecol = 0x04020;
inline constexpr uint32_t kGprc = 0x04074;   // good packets received
inline constexpr uint32_t kGptc = 0x04080;   // good packets transmitted
inline constexpr uint32_t kGorcl = 0x04088;  // good octets received (incl. CRC), low
inline constexpr uint32_t kGorch = 0x0408C;
inline constexpr uint32_t kGotcl = 0x04090;  // good octets transmitted (incl. CRC), low
inline constexpr uint32_t kGotch = 0x04094;
inline constexpr uint32_t kRnbc = 0x040A0;  // receive no buffers
inline constexpr uint32_t kTorl = 0x040C0;
inline constexpr uint32_t kTorh = 0x040C4;
inline constexpr uint32_t kTotl = 0x040C8;
inline constexpr uint32_t kToth = 0x040CC;
inline constexpr uint32_t kTpr = 0x040D0;
inline constexpr uint32_t kTpt = 0x040D4;

// ------------------------------------------------ descriptors (chapter 7)
// Legacy transmit descriptor (7.2, "Legacy Transmit Descriptor Format"), 16 bytes:
//   0: u64 buffer address
//   8: u16 length | u8 CSO | u8 CMD
//  12: u8 STA (DD = bit 0) | u8 CSS | u16 special
inline constexpr uint8_t kTxCmdEop = 0x01;   // end of packet
inline constexpr uint8_t kTxCmdIfcs = 0x02;  // insert FCS
inline constexpr uint8_t kTxCmdRs = 0x08;    // report status (DD write-back)
inline constexpr uint8_t kTxCmdDext = 0x20;  // extended format (not used)
inline constexpr uint8_t kTxStaDd = 0x01;

// Legacy receive descriptor (7.1, "Legacy Receive Descriptor Format"), 16 bytes:
//   0: u64 buffer address
//   8: u16 length | u16 checksum
//  12: u8 status | u8 errors | u16 special
inline constexpr uint8_t kRxStaDd = 0x01;
inline constexpr uint8_t kRxStaEop = 0x02;
// Errors that make a frame unusable (CE, SE, SEQ, CXE, RXE); TCPE (0x20) and
// IPE (0x40) only flag a bad checksum and are reported through buf->flags.
inline constexpr uint8_t kRxErrFrame = 0x01 | 0x02 | 0x04 | 0x10 | 0x80;
inline constexpr uint8_t kRxErrCsum = 0x20 | 0x40;

inline constexpr uint32_t kDescBytes = 16;

// Limits this driver offers.
inline constexpr uint32_t kMinRing = 64;
inline constexpr uint32_t kMaxRing = 4096;
inline constexpr uint32_t kRxBufferBytes = 2048;  // RCTL.BSIZE
// Largest frame written into a receive buffer with LPE clear and SECRC set:
// 1518 + a VLAN tag.
inline constexpr uint32_t kMaxRxFrame = 1522;
inline constexpr uint32_t kMaxTxFrame = 1522;

// MTU (device parameter mtu=, docs/drivers/e1000e.md "Jumbo frames").
// 1500 keeps LPE clear and the limits above. Up to 9000 (the 82574L's
// jumbo frames reach 9 KB, datasheet chapter 1 feature list; Linux's
// e1000e lets an 82574 take frames up to 9234 bytes):
// LPE set, receive buffers of ceil((MTU + 18) / 1 KiB) KiB through FLXBUF,
// TX frames up to MTU + 22 bytes (header, VLAN tag, and the 4 bytes the
// 1500 limit of 1522 also leaves).
inline constexpr uint32_t kDefaultMtu = 1500;
inline constexpr uint32_t kMaxMtu = 9000;
constexpr uint32_t jumbo_rx_buffer_kib(uint32_t mtu) { return (mtu + 18 + 1023) / 1024; }
constexpr uint32_t max_tx_frame(uint32_t mtu) { return mtu + 22; }
static_assert(max_tx_frame(kDefaultMtu) == kMaxTxFrame);
static_assert(jumbo_rx_buffer_kib(kMaxMtu) <= kRctlFlxbufMax);
inline constexpr uint32_t kMinTxFrame = 14;  // an Ethernet header; PSP pads to 60

}  // namespace ufab::e1000e
