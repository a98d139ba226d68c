// What a registration covers, decided from pointer attributes (no GPU
// needed: the attributes are made up).
#include "core/gpu/region.h"

#include <gtest/gtest.h>

namespace {

using ufab::gpu::classify_region;
using ufab::gpu::MemoryType;
using ufab::gpu::PointerInfo;

void* at(uint64_t a) { return reinterpret_cast<void*>(a); }

PointerInfo device(uint64_t start, uint64_t size, uint64_t id = 42, int ordinal = 3) {
  PointerInfo p;
  p.type = MemoryType::kDevice;
  p.device = ordinal;
  p.buffer_id = id;
  p.range_start = start;
  p.range_size = size;
  return p;
}

TEST(Region, HostMemoryStaysHost) {
  auto r = classify_region(PointerInfo{}, at(0x1000), 64, false);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->device);
  PointerInfo pinned;
  pinned.type = MemoryType::kHost;
  r = classify_region(pinned, at(0x1000), 64, false);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->device);
}

TEST(Region, DeviceMemoryCarriesOrdinalAndBufferId) {
  auto r = classify_region(device(0x100000, 0x10000), at(0x100000 + 0x100), 0x1000, false);
  ASSERT_TRUE(r) << r.error().message();
  EXPECT_TRUE(r->device);
  EXPECT_EQ(r->ordinal, 3);
  EXPECT_EQ(r->buffer_id, 42u);
  r = classify_region(device(0x100000, 0x10000), at(0x100000), 0x10000, true);  // the whole allocation
  ASSERT_TRUE(r);
}

TEST(Region, DeviceRangeMustStayInsideItsAllocation) {
  auto r = classify_region(device(0x100000, 0x10000), at(0x10f000), 0x1001, false);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EINVAL);
  EXPECT_NE(r.error().message().find("runs past its allocation"), std::string::npos) << r.error().message();
  // Huge lengths do not wrap the check.
  EXPECT_FALSE(classify_region(device(0x100000, 0x10000), at(0x100000), ~0ull, false));
}

TEST(Region, ManagedMemoryIsRefused) {
  PointerInfo p = device(0x100000, 0x10000);
  p.managed = true;
  auto r = classify_region(p, at(0x100000), 64, false);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), EOPNOTSUPP);
  EXPECT_NE(r.error().message().find("managed (unified) memory"), std::string::npos);
  EXPECT_NE(r.error().message().find("cudaMalloc"), std::string::npos);
}

TEST(Region, ToldCudaButNotDeviceMemory) {
  auto r = classify_region(PointerInfo{}, at(0x1000), 64, true);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("not CUDA memory"), std::string::npos);
  PointerInfo pinned;
  pinned.type = MemoryType::kHost;
  r = classify_region(pinned, at(0x1000), 64, true);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("CUDA pinned host memory"), std::string::npos);
  PointerInfo array;
  array.type = MemoryType::kArray;
  EXPECT_FALSE(classify_region(array, at(0x1000), 64, false));
}

}  // namespace
