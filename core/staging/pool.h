// The per-device pool of the GPU staging pipeline (docs/gpu.md): pinned
// host slots of one fragment each and the copy engine that fills and
// drains them. Created on a device's first GPU region (the slots are
// allocated then, off the data path); any lane takes and gives slots.
//
// Parameters (device parameters of soft-RoCE):
//   gpu_copy=cuda|fake   the engine (fake: a testing aid that needs no GPU
//                        and takes host memory registered as UFAB_MEM_CUDA)
//   gpu_frag=BYTES       fragment (slot) size, a multiple of 4096 (so no
//                        packet of any path MTU straddles two), 4 KiB..64 MiB
//   gpu_depth=N          fragments staged ahead per outbound stream, 1..1024
//   gpu_slots=N          slots in the pool, at least 2 * gpu_depth
//   gpu_fake_delay_us=N  fake engine: a copy takes at least this long
//   gpu_fake_order=fifo|random  fake engine: completion order
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/staging/copy_engine.h"

namespace ufab::staging {

struct Params {
  bool fake = false;
  uint64_t frag = 256 * 1024;
  uint32_t depth = 8;
  uint32_t slots = 256;
  std::chrono::microseconds fake_delay{0};
  bool fake_random = false;
};

// Takes the gpu_* keys out of `params` (the rest stay for the NIC).
Result<Params> take_params(std::map<std::string, std::string>& params);

class Pool {
 public:
  // `ordinal`: the GPU whose primary context the CUDA engine uses.
  static Result<std::unique_ptr<Pool>> create(const Params& params, int ordinal);
  ~Pool();

  const Params& params() const { return params_; }
  uint64_t frag() const { return params_.frag; }
  uint32_t depth() const { return params_.depth; }
  uint32_t slot_count() const { return params_.slots; }
  int ordinal() const { return ordinal_; }
  CopyEngine& engine() { return *engine_; }

  uint8_t* slot(uint32_t i) const { return base_ + uint64_t{i} * params_.frag; }
  // A free slot, or nullopt (all taken).
  std::optional<uint32_t> take();
  // `n` slots at once or none (a READ into GPU memory reserves its whole length).
  bool take_n(uint32_t n, std::vector<uint32_t>& out);
  void give(uint32_t i);
  // A copy whose owner went away (QP error, reset, destroy): its ticket,
  // and its slot (if any) once the copy is no longer pending.
  void orphan(uint32_t ticket, std::optional<uint32_t> slot);
  uint32_t free_slots();

 private:
  Pool() = default;
  void reap_locked();

  Params params_;
  int ordinal_ = 0;
  std::unique_ptr<CopyEngine> engine_;
  uint8_t* base_ = nullptr;
  std::mutex mu_;
  std::vector<uint32_t> free_;
  struct Orphan {
    uint32_t ticket;
    std::optional<uint32_t> slot;
  };
  std::vector<Orphan> orphans_;
};

}  // namespace ufab::staging
