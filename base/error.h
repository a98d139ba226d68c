// Errors as values: every fallible call in ufab returns Result<T>, carrying
// the errno and a message that says what failed, why, and what to do.
#pragma once

#include <cerrno>
#include <cstring>
#include <expected>
#include <string>
#include <utility>

namespace ufab {

class Error {
 public:
  Error(int err, std::string message) : errno_(err), message_(std::move(message)) {}

  // errno-style code (positive), e.g. ENOENT.
  int code() const { return errno_; }
  const std::string& message() const { return message_; }

  // Adds context in front: "opening group 5: <previous message>".
  Error context(const std::string& what) const { return Error(errno_, what + ": " + message_); }

 private:
  int errno_;
  std::string message_;
};

template <typename T>
using Result = std::expected<T, Error>;

using Status = std::expected<void, Error>;

inline std::unexpected<Error> fail(int err, std::string message) {
  return std::unexpected(Error(err, std::move(message)));
}

// Error from the current errno after a failed system call: "<what>: <strerror>".
inline std::unexpected<Error> fail_errno(const std::string& what) {
  int err = errno;
  return std::unexpected(Error(err, what + ": " + std::strerror(err)));
}

inline std::unexpected<Error> fail_errno(int err, const std::string& what) {
  return std::unexpected(Error(err, what + ": " + std::strerror(err)));
}

}  // namespace ufab
