// ufab::Error values for wire-layer failures, for callers that report
// rather than count. The parser and builder themselves return plain enums:
// they run per packet, where a heap-allocated message would cost more than
// the parse, and they build with toolchains that lack std::expected (the
// clang 14 fuzzing build).
#pragma once

#include <cerrno>
#include <string>

#include "base/error.h"
#include "core/roce/builder.h"
#include "core/roce/parser.h"

namespace ufab::roce {

inline Error to_error(ParseError e) {
  return Error(EBADMSG, std::string("RoCEv2 frame rejected (") + parse_error_name(e) + "): " +
                            parse_error_text(e) + "; the packet is dropped and counted");
}

inline Error to_error(BuildError e) {
  int code = e == BuildError::kBufferTooSmall ? ENOBUFS : e == BuildError::kPayloadTooLarge ? EMSGSIZE : EINVAL;
  return Error(code, std::string("building a RoCEv2 frame (") + build_error_name(e) + "): " +
                         build_error_text(e) + "; fix the caller's request");
}

// Result form of parse_frame.
inline Result<Packet> parse_frame_result(std::span<const uint8_t> frame, const ParseOptions& options = {}) {
  ParseResult r = parse_frame(frame, options);
  if (!r) return std::unexpected(to_error(r.error));
  return r.packet;
}

}  // namespace ufab::roce
