// Shared plumbing of the ufab subcommands.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "core/pci/host.h"

namespace ufab::cli {

// Exit codes: 0 success, 1 the operation failed or was refused, 2 usage error.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

struct Options {
  bool json = false;
  bool force = false;
  pci::Host host;
  std::vector<std::string> args;  // positional arguments after the subcommand
  // Command options with values ("--count 1000" or "--count=1000"); repeated
  // options keep every value in order.
  std::map<std::string, std::vector<std::string>> values;
  // Command options without a value ("-a", "--report_gbits").
  std::set<std::string> flags;

  const std::string* value(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? nullptr : &it->second.back();
  }
};

// A numeric option: its value, `fallback` when absent, an error when malformed
// or outside [min, max].
Result<double> number_option(const Options& opts, const std::string& name, double fallback, double min, double max);

// Prints "ufab <command>: <message>" on stderr (or a JSON error object on
// stdout with --json) and returns kExitFailed.
int report_error(const Options& opts, const std::string& command, const Error& err);

int cmd_list(const Options& opts);
int cmd_info(const Options& opts);
int cmd_bind(const Options& opts);
int cmd_unbind(const Options& opts);
int cmd_doctor(const Options& opts);
int cmd_plugins(const Options& opts);
int cmd_pktgen(const Options& opts);
int cmd_pingpong(const Options& opts);
int cmd_perf(const Options& opts);
int cmd_cmatose(const Options& opts);
int cmd_rping(const Options& opts);

}  // namespace ufab::cli
