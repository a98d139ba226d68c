// <ufab/stream.h> over the process's stream-ordered operations engine, with
// CUDA streams (core/gpu/cuda.h's stream memory operations).
#include "core/provider/stream_api.h"

#include <atomic>
#include <mutex>
#include <string>

#include "core/gpu/cuda.h"
#include "core/provider/providers.h"
#include "ufab/stream.h"

struct ufab_stream_op {
  ufab::streamops::Op* op;
  std::string error;  // ufab_stream_op_query's words
};

namespace ufab::provider {
namespace {

int error(int err, const std::string& message) {
  last_error() = message;
  return -err;
}

// A CUDA stream as the engine sees it.
class CudaStream final : public streamops::Stream {
 public:
  CudaStream(const gpu::Driver& d, void* stream) : d_(d), stream_(stream) {}
  Status write_value(uint32_t* word, uint32_t value) override { return d_.stream_write_value32(stream_, word, value); }
  Status wait_value(uint32_t* word, uint32_t value) override { return d_.stream_wait_value32(stream_, word, value); }

 private:
  const gpu::Driver& d_;
  void* stream_;
};

std::atomic<streamops::Engine*> g_engine{nullptr};

// The process's engine, made on first use (its words in pinned host memory).
Result<streamops::Engine*> engine(const gpu::Driver& d) {
  if (auto* e = g_engine.load(std::memory_order_acquire)) return e;
  static std::mutex mu;
  static std::unique_ptr<streamops::Engine> owned;
  std::lock_guard lock(mu);
  if (!owned) {
    auto e = streamops::Engine::create([&d](size_t bytes) { return d.pinned_words(bytes); });
    if (!e) return std::unexpected(e.error());
    owned = std::move(*e);
    g_engine.store(owned.get(), std::memory_order_release);
  }
  return owned.get();
}

// The driver, the engine, and the QP attached to it.
Result<std::pair<const gpu::Driver*, streamops::Engine*>> ready(ufab_qp* qp, bool need_rts) {
  auto d = gpu::Driver::get();
  if (!d) return std::unexpected(d.error());
  auto e = engine(**d);
  if (!e) return std::unexpected(e.error());
  ufab_qp_attr attr{};
  if (int rc = ufab_qp_query(qp, &attr); rc < 0) return fail(-rc, ufab_last_error());
  if (need_rts && attr.state != UFAB_QPS_RTS) {
    return fail(EINVAL, std::string("the QP is in ") + ufab_qp_state_str(attr.state) +
                            "; stream-ordered sends need RTS (connect it first)");
  }
  (*e)->attach(qp, stream_target(qp));
  return std::pair{*d, *e};
}

}  // namespace

void stream_qp_destroying(ufab_qp* qp) {
  if (auto* e = g_engine.load(std::memory_order_acquire)) e->cancel(qp);
}

void stream_qp_destroyed(ufab_qp* qp) {
  if (auto* e = g_engine.load(std::memory_order_acquire)) e->finish(qp);
}

}  // namespace ufab::provider

using ufab::provider::error;

extern "C" {

int ufab_stream_post_send(ufab_qp* qp, const ufab_send_wr* wrs, uint32_t n, void* stream, ufab_stream_op** op) {
  if (qp == nullptr || op == nullptr) return error(EINVAL, "ufab_stream_post_send: qp and op are required");
  auto r = ufab::provider::ready(qp, true);
  if (!r) return error(r.error().code(), "ufab_stream_post_send: " + r.error().message());
  ufab::provider::CudaStream s(*r->first, stream);
  auto o = r->second->post_send(qp, wrs, n, s);
  if (!o) return error(o.error().code(), "ufab_stream_post_send: " + o.error().message());
  *op = new ufab_stream_op{*o, {}};
  return 0;
}

int ufab_stream_post_recv(ufab_qp* qp, const ufab_recv_wr* wrs, uint32_t n, ufab_stream_op** op) {
  if (qp == nullptr || op == nullptr) return error(EINVAL, "ufab_stream_post_recv: qp and op are required");
  auto r = ufab::provider::ready(qp, false);
  if (!r) return error(r.error().code(), "ufab_stream_post_recv: " + r.error().message());
  auto o = r->second->post_recv(qp, wrs, n);
  if (!o) return error(o.error().code(), "ufab_stream_post_recv: " + o.error().message());
  *op = new ufab_stream_op{*o, {}};
  return 0;
}

int ufab_stream_wait(ufab_stream_op* op, void* stream) {
  if (op == nullptr) return error(EINVAL, "ufab_stream_wait: op is required");
  auto d = ufab::gpu::Driver::get();
  if (!d) return error(d.error().code(), "ufab_stream_wait: " + d.error().message());
  auto* e = ufab::provider::g_engine.load(std::memory_order_acquire);
  ufab::provider::CudaStream s(**d, stream);
  if (auto w = e->wait(op->op, s); !w) return error(w.error().code(), "ufab_stream_wait: " + w.error().message());
  return 0;
}

int ufab_stream_op_query(ufab_stream_op* op, ufab_stream_op_info* out, const char** error_words) {
  if (op == nullptr || out == nullptr) return error(EINVAL, "ufab_stream_op_query: op and out are required");
  auto i = ufab::provider::g_engine.load(std::memory_order_acquire)->query(op->op);
  *out = {.state = i.state, .wc_status = i.wc_status, .post_error = i.post_error, .reserved = 0};
  op->error = std::move(i.error);
  if (error_words != nullptr) *error_words = op->error.c_str();
  return 0;
}

void ufab_stream_op_free(ufab_stream_op* op) {
  if (op == nullptr) return;
  ufab::provider::g_engine.load(std::memory_order_acquire)->release(op->op);
  delete op;
}

}  // extern "C"
