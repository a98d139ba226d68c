#include "core/roce/icrc.h"

#include <cstring>

#include "core/roce/bytes.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define UFAB_ROCE_HAVE_PCLMUL 1
#endif

namespace ufab::roce {
namespace {

// The Ethernet CRC-32 generator 0x04C11DB7, bit-reversed for the reflected
// (least significant bit first) form the wire uses.
constexpr uint32_t kPolyReflected = 0xEDB88320u;

// tables[k][b]: the CRC register contribution of byte b followed by k zero
// bytes. tables[0] drives the bytewise loop; all eight drive slice-by-8.
struct Tables {
  uint32_t t[8][256];
};

constexpr Tables make_tables() {
  Tables tb{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPolyReflected : 0);
    tb.t[0][i] = c;
  }
  for (int s = 1; s < 8; ++s)
    for (uint32_t i = 0; i < 256; ++i) tb.t[s][i] = (tb.t[s - 1][i] >> 8) ^ tb.t[0][tb.t[s - 1][i] & 0xFF];
  return tb;
}

constexpr Tables kTables = make_tables();

// Bit-at-a-time, used only to check constants at compile time.
constexpr uint32_t crc_bitwise(uint32_t c, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPolyReflected : 0);
  }
  return c;
}

constexpr bool seed_is_masked_lrh() {
  const uint8_t ff[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  return crc_bitwise(0xFFFFFFFFu, ff, 8) == kIcrcSeed;
}
static_assert(seed_is_masked_lrh(), "rxe's ICRC seed is the CRC of the 8-byte masked LRH");

uint32_t crc_bytewise(uint32_t c, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) c = (c >> 8) ^ kTables.t[0][(c ^ p[i]) & 0xFF];
  return c;
}

uint32_t crc_slice8(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = kTables.t;
  while (n >= 8) {
    // The register lines up with the next four bytes (reflected CRC), so
    // xor it in and look every byte up by its distance to the block end.
    uint32_t a = load_le32(p) ^ c;
    uint32_t b = load_le32(p + 4);
    c = t[7][a & 0xFF] ^ t[6][(a >> 8) & 0xFF] ^ t[5][(a >> 16) & 0xFF] ^ t[4][a >> 24] ^
        t[3][b & 0xFF] ^ t[2][(b >> 8) & 0xFF] ^ t[1][(b >> 16) & 0xFF] ^ t[0][b >> 24];
    p += 8;
    n -= 8;
  }
  return crc_bytewise(c, p, n);
}

#if UFAB_ROCE_HAVE_PCLMUL

// Carry-less multiply folding (the method of Intel's "Fast CRC Computation
// for Generic Polynomials Using PCLMULQDQ"), with constants derived here.
//
// A 16-byte block loaded little-endian into a register holds, in bit i, the
// coefficient of x^(127-i) of the block's polynomial (reflected order: the
// first byte's low bit is the highest power). Moving a block V forward by T
// bits means replacing it by something congruent to V * x^T mod P. Split
// V = Vh * x^64 + Vl (Vh is the low register half); then
// V * x^T = Vh * x^(T+64) + Vl * x^T, and each term is one 64x64 carry-less
// multiply by a 32-bit remainder. In the reflected form a product comes out
// multiplied by an extra x, so the constants are x^(T+63) and x^(T-1)
// (mod P) instead of x^(T+64) and x^T. Products have degree < 96, so they
// fit a register and can be xored into the block T bits further on.
//
// Any length >= 16 is folded to one register R, a 16-byte message with
// the same CRC (from register 0) as the whole input:
// - a tail of 1..15 bytes: the last register and the tail are 16 + t bytes;
//   the first t of them, as a block of 16 - t zero bytes and those t (zeros
//   in front change nothing from register 0), are folded forward by 128
//   bits onto the last 16 bytes (16 - t bytes of the register, then the
//   tail, loaded in one go ending at the tail's end). Two byte shuffles
//   from one 32-byte table select both.
// - the CRC register of R is R * x^32 mod P, reduced in three steps (see
//   reduce()): its high half by x^95 (x^96 with the extra x) onto degree <
//   96, then bits 64..95 by x^63 onto degree < 64, then Barrett: for U of
//   degree < 64, q = floor(floor(U / x^32) * mu / x^32) with
//   mu = floor(x^64 / P) is exactly floor(U / P), and the CRC is the low 32
//   coefficients of U - q * P. In reflected operands of 33 bits (x^d at bit
//   32 - d) the products need no extra shifts: both quotient and remainder
//   come out in the CRC register's own bit order.

// x^n mod P in the normal (bit d = x^d) form, P = x^32 + 0x04C11DB7.
constexpr uint64_t xpow_mod_p(unsigned n) {
  uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (uint64_t{1} << 32)) r ^= 0x104C11DB7ull;
  }
  return r;
}

// floor(x^64 / P) by long division (degree 32, 33 bits).
constexpr uint64_t barrett_mu() {
  // Dividend x^64 as bits 64..0 split into a 33-bit window: shift in one
  // bit at a time; whenever the window's top (x^32) is set, subtract P and
  // record a quotient bit.
  uint64_t rem = 0, q = 0;
  for (int bit = 64; bit >= 0; --bit) {
    rem = (rem << 1) | (bit == 64 ? 1 : 0);
    q <<= 1;
    if (rem & (uint64_t{1} << 32)) {
      rem ^= 0x104C11DB7ull;
      q |= 1;
    }
  }
  return q;
}
static_assert(barrett_mu() >> 32 == 1, "mu = floor(x^64 / P) has degree 32");

// A polynomial of degree < `width` as a reflected operand (x^d at bit
// width-1-d).
constexpr uint64_t reflect(uint64_t r, int width) {
  uint64_t out = 0;
  for (int d = 0; d < width; ++d)
    if ((r >> d) & 1) out |= uint64_t{1} << (width - 1 - d);
  return out;
}
constexpr uint64_t reflected_operand(uint64_t r) { return reflect(r, 64); }

struct FoldConstants {
  uint64_t lo;  // multiplies the low half (Vh)
  uint64_t hi;  // multiplies the high half (Vl)
};

constexpr FoldConstants fold_constants(unsigned bits) {
  return {reflected_operand(xpow_mod_p(bits + 63)), reflected_operand(xpow_mod_p(bits - 1))};
}

constexpr FoldConstants kFold512 = fold_constants(512);  // 4 registers x 16 bytes
constexpr FoldConstants kFold384 = fold_constants(384);
constexpr FoldConstants kFold256 = fold_constants(256);
constexpr FoldConstants kFold128 = fold_constants(128);
// reduce(): x^95 for the high half, x^63 for bits 64..95 (extra x each).
constexpr FoldConstants kReduce = {reflected_operand(xpow_mod_p(95)), reflected_operand(xpow_mod_p(63))};
// Barrett: mu and P as 33-bit reflected operands.
constexpr FoldConstants kBarrett = {reflect(barrett_mu(), 33), reflect(0x104C11DB7ull, 33)};

// kTailShuffle + t, t = 1..15, as a byte shuffle: the first t bytes of a
// register moved to its end (zeros in front; top bit set where zero); xored
// with 0x80, the register's last 16 - t bytes moved to its front.
alignas(16) constexpr uint8_t kTailShuffle[32] = {
    0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8B, 0x8C, 0x8D, 0x8E, 0x8F,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F};

#define UFAB_CLMUL_TARGET __attribute__((target("pclmul,sse4.1")))

UFAB_CLMUL_TARGET inline __m128i make_k(FoldConstants k) {
  return _mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo));
}

UFAB_CLMUL_TARGET inline __m128i fold(__m128i v, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(v, k, 0x00), _mm_clmulepi64_si128(v, k, 0x11));
}

UFAB_CLMUL_TARGET inline __m128i load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The CRC register (from 0) of the 16-byte message in r.
UFAB_CLMUL_TARGET inline uint32_t reduce(__m128i r) {
  const __m128i kr = make_k(kReduce);
  // Low half (degrees 64..127) times x^96, plus the high half (degrees
  // 0..63) times x^32: degree < 96, in bits 32..127.
  __m128i t = _mm_xor_si128(_mm_clmulepi64_si128(r, kr, 0x00), _mm_slli_si128(_mm_srli_si128(r, 8), 4));
  // Degrees 64..95 (bits 32..63) times x^64 onto degrees 0..63 (the high
  // half): u, degree < 64, as a 64-bit reflected operand in the low half.
  __m128i u = _mm_xor_si128(_mm_srli_si128(t, 8), _mm_srli_si128(_mm_clmulepi64_si128(t, kr, 0x10), 8));
  const __m128i kb = make_k(kBarrett);
  const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
  // Bits 0..31 of u are floor(u / x^32) reflected in 32 bits; times mu,
  // bits 0..31 are the quotient q reflected in 32 bits.
  __m128i q = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(u, low32), kb, 0x00), low32);
  // q * P's degrees 0..31 land in bits 32..63, as do u's.
  __m128i rem = _mm_xor_si128(u, _mm_clmulepi64_si128(q, kb, 0x10));
  return static_cast<uint32_t>(_mm_extract_epi32(rem, 1));
}

UFAB_CLMUL_TARGET uint32_t crc_pclmul(uint32_t c, const uint8_t* p, size_t n) {
  if (n < 16) return n < 8 ? crc_bytewise(c, p, n) : crc_slice8(c, p, n);

  // Starting from register c equals starting from 0 with c xored into the
  // first four bytes.
  __m128i r = _mm_xor_si128(load128(p), _mm_cvtsi32_si128(static_cast<int>(c)));
  const __m128i k128 = make_k(kFold128);
  if (n >= 64) {
    __m128i x0 = r;
    __m128i x1 = load128(p + 16);
    __m128i x2 = load128(p + 32);
    __m128i x3 = load128(p + 48);
    p += 64;
    n -= 64;

    const __m128i k512 = make_k(kFold512);
    while (n >= 64) {
      x0 = _mm_xor_si128(fold(x0, k512), load128(p));
      x1 = _mm_xor_si128(fold(x1, k512), load128(p + 16));
      x2 = _mm_xor_si128(fold(x2, k512), load128(p + 32));
      x3 = _mm_xor_si128(fold(x3, k512), load128(p + 48));
      p += 64;
      n -= 64;
    }

    r = _mm_xor_si128(x3, fold(x0, make_k(kFold384)));
    r = _mm_xor_si128(r, fold(x1, make_k(kFold256)));
    r = _mm_xor_si128(r, fold(x2, k128));
  } else {
    p += 16;
    n -= 16;
  }
  while (n >= 16) {
    r = _mm_xor_si128(fold(r, k128), load128(p));
    p += 16;
    n -= 16;
  }
  if (n > 0) {
    // At least 16 bytes lie before p + n - 16 .. p + n: the load is in bounds.
    const __m128i ma = load128(kTailShuffle + n);
    const __m128i mb = _mm_xor_si128(ma, _mm_set1_epi8(static_cast<char>(0x80)));
    __m128i head = _mm_shuffle_epi8(r, ma);
    __m128i last = _mm_blendv_epi8(load128(p + n - 16), _mm_shuffle_epi8(r, mb), ma);
    r = _mm_xor_si128(fold(head, k128), last);
  }
  return reduce(r);
}

// The register after kIcrcSeed and 40 zero bytes: the CRC register update
// is linear, so crc(seed, H) = crc(seed, 0^40) ^ crc(0, H).
constexpr uint32_t seed_after_zero_header() {
  const uint8_t zeros[kIcrcHeaderBytes] = {};
  return crc_bitwise(kIcrcSeed, zeros, kIcrcHeaderBytes);
}
constexpr uint32_t kSeedAfterZeroHeader = seed_after_zero_header();

// icrc_begin in one step: the 40 header bytes as 8 + 16 + 16 (the first
// block is 8 zero bytes, which from register 0 change nothing, and the first
// 8 header bytes), the variant fields ored to ones in the registers.
UFAB_CLMUL_TARGET uint32_t icrc_begin_pclmul(const uint8_t* h) {
  // Block 0 = bytes -8..7: byte 1 (TOS) at 9. Block 1 = bytes 8..23: TTL
  // (8) at 0, checksum (10, 11) at 2, 3. Block 2 = bytes 24..39: UDP
  // checksum (26, 27) at 2, 3, BTH byte 4 (32) at 8.
  const __m128i m0 = _mm_set_epi8(0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m128i m1 = _mm_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -1, 0, -1);
  const __m128i m2 = _mm_set_epi8(0, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0, -1, -1, 0, 0);
  __m128i b0 = _mm_or_si128(_mm_slli_si128(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(h)), 8), m0);
  __m128i b1 = _mm_or_si128(load128(h + 8), m1);
  __m128i b2 = _mm_or_si128(load128(h + 24), m2);
  __m128i r = _mm_xor_si128(_mm_xor_si128(fold(b0, make_k(kFold256)), fold(b1, make_k(kFold128))), b2);
  return reduce(r) ^ kSeedAfterZeroHeader;
}

bool cpu_has_pclmul() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  }();
  return has;
}

#endif  // UFAB_ROCE_HAVE_PCLMUL

}  // namespace

const char* crc_impl_name(CrcImpl impl) {
  switch (impl) {
    case CrcImpl::kBytewise: return "bytewise";
    case CrcImpl::kSlice8: return "slice8";
    case CrcImpl::kPclmul: return "pclmul";
    case CrcImpl::kAuto: return "auto";
  }
  return "?";
}

bool crc_impl_available(CrcImpl impl) {
  if (impl != CrcImpl::kPclmul) return true;
#if UFAB_ROCE_HAVE_PCLMUL
  return cpu_has_pclmul();
#else
  return false;
#endif
}

CrcImpl best_crc_impl() { return crc_impl_available(CrcImpl::kPclmul) ? CrcImpl::kPclmul : CrcImpl::kSlice8; }

uint32_t crc32_update(uint32_t state, std::span<const uint8_t> data, CrcImpl impl) {
  const uint8_t* p = data.data();
  size_t n = data.size();
  switch (impl) {
    case CrcImpl::kBytewise:
      return crc_bytewise(state, p, n);
    case CrcImpl::kSlice8:
      return crc_slice8(state, p, n);
    case CrcImpl::kPclmul:
    case CrcImpl::kAuto:
#if UFAB_ROCE_HAVE_PCLMUL
      if (cpu_has_pclmul()) return crc_pclmul(state, p, n);
#endif
      return crc_slice8(state, p, n);
  }
  return crc_slice8(state, p, n);
}

uint32_t icrc_begin(std::span<const uint8_t, kIcrcHeaderBytes> h, CrcImpl impl) {
#if UFAB_ROCE_HAVE_PCLMUL
  if ((impl == CrcImpl::kPclmul || impl == CrcImpl::kAuto) && cpu_has_pclmul()) return icrc_begin_pclmul(h.data());
#endif
  uint8_t m[kIcrcHeaderBytes];
  std::memcpy(m, h.data(), sizeof m);
  // Variant fields, which routers may rewrite, count as all ones (IBA
  // annex A17.4; rxe_icrc_hdr).
  m[1] = 0xFF;                        // IPv4 TOS (DSCP/ECN)
  m[8] = 0xFF;                        // IPv4 TTL
  m[10] = m[11] = 0xFF;               // IPv4 header checksum
  m[20 + 6] = m[20 + 7] = 0xFF;       // UDP checksum
  m[28 + 4] = 0xFF;                   // BTH FECN/BECN/reserved byte
  return crc32_update(kIcrcSeed, std::span<const uint8_t>(m, sizeof m), impl);
}

uint32_t icrc_ipv4(std::span<const uint8_t> datagram, CrcImpl impl) {
  if (datagram.size() < kIcrcHeaderBytes) return 0;
  uint32_t s = icrc_begin(datagram.first<kIcrcHeaderBytes>(), impl);
  s = crc32_update(s, datagram.subspan(kIcrcHeaderBytes), impl);
  constexpr size_t kBthAt = kIcrcHeaderBytes - 12;  // IPv4 (20) + UDP (8)
  if (icrc_repeats_headers(datagram[kBthAt])) s = crc32_update(s, datagram.subspan(kBthAt), impl);
  return icrc_finish(s);
}

}  // namespace ufab::roce
