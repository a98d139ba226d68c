// Column-aligned text tables for the CLI's human output.
#pragma once

#include <string>
#include <vector>

namespace ufab::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.empty(); }
  // Headers, then rows; columns padded to their widest cell, two spaces apart.
  std::string render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace ufab::cli
