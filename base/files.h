// Small file-system helpers for sysfs/procfs style files.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/error.h"

namespace ufab {

// Whole file as text; sysfs attributes keep their trailing newline.
Result<std::string> read_file(const std::string& path);
// Contents with surrounding whitespace removed; nullopt when unreadable.
std::optional<std::string> read_attr(const std::string& path);
// Writes `data` with one write(2) so sysfs sees a single store.
Status write_file(const std::string& path, const std::string& data);
// Last component of a symlink's target ("../../../kernel/iommu_groups/5" -> "5").
std::optional<std::string> link_basename(const std::string& path);
// Sorted names in a directory, without "." and ".."; empty when absent.
std::vector<std::string> list_dir(const std::string& path);
bool path_exists(const std::string& path);
std::string trim(const std::string& s);
std::optional<unsigned long long> parse_uint(const std::string& s, int base = 0);

}  // namespace ufab
