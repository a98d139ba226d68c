// <ufab/stream.h> over the Engine: argument checks, errors to ufab_last_error().
#include <cerrno>
#include <string>

#include "core/provider/providers.h"
#include "core/stream/engine.h"
#include "ufab/stream.h"

using ufab::provider::invalid;
using ufab::provider::report;

struct ufab_stream_engine {
  std::unique_ptr<ufab::stream::Engine> engine;
};

extern "C" {

int ufab_stream_engine_create(ufab_cq* cq, int gpu, uint32_t slots, ufab_stream_engine** out) {
  if (cq == nullptr || out == nullptr || gpu < 0) return invalid("ufab_stream_engine_create: cq, a GPU ordinal and out are required");
  auto streams = ufab::stream::cuda_streams(gpu);
  if (!streams) return report(streams.error().context("ufab_stream_engine_create"));
  auto e = ufab::stream::Engine::create(cq, std::move(*streams), slots);
  if (!e) return report(e.error());
  *out = new ufab_stream_engine{std::move(*e)};
  return 0;
}

void ufab_stream_engine_destroy(ufab_stream_engine* engine) { delete engine; }

int ufab_stream_post_send(ufab_stream_engine* engine, ufab_qp* qp, const ufab_send_wr* wrs, uint32_t n, void* stream,
                          uint64_t* ticket) {
  if (engine == nullptr || wrs == nullptr || ticket == nullptr) {
    return invalid("ufab_stream_post_send: engine, wrs and ticket are required");
  }
  auto t = engine->engine->post_send(qp, {wrs, n}, stream);
  if (!t) return report(t.error());
  *ticket = *t;
  return 0;
}

int ufab_stream_post_send_device(ufab_stream_engine* engine, ufab_qp* qp, const ufab_send_wr* wrs, uint32_t n,
                                 uint64_t* ticket, uint64_t* doorbell, uint32_t* doorbell_value) {
  if (engine == nullptr || wrs == nullptr || ticket == nullptr || doorbell == nullptr || doorbell_value == nullptr) {
    return invalid("ufab_stream_post_send_device: engine, wrs, ticket, doorbell and doorbell_value are required");
  }
  ufab::stream::Engine::Word w{};
  auto t = engine->engine->post_send_device(qp, {wrs, n}, &w);
  if (!t) return report(t.error());
  *ticket = *t;
  *doorbell = w.device_address;
  *doorbell_value = w.value;
  return 0;
}

int ufab_stream_wait_word(ufab_stream_engine* engine, uint64_t ticket, uint64_t* word, uint32_t* value) {
  if (engine == nullptr || word == nullptr || value == nullptr) {
    return invalid("ufab_stream_wait_word: engine, word and value are required");
  }
  auto w = engine->engine->wait_word(ticket);
  if (!w) return report(w.error());
  *word = w->device_address;
  *value = w->value;
  return 0;
}

int ufab_stream_post_recv(ufab_stream_engine* engine, ufab_qp* qp, const ufab_recv_wr* wr, uint64_t* ticket) {
  if (engine == nullptr || wr == nullptr || ticket == nullptr) {
    return invalid("ufab_stream_post_recv: engine, wr and ticket are required");
  }
  auto t = engine->engine->post_recv(qp, *wr);
  if (!t) return report(t.error());
  *ticket = *t;
  return 0;
}

int ufab_stream_wait(ufab_stream_engine* engine, uint64_t ticket, void* stream) {
  if (engine == nullptr) return invalid("ufab_stream_wait: engine is NULL");
  if (auto s = engine->engine->wait(ticket, stream); !s) return report(s.error());
  return 0;
}

int ufab_stream_ticket_status(ufab_stream_engine* engine, uint64_t ticket) {
  if (engine == nullptr) return invalid("ufab_stream_ticket_status: engine is NULL");
  auto s = engine->engine->status(ticket);
  if (!s) return report(s.error());
  return *s;
}

int ufab_stream_engine_set_wait(ufab_stream_engine* engine, int mode) {
  if (engine == nullptr) return invalid("ufab_stream_engine_set_wait: engine is NULL");
  if (auto s = engine->engine->set_wait_mode(mode); !s) return report(s.error().context("ufab_stream_engine_set_wait"));
  return 0;
}

int ufab_stream_engine_wait_mode(ufab_stream_engine* engine) {
  if (engine == nullptr) return invalid("ufab_stream_engine_wait_mode: engine is NULL");
  return engine->engine->wait_mode();
}

int ufab_stream_engine_poll(ufab_stream_engine* engine, ufab_wc* wc, uint32_t n) {
  if (engine == nullptr || (wc == nullptr && n != 0)) return invalid("ufab_stream_engine_poll: engine and wc are required");
  return int(engine->engine->poll({wc, n}));
}

}  // extern "C"
