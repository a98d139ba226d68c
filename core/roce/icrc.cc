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
// When fewer than 16 bytes remain, the last register is itself 16 bytes of
// a message with the same CRC as everything folded into it, and the table
// code finishes it and the tail.

// x^n mod P in the normal (bit d = x^d) form, P = x^32 + 0x04C11DB7.
constexpr uint64_t xpow_mod_p(unsigned n) {
  uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (uint64_t{1} << 32)) r ^= 0x104C11DB7ull;
  }
  return r;
}

// A polynomial of degree < 32 as a reflected 64-bit operand (x^d at bit 63-d).
constexpr uint64_t reflected_operand(uint64_t r) {
  uint64_t out = 0;
  for (int d = 0; d < 32; ++d)
    if ((r >> d) & 1) out |= uint64_t{1} << (63 - d);
  return out;
}

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

__attribute__((target("pclmul,sse2"))) inline __m128i make_k(FoldConstants k) {
  return _mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo));
}

__attribute__((target("pclmul,sse2"))) inline __m128i fold(__m128i v, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(v, k, 0x00), _mm_clmulepi64_si128(v, k, 0x11));
}

__attribute__((target("pclmul,sse2"))) inline __m128i load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

__attribute__((target("pclmul,sse2"))) uint32_t crc_pclmul(uint32_t c, const uint8_t* p, size_t n) {
  if (n < 64) return crc_slice8(c, p, n);

  // Starting from register c equals starting from 0 with c xored into the
  // first four bytes.
  __m128i x0 = _mm_xor_si128(load128(p), _mm_cvtsi32_si128(static_cast<int>(c)));
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

  __m128i r = _mm_xor_si128(x3, fold(x0, make_k(kFold384)));
  r = _mm_xor_si128(r, fold(x1, make_k(kFold256)));
  const __m128i k128 = make_k(kFold128);
  r = _mm_xor_si128(r, fold(x2, k128));
  while (n >= 16) {
    r = _mm_xor_si128(fold(r, k128), load128(p));
    p += 16;
    n -= 16;
  }

  alignas(16) uint8_t last[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(last), r);
  return crc_slice8(crc_slice8(0, last, 16), p, n);
}

bool cpu_has_pclmul() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse2");
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
  return icrc_finish(s);
}

}  // namespace ufab::roce
