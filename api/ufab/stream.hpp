// Stream-ordered operations in C++ (<ufab/stream.h>, docs/gpu.md):
// header-only over the C API, errors as Result/Status like <ufab/rdma.hpp>.
//
//   auto op = rdma::StreamOp::post_send(*qp, wr, stream);   // posted when `stream` gets here
//   op->wait(stream);                                         // the stream waits for its completion
//   ... op->query() ...                                       // ARMED, POSTED or DONE, and the status
//
// `stream` is a CUstream (cudaStream_t) as a void*. A StreamOp frees its
// handle when it goes; the operation still runs to its end.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ufab/rdma.hpp"
#include "ufab/stream.h"

namespace ufab::rdma {

class StreamOp {
 public:
  enum class State : uint32_t { kArmed = UFAB_STREAM_OP_ARMED, kPosted = UFAB_STREAM_OP_POSTED, kDone = UFAB_STREAM_OP_DONE };
  struct Info {
    State state = State::kArmed;
    WcStatus status = WcStatus::kSuccess;  // kDone: the last work request's
    int post_error = 0;                    // negative errno: not posted when the stream got there
    std::string error;                     // its words
  };

  static Result<StreamOp> post_send(QueuePair& qp, std::span<const SendWr> wrs, void* stream) {
    std::vector<ufab_send_wr> c;
    c.reserve(wrs.size());
    for (const SendWr& w : wrs) c.push_back(detail::to_c(w));
    ufab_stream_op* op = nullptr;
    if (int rc = ufab_stream_post_send(qp.c(), c.data(), static_cast<uint32_t>(c.size()), stream, &op); rc < 0) {
      return detail::last_error(rc);
    }
    return StreamOp(op);
  }
  static Result<StreamOp> post_send(QueuePair& qp, const SendWr& wr, void* stream) {
    return post_send(qp, std::span<const SendWr>(&wr, 1), stream);
  }
  static Result<StreamOp> post_recv(QueuePair& qp, std::span<const RecvWr> wrs) {
    std::vector<ufab_recv_wr> c;
    c.reserve(wrs.size());
    for (const RecvWr& w : wrs) {
      c.push_back({.wr_id = w.wr_id, .sg_list = w.sgl.data(), .num_sge = static_cast<uint32_t>(w.sgl.size()),
                   .reserved = 0});
    }
    ufab_stream_op* op = nullptr;
    if (int rc = ufab_stream_post_recv(qp.c(), c.data(), static_cast<uint32_t>(c.size()), &op); rc < 0) {
      return detail::last_error(rc);
    }
    return StreamOp(op);
  }
  static Result<StreamOp> post_recv(QueuePair& qp, const RecvWr& wr) {
    return post_recv(qp, std::span<const RecvWr>(&wr, 1));
  }

  // Enqueues on `stream` a wait for this operation's completion.
  Status wait(void* stream) { return detail::status(ufab_stream_wait(op_.get(), stream)); }
  Info query() const {
    ufab_stream_op_info i{};
    const char* why = nullptr;
    (void)ufab_stream_op_query(op_.get(), &i, &why);
    return {static_cast<State>(i.state), static_cast<WcStatus>(i.wc_status), i.post_error, why ? why : ""};
  }
  ufab_stream_op* c() const { return op_.get(); }

 private:
  explicit StreamOp(ufab_stream_op* op) : op_(op) {}
  struct Free {
    void operator()(ufab_stream_op* op) const { ufab_stream_op_free(op); }
  };
  std::unique_ptr<ufab_stream_op, Free> op_;
};

}  // namespace ufab::rdma
