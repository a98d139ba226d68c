#include "base/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "base/fd.h"

namespace ufab {

Result<std::string> read_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return fail_errno("cannot open " + path);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail_errno("cannot read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::optional<std::string> read_attr(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::nullopt;
  return trim(*text);
}

Status write_file(const std::string& path, const std::string& data) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return fail_errno("cannot open " + path + " for writing");
  ssize_t n = ::write(fd.get(), data.data(), data.size());
  if (n < 0) return fail_errno("writing '" + trim(data) + "' to " + path);
  if (static_cast<size_t>(n) != data.size()) return fail(EIO, "short write to " + path);
  return {};
}

std::optional<std::string> link_basename(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) return std::nullopt;
  std::string target(buf, static_cast<size_t>(n));
  auto slash = target.find_last_of('/');
  return slash == std::string::npos ? target : target.substr(slash + 1);
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (!dir) return names;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  auto e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

std::optional<unsigned long long> parse_uint(const std::string& s, int base) {
  std::string t = trim(s);
  if (t.empty() || t[0] == '-') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(t.c_str(), &end, base);
  if (errno != 0 || end == t.c_str() || *end != '\0') return std::nullopt;
  return v;
}

}  // namespace ufab
