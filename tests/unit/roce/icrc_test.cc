#include "core/roce/icrc.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/roce/bytes.h"
#include "tests/unit/roce/test_util.h"

namespace ufab::roce {
namespace {

using testdata::kIcrcVectors;

const CrcImpl kImpls[] = {CrcImpl::kBytewise, CrcImpl::kSlice8, CrcImpl::kPclmul, CrcImpl::kAuto};

std::span<const uint8_t> as_bytes(const char* s) { return {reinterpret_cast<const uint8_t*>(s), strlen(s)}; }

TEST(Crc32, CheckValueForEveryImplementation) {
  // The CRC-32 catalogue's check value for "123456789".
  for (CrcImpl impl : kImpls) EXPECT_EQ(crc32(as_bytes("123456789"), impl), 0xCBF43926u) << crc_impl_name(impl);
  EXPECT_EQ(crc32({}, CrcImpl::kAuto), 0u);
}

TEST(Crc32, SeedIsTheMaskedLrh) {
  const uint8_t ff[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  for (CrcImpl impl : kImpls) EXPECT_EQ(crc32_update(0xFFFFFFFF, ff, impl), kIcrcSeed);
}

TEST(Crc32, AvailabilityAndNames) {
  EXPECT_TRUE(crc_impl_available(CrcImpl::kBytewise));
  EXPECT_TRUE(crc_impl_available(CrcImpl::kSlice8));
  EXPECT_TRUE(crc_impl_available(CrcImpl::kAuto));
  EXPECT_STREQ(crc_impl_name(CrcImpl::kPclmul), "pclmul");
  EXPECT_NE(best_crc_impl(), CrcImpl::kAuto);
  if (!crc_impl_available(CrcImpl::kPclmul)) GTEST_LOG_(INFO) << "no PCLMULQDQ here: pclmul falls back to slice8";
}

// Lengths around every boundary of the implementations (8-byte steps,
// 16-byte folds, the 64-byte four-way fold) and start offsets 0..15, from
// random initial registers: all implementations agree with the bytewise
// reference.
TEST(Crc32, ImplementationsAgreeOnRandomInputs) {
  std::mt19937_64 rng(1);
  std::vector<uint8_t> buf(70000 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);
  for (size_t n : {511u, 512u, 513u, 1023u, 1024u, 1025u, 4095u, 4096u, 4097u, 9000u, 65535u, 70000u})
    lengths.push_back(n);
  for (int i = 0; i < 200; ++i) lengths.push_back(rng() % 70000);
  for (size_t n : lengths) {
    size_t off = rng() % 16;
    auto data = std::span<const uint8_t>(buf.data() + off, n);
    uint32_t state = static_cast<uint32_t>(rng());
    uint32_t want = crc32_update(state, data, CrcImpl::kBytewise);
    for (CrcImpl impl : kImpls) ASSERT_EQ(crc32_update(state, data, impl), want) << crc_impl_name(impl) << " n=" << n;
  }
}

// Bit at a time, sharing nothing with icrc.cc (no tables, no folding).
uint32_t crc_bit_at_a_time(uint32_t c, std::span<const uint8_t> data) {
  for (uint8_t b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0xEDB88320u : 0);
  }
  return c;
}

// Every length 0..300 at every start offset 0..15 from several random
// registers: the PCLMUL path (folds, the overlapping tail of 1..15 bytes,
// the Barrett reduction) and kAuto give what a bit-at-a-time CRC and
// slice-by-8 give.
TEST(Crc32, FastPathMatchesBitAtATimeForEveryShortLength) {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> buf(300 + 16);
  for (size_t n = 0; n <= 300; ++n) {
    for (size_t off = 0; off < 16; ++off) {
      for (int rep = 0; rep < 3; ++rep) {
        for (auto& b : buf) b = static_cast<uint8_t>(rng());
        auto data = std::span<const uint8_t>(buf.data() + off, n);
        uint32_t state = rep == 0 ? 0u : rep == 1 ? 0xFFFFFFFFu : static_cast<uint32_t>(rng());
        uint32_t want = crc_bit_at_a_time(state, data);
        ASSERT_EQ(crc32_update(state, data, CrcImpl::kSlice8), want) << "n=" << n << " off=" << off;
        ASSERT_EQ(crc32_update(state, data, CrcImpl::kPclmul), want) << "n=" << n << " off=" << off;
        ASSERT_EQ(crc32_update(state, data, CrcImpl::kAuto), want) << "n=" << n << " off=" << off;
      }
    }
  }
}

// icrc_begin's one-step PCLMUL form (masks applied in registers) against
// the masked bytes walked bit at a time, on random headers at every offset.
TEST(Icrc, HeaderFastPathMatchesBitAtATime) {
  std::mt19937_64 rng(4);
  std::vector<uint8_t> buf(kIcrcHeaderBytes + 16);
  for (int i = 0; i < 2000; ++i) {
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    if (i % 3 == 0) std::fill(buf.begin(), buf.end(), static_cast<uint8_t>(i % 2 ? 0xFF : 0x00));
    const uint8_t* h = buf.data() + i % 16;
    uint8_t m[kIcrcHeaderBytes];
    std::memcpy(m, h, sizeof m);
    for (size_t at : {1u, 8u, 10u, 11u, 26u, 27u, 32u}) m[at] = 0xFF;
    uint32_t want = crc_bit_at_a_time(kIcrcSeed, m);
    auto hs = std::span<const uint8_t, kIcrcHeaderBytes>(h, kIcrcHeaderBytes);
    for (CrcImpl impl : kImpls) ASSERT_EQ(icrc_begin(hs, impl), want) << crc_impl_name(impl) << " i=" << i;
  }
}

TEST(Crc32, SplittingTheInputChangesNothing) {
  std::mt19937_64 rng(2);
  std::vector<uint8_t> buf(5000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  uint32_t whole = crc32(buf);
  for (int i = 0; i < 100; ++i) {
    size_t a = rng() % buf.size(), b = rng() % buf.size();
    if (a > b) std::swap(a, b);
    std::span<const uint8_t> s(buf);
    uint32_t st = crc32_update(0xFFFFFFFF, s.first(a));
    st = crc32_update(st, s.subspan(a, b - a), CrcImpl::kPclmul);
    st = crc32_update(st, s.subspan(b), CrcImpl::kSlice8);
    ASSERT_EQ(~st, whole);
  }
}

// Frames and ICRCs from make_vectors.py (Python zlib): an implementation
// that shares no code with this one.
TEST(Icrc, MatchesIndependentVectors) {
  ASSERT_GE(std::size(kIcrcVectors), 40u);
  for (const auto& v : kIcrcVectors) {
    auto f = testing::vector_frame(v);
    size_t total = load_be16(f.data() + kEthBytes + 2);
    ASSERT_EQ(kEthBytes + total, f.size()) << v.name;
    auto datagram = f.subspan(kEthBytes, total - kIcrcBytes);
    EXPECT_EQ(load_le32(f.data() + f.size() - 4), v.icrc) << v.name << ": stored little-endian";
    for (CrcImpl impl : kImpls) EXPECT_EQ(icrc_ipv4(datagram, impl), v.icrc) << v.name << " " << crc_impl_name(impl);

    // Incremental form over the same bytes, cut after the headers and in
    // the middle of the rest; a FLUSH then covers its BTH, FETH and RETH
    // once more, as rxe computes it (icrc.h).
    uint32_t st = icrc_begin(datagram.first<kIcrcHeaderBytes>());
    auto rest = datagram.subspan(kIcrcHeaderBytes);
    st = icrc_update(st, rest.first(rest.size() / 3));
    st = icrc_update(st, rest.subspan(rest.size() / 3));
    EXPECT_EQ(icrc_repeats_headers(datagram[28]), v.opcode == 0x1C) << v.name;
    if (icrc_repeats_headers(datagram[28])) st = icrc_update(st, datagram.subspan(28));
    EXPECT_EQ(icrc_finish(st), v.icrc) << v.name;
  }
}

TEST(Icrc, VariantFieldsAreMaskedAndEverythingElseCounts) {
  const auto& v = kIcrcVectors[10];
  std::vector<uint8_t> f(v.frame, v.frame + v.frame_len);
  auto icrc = [&] { return icrc_ipv4(std::span<const uint8_t>(f).subspan(kEthBytes, f.size() - kEthBytes - 4)); };
  ASSERT_EQ(icrc(), v.icrc);
  // Masked: IPv4 TOS (15), TTL (22), checksum (24-25); UDP checksum
  // (40-41); BTH byte 4 (46).
  for (size_t at : {15u, 22u, 24u, 25u, 40u, 41u, 46u}) {
    f[at] ^= 0x5A;
    EXPECT_EQ(icrc(), v.icrc) << "byte " << at << " should be masked";
    f[at] ^= 0x5A;
  }
  // Covered: IPv4 ID (18), addresses (26, 33), UDP ports (34, 36), BTH
  // opcode (42), flags (43), P_Key (44), QPN (47), AckReq byte (50), PSN
  // (53), and the bytes after the BTH.
  for (size_t at : {size_t{14}, size_t{18}, size_t{26}, size_t{33}, size_t{34}, size_t{36}, size_t{42}, size_t{43}, size_t{44}, size_t{47}, size_t{50}, size_t{53}, size_t{54}, f.size() - 5}) {
    f[at] ^= 0x01;
    EXPECT_NE(icrc(), v.icrc) << "byte " << at << " should be covered";
    f[at] ^= 0x01;
  }
}

TEST(Icrc, ShortDatagramReadsNothing) {
  uint8_t b[39] = {};
  EXPECT_EQ(icrc_ipv4(b), 0u);
}

}  // namespace
}  // namespace ufab::roce
