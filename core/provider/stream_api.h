// Stream-ordered operations in the C API (<ufab/stream.h>): the glue between
// ufab_qp handles and the engine (core/streamops/engine.h). docs/gpu.md.
#pragma once

#include "core/streamops/engine.h"
#include "ufab/rdma.h"

namespace ufab::provider {

// What the engine needs of a QP: its provider's notify posts, its
// device's progress, the provider's last error. (c_api.cc)
streamops::Target stream_target(ufab_qp* qp);

// ufab_qp_destroy's hooks: before the provider destroys the QP (armed
// operations are cancelled, nothing is posted on it any more) and after
// (operations in flight get their completion words). Nothing happens in a
// process that never used stream-ordered operations.
void stream_qp_destroying(ufab_qp* qp);
void stream_qp_destroyed(ufab_qp* qp);

}  // namespace ufab::provider
