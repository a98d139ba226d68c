#include "core/stream/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>

namespace ufab::stream {
namespace {

uint32_t load(uint32_t* word) { return std::atomic_ref<uint32_t>(*word).load(std::memory_order_acquire); }
void store(uint32_t* word, uint32_t v) { std::atomic_ref<uint32_t>(*word).store(v, std::memory_order_release); }

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(ufab_cq* cq, std::unique_ptr<Streams> streams, uint32_t slots) {
  if (cq == nullptr || !streams) return fail(EINVAL, "stream engine: a CQ and streams are required");
  if (slots == 0) slots = 1024;
  if (slots > 65536) return fail(EINVAL, "stream engine: at most 65536 slots (" + std::to_string(slots) + " asked)");
  auto words = streams->allocate_words(2 * size_t(slots));
  if (!words) return std::unexpected(words.error().context("stream engine: allocating its doorbell and completion words"));
  return std::unique_ptr<Engine>(new Engine(cq, std::move(streams), slots, *words));
}

Engine::Engine(ufab_cq* cq, std::unique_ptr<Streams> streams, uint32_t slots, uint32_t* words)
    : cq_(cq), streams_(std::move(streams)), doorbells_(words), completions_(words + slots), slots_(slots) {
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  stop_.store(true);
  thread_.join();
  // Every wait still armed is released: a stream must not wait for ever on
  // work that will never be posted.
  std::lock_guard lock(mu_);
  bool dropped = false;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.state == State::kArmed || s.state == State::kPosted) {
      complete(s, i, State::kCancelled);
      dropped = true;
    }
  }
  // A stream may still ring a dropped ticket's doorbell or pass its wait
  // after this: its words (8 bytes a slot) stay until the process ends.
  if (dropped) {
    static std::mutex keep_mu;
    static auto* keep = new std::vector<std::unique_ptr<Streams>>;
    std::lock_guard k(keep_mu);
    keep->push_back(std::move(streams_));
  }
}

Result<Engine::Slot*> Engine::take_slot(uint64_t* ticket) {
  const uint32_t i = index(next_ticket_);
  Slot& s = slots_[i];
  if (s.state == State::kArmed || s.state == State::kPosted) {
    return fail(EAGAIN, "stream engine: all " + std::to_string(slots_.size()) +
                            " slots hold tickets not complete yet (ticket " + std::to_string(s.ticket) +
                            " is the oldest); wait for them, or create the engine with more slots");
  }
  s = Slot{};
  s.ticket = next_ticket_;
  *ticket = next_ticket_++;
  return &s;
}

Result<uint64_t> Engine::post_send(ufab_qp* qp, std::span<const ufab_send_wr> wrs, void* stream) {
  return arm("ufab_stream_post_send", qp, wrs, stream, nullptr);
}

Result<uint64_t> Engine::post_send_device(ufab_qp* qp, std::span<const ufab_send_wr> wrs, Word* doorbell) {
  // Keyed by the QP (low bit set: never a stream's address).
  void* key = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(qp) | 1);
  return arm("ufab_stream_post_send_device", qp, wrs, key, doorbell);
}

// A ticket for `wrs`, armed on `stream`'s queue: the stream writes its
// doorbell (doorbell null) or a kernel does (*doorbell says where).
Result<uint64_t> Engine::arm(const char* who, ufab_qp* qp, std::span<const ufab_send_wr> wrs, void* stream,
                             Word* doorbell) {
  if (qp == nullptr || wrs.empty() || wrs.size() >= kRecv) {
    return fail(EINVAL, std::string(who) + ": a QP and 1 to " + std::to_string(kRecv - 1) + " work requests are required");
  }
  for (size_t k = 0; k < wrs.size(); ++k) {
    if (wrs[k].num_sge != 0 && wrs[k].sg_list == nullptr) {
      return fail(EINVAL, std::string(who) + ": work request " + std::to_string(k) + " has num_sge " +
                              std::to_string(wrs[k].num_sge) + " and no sg_list");
    }
  }
  std::lock_guard post(post_mu_);
  uint64_t ticket = 0;
  uint32_t i = 0;
  {
    std::lock_guard lock(mu_);
    auto slot = take_slot(&ticket);
    if (!slot) return std::unexpected(slot.error());
    Slot& s = **slot;
    i = index(ticket);
    size_t nsge = 0;
    for (const auto& wr : wrs) nsge += wr.num_sge;
    s.sges.reserve(nsge);
    for (size_t k = 0; k < wrs.size(); ++k) {
      ufab_send_wr w = wrs[k];
      s.app_wr_ids.push_back(w.wr_id);
      w.wr_id = token(i, uint32_t(k));
      s.sges.insert(s.sges.end(), w.sg_list, w.sg_list + w.num_sge);
      if (k + 1 == wrs.size()) w.send_flags |= UFAB_SEND_SIGNALED;
      s.wrs.push_back(w);
    }
    // SGEs in place now that the vector no longer moves.
    size_t at = 0;
    for (auto& w : s.wrs) {
      w.sg_list = w.num_sge ? &s.sges[at] : nullptr;
      at += w.num_sge;
    }
    s.qp = qp;
    // Armed but in no stream's queue yet: the proxy does not look at it.
    s.state = State::kArmed;
    store(&doorbells_[i], 0);
  }
  Status w;
  if (doorbell) {
    *doorbell = {streams_->device_address(&doorbells_[i]), seq(ticket)};
  } else {
    w = streams_->write(stream, &doorbells_[i], seq(ticket));
  }
  std::lock_guard lock(mu_);
  Slot& s = slots_[i];
  if (!w) {
    s = Slot{};
    return std::unexpected(w.error().context(std::string(who) + ": enqueueing the doorbell write on the stream"));
  }
  auto q = std::find_if(armed_.begin(), armed_.end(), [&](const auto& e) { return e.first == stream; });
  if (q == armed_.end()) q = armed_.insert(armed_.end(), {stream, {}});
  q->second.push_back(i);
  return ticket;
}

Result<uint64_t> Engine::post_recv(ufab_qp* qp, const ufab_recv_wr& wr) {
  if (qp == nullptr) return fail(EINVAL, "ufab_stream_post_recv: a QP is required");
  std::lock_guard lock(mu_);
  uint64_t ticket = 0;
  auto slot = take_slot(&ticket);
  if (!slot) return std::unexpected(slot.error());
  Slot& s = **slot;
  ufab_recv_wr w = wr;
  s.app_wr_ids.push_back(w.wr_id);
  w.wr_id = token(index(ticket), kRecv);
  s.qp = qp;
  s.state = State::kPosted;
  ++posted_;
  if (int rc = ufab_post_recv(qp, &w, 1, nullptr); rc != 0) {
    s = Slot{};
    --posted_;
    return fail(-rc, std::string("ufab_stream_post_recv: ") + ufab_last_error());
  }
  return ticket;
}

// Under mu_: the slot `ticket` holds, or EINVAL.
Result<uint32_t> Engine::held_slot(const char* who, uint64_t ticket) {
  const Slot& s = slots_[index(ticket)];
  if (ticket >= next_ticket_ || s.ticket != ticket || s.state == State::kFree) {
    return fail(EINVAL, std::string(who) + ": ticket " + std::to_string(ticket) +
                            " is not one this engine holds (never given, or its slot was reused)");
  }
  return index(ticket);
}

Status Engine::wait(uint64_t ticket, void* stream) {
  uint32_t* word = nullptr;
  {
    std::lock_guard lock(mu_);
    auto i = held_slot("ufab_stream_wait", ticket);
    if (!i) return std::unexpected(i.error());
    word = &completions_[*i];
  }
  return streams_->wait_geq(stream, word, seq(ticket));
}

Result<Engine::Word> Engine::wait_word(uint64_t ticket) {
  std::lock_guard lock(mu_);
  auto i = held_slot("ufab_stream_wait_word", ticket);
  if (!i) return std::unexpected(i.error());
  return Word{streams_->device_address(&completions_[*i]), seq(ticket)};
}

Result<int> Engine::status(uint64_t ticket) {
  std::lock_guard lock(mu_);
  auto i = held_slot("ufab_stream_ticket_status", ticket);
  if (!i) return std::unexpected(i.error());
  const Slot& s = slots_[*i];
  switch (s.state) {
    case State::kDone: return 1;
    case State::kFailed:
      return fail(EIO, "ticket " + std::to_string(ticket) + ": a work request completed with status " +
                           ufab_wc_status_str(s.error_status));
    case State::kCancelled: return fail(ECANCELED, "ticket " + std::to_string(ticket) + " was dropped");
    default: return 0;
  }
}

size_t Engine::poll(std::span<ufab_wc> out) {
  std::lock_guard lock(mu_);
  size_t n = 0;
  while (n < out.size() && !out_.empty()) {
    out[n++] = out_.front();
    out_.pop_front();
  }
  return n;
}

// Under mu_: the ticket is over; the stream waiting on it may go on.
void Engine::complete(Slot& s, uint32_t slot_index, State state) {
  if (s.state == State::kPosted) --posted_;
  s.state = state;
  s.wrs.clear();
  s.sges.clear();
  store(&completions_[slot_index], seq(s.ticket));
}

// Under mu_.
void Engine::on_completion(ufab_wc wc) {
  if ((wc.wr_id & kTagMask) != kTag) {
    out_.push_back(wc);  // posted by the application itself
    return;
  }
  const uint32_t i = uint32_t(wc.wr_id >> 16) & 0xffffffffu;
  const uint32_t k = uint32_t(wc.wr_id & 0xffff);
  if (i >= slots_.size()) {
    out_.push_back(wc);
    return;
  }
  Slot& s = slots_[i];
  if (s.state != State::kPosted) return;  // dropped (cancelled); nothing to tell
  const bool last = k == kRecv || k + 1 == s.app_wr_ids.size();
  wc.wr_id = s.app_wr_ids[k == kRecv ? 0 : k];
  if (wc.status != UFAB_WC_SUCCESS && s.error_status == UFAB_WC_SUCCESS) s.error_status = wc.status;
  out_.push_back(wc);
  if (last) complete(s, i, s.error_status == UFAB_WC_SUCCESS ? State::kDone : State::kFailed);
}

void Engine::run() {
  ufab_wc wcs[32];
  while (!stop_.load(std::memory_order_relaxed)) {
    bool busy = false;
    {
      std::lock_guard lock(mu_);
      // Doorbells that rang: post their work requests. Each stream rings
      // its own in ticket order, so only its oldest armed one can be next.
      for (auto& [stream, queue] : armed_) {
        while (!queue.empty()) {
          const uint32_t i = queue.front();
          Slot& s = slots_[i];
          if (s.state == State::kArmed && load(&doorbells_[i]) != seq(s.ticket)) break;
          queue.pop_front();
          if (s.state != State::kArmed) continue;  // cancelled meanwhile
          s.state = State::kPosted;
          ++posted_;
          uint32_t bad = 0;
          if (int rc = ufab_post_send(s.qp, s.wrs.data(), uint32_t(s.wrs.size()), &bad); rc != 0) {
            // Nothing of it completes: say so through the ticket.
            s.error_status = UFAB_WC_LOC_QP_OP_ERR;
            complete(s, i, State::kFailed);
          }
        }
        busy |= !queue.empty();
      }
      busy |= posted_ > 0;
    }
    int n = ufab_cq_poll(cq_, wcs, 32);
    if (n > 0) {
      std::lock_guard lock(mu_);
      for (int k = 0; k < n; ++k) on_completion(wcs[k]);
      busy = true;
    }
    if (!busy) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace ufab::stream
