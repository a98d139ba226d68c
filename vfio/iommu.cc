#include "vfio/iommu.h"

#include <cerrno>
#include <utility>

#include "vfio/text.h"

namespace ufab::vfio {

DmaMapping::DmaMapping(DmaMapping&& other) noexcept
    : owner_(std::move(other.owner_)),
      iova_(std::exchange(other.iova_, 0)),
      size_(std::exchange(other.size_, 0)),
      vaddr_(std::exchange(other.vaddr_, nullptr)),
      access_(other.access_) {}

DmaMapping& DmaMapping::operator=(DmaMapping&& other) noexcept {
  if (this != &other) {
    (void)unmap();
    owner_ = std::move(other.owner_);
    iova_ = std::exchange(other.iova_, 0);
    size_ = std::exchange(other.size_, 0);
    vaddr_ = std::exchange(other.vaddr_, nullptr);
    access_ = other.access_;
  }
  return *this;
}

DmaMapping::~DmaMapping() { (void)unmap(); }

Result<uint64_t> DmaMapping::iova_of(const void* address) const {
  auto begin = reinterpret_cast<uintptr_t>(vaddr_);
  auto p = reinterpret_cast<uintptr_t>(address);
  if (!valid() || p < begin || p - begin >= size_)
    return fail(ERANGE, "address " + hex(p) + " is not inside the DMA mapping of " + bytes(size_) +
                            " at vaddr " + hex(begin));
  return iova_ + (p - begin);
}

Status DmaMapping::unmap() {
  if (!owner_) return {};
  auto owner = std::move(owner_);
  owner_.reset();
  auto status = owner->unmap_dma(iova_, size_);
  iova_ = 0;
  size_ = 0;
  vaddr_ = nullptr;
  return status;
}

Result<DmaMapping> IommuBackend::make_mapping(uint64_t iova, void* vaddr, uint64_t size, DmaAccess access) {
  auto self = weak_from_this().lock();
  if (!self)
    return fail(EINVAL, "IOMMU backend is not owned by a std::shared_ptr; create it with its open() factory");
  DmaMapping m;
  m.owner_ = std::move(self);
  m.iova_ = iova;
  m.size_ = size;
  m.vaddr_ = vaddr;
  m.access_ = access;
  return m;
}

}  // namespace ufab::vfio
