#include "vfio/iova_allocator.h"

#include <algorithm>
#include <cerrno>

#include "vfio/text.h"

namespace ufab::vfio {
namespace {

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Page-trimmed, sorted, merged ranges without page 0.
std::vector<IovaRange> normalize(const std::vector<IovaRange>& input, uint64_t page) {
  std::vector<IovaRange> trimmed;
  for (const auto& r : input) {
    if (r.last < r.first) continue;
    uint64_t first = r.first;
    if (first % page != 0) {
      if (first > UINT64_MAX - (page - first % page)) continue;
      first += page - first % page;
    }
    // Largest x <= last with x + 1 a page multiple; written so last = 2^64-1
    // does not overflow.
    uint64_t last = r.last - ((r.last % page + 1) % page);
    first = std::max(first, page);  // never IOVA 0
    if (last < first || last - first + 1 < page) continue;
    trimmed.push_back({first, last});
  }
  std::sort(trimmed.begin(), trimmed.end(),
            [](const IovaRange& a, const IovaRange& b) { return a.first < b.first; });
  std::vector<IovaRange> merged;
  for (const auto& r : trimmed) {
    if (!merged.empty() && (merged.back().last == UINT64_MAX || r.first <= merged.back().last + 1)) {
      merged.back().last = std::max(merged.back().last, r.last);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

std::string describe(const std::vector<IovaRange>& ranges) {
  std::string out;
  for (const auto& r : ranges) {
    if (!out.empty()) out += ", ";
    out += hex(r.first) + "-" + hex(r.last);
  }
  return out.empty() ? "none" : out;
}

}  // namespace

Result<IovaAllocator> IovaAllocator::create(const std::vector<IovaRange>& ranges, uint64_t page_size) {
  if (!is_power_of_two(page_size))
    return fail(EINVAL, "IOMMU page size " + std::to_string(page_size) + " is not a power of two");
  IovaAllocator a;
  a.page_size_ = page_size;
  a.ranges_ = normalize(ranges, page_size);
  if (a.ranges_.empty())
    return fail(ENOSPC, "the IOMMU reports no usable IOVA range (reported: " + describe(ranges) +
                            ", page size " + bytes(page_size) + ")");
  a.rebuild_free_list();
  return a;
}

Result<uint64_t> IovaAllocator::round_to_pages(uint64_t size, const char* what) const {
  if (size == 0) return fail(EINVAL, std::string("cannot ") + what + " 0 bytes of IOVA space");
  if (size > UINT64_MAX - (page_size_ - 1))
    return fail(EINVAL, std::string("cannot ") + what + " " + hex(size) + " bytes of IOVA space: too large");
  return (size + page_size_ - 1) & ~(page_size_ - 1);
}

Result<uint64_t> IovaAllocator::allocate(uint64_t size, uint64_t alignment) {
  auto rounded = round_to_pages(size, "allocate");
  if (!rounded) return std::unexpected(rounded.error());
  if (alignment == 0) alignment = page_size_;
  if (!is_power_of_two(alignment))
    return fail(EINVAL, "IOVA alignment " + hex(alignment) + " is not a power of two");
  alignment = std::max(alignment, page_size_);
  const uint64_t need = *rounded;

  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uint64_t first = it->first, last = it->second;
    uint64_t candidate = first;
    if (candidate % alignment != 0) {
      uint64_t bump = alignment - candidate % alignment;
      if (candidate > last || bump > last - candidate) continue;
      candidate += bump;
    }
    if (last - candidate < need - 1) continue;
    free_.erase(it);
    if (candidate > first) free_[first] = candidate - 1;
    if (candidate + (need - 1) < last) free_[candidate + need] = last;
    allocated_[candidate] = need;
    return candidate;
  }
  return fail(ENOSPC, "cannot allocate " + bytes(need) + " of IOVA space aligned to " + bytes(alignment) +
                          ": " + bytes(free_bytes()) + " free in " + std::to_string(free_.size()) +
                          " block(s), the largest " + bytes(largest_free_block()) +
                          " (usable IOVA ranges: " + describe_ranges() +
                          "); release DMA mappings that are no longer used, or map fewer, larger buffers");
}

Status IovaAllocator::free(uint64_t iova, uint64_t size) {
  auto rounded = round_to_pages(size, "free");
  if (!rounded) return std::unexpected(rounded.error());
  auto it = allocated_.find(iova);
  if (it == allocated_.end())
    return fail(EINVAL, "IOVA " + hex(iova) + " was not allocated (or was already freed); free exactly "
                                              "the address allocate() returned");
  if (it->second != *rounded)
    return fail(EINVAL, "IOVA " + hex(iova) + " was allocated with " + bytes(it->second) +
                            ", not " + bytes(*rounded) + "; free exactly what was allocated");
  allocated_.erase(it);
  insert_free(iova, iova + *rounded - 1);
  return {};
}

void IovaAllocator::insert_free(uint64_t first, uint64_t last) {
  // Keep only the parts inside the usable ranges (they may have shrunk since
  // the block was allocated).
  for (const auto& r : ranges_) {
    uint64_t f = std::max(first, r.first), l = std::min(last, r.last);
    if (f > l) continue;
    auto next = free_.lower_bound(f);
    if (next != free_.end() && l != UINT64_MAX && next->first == l + 1) {
      l = next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->second + 1 == f) {
        f = prev->first;
        free_.erase(prev);
      }
    }
    free_[f] = l;
  }
}

void IovaAllocator::rebuild_free_list() {
  free_.clear();
  for (const auto& r : ranges_) {
    uint64_t cursor = r.first;
    bool done = false;
    for (auto a = allocated_.lower_bound(r.first); a != allocated_.end() && a->first <= r.last; ++a) {
      if (a->first > cursor) insert_free(cursor, a->first - 1);
      uint64_t alloc_last = a->first + a->second - 1;
      if (alloc_last >= r.last) {
        done = true;
        break;
      }
      cursor = alloc_last + 1;
    }
    if (!done && cursor <= r.last) insert_free(cursor, r.last);
  }
}

Status IovaAllocator::set_ranges(const std::vector<IovaRange>& ranges) {
  auto normalized = normalize(ranges, page_size_);
  for (const auto& [iova, size] : allocated_) {
    bool inside = std::any_of(normalized.begin(), normalized.end(), [&](const IovaRange& r) {
      return iova >= r.first && iova + (size - 1) <= r.last;
    });
    if (!inside)
      return fail(EINVAL, "live IOVA allocation " + hex(iova) + "-" + hex(iova + size - 1) +
                              " lies outside the new usable IOVA ranges (" + describe(normalized) + ")");
  }
  ranges_ = std::move(normalized);
  rebuild_free_list();
  return {};
}

uint64_t IovaAllocator::free_bytes() const {
  uint64_t total = 0;
  for (const auto& [first, last] : free_) total += last - first + 1;
  return total;
}

uint64_t IovaAllocator::largest_free_block() const {
  uint64_t best = 0;
  for (const auto& [first, last] : free_) best = std::max(best, last - first + 1);
  return best;
}

std::string IovaAllocator::describe_ranges() const { return describe(ranges_); }

}  // namespace ufab::vfio
