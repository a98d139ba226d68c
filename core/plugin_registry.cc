#include "core/plugin_registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/plugin_ops.h"

namespace ufab::core {

// A dlopen handle, closed exactly once when the registry lets go of it.
class PluginRegistry::Library {
 public:
  explicit Library(void* handle) : handle_(handle) {}
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  void* get() const { return handle_; }

 private:
  void* handle_;
};

namespace {

// A match table longer than this is taken to be missing its terminating
// row (vendor_id 0): real tables have tens of rows, and walking on would
// read whatever follows the table in the plugin's memory.
constexpr size_t kMaxMatchRows = 1024;
constexpr size_t kMaxNameLength = 64;

// printf into a std::string of whatever length it needs (messages carry
// paths, which can be long).
std::string format(const char* fmt, auto... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return "";
  std::string out(size_t(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), fmt, args...);
  out.resize(size_t(n));
  return out;
}

std::string abi_version(unsigned major, unsigned minor) { return format("%u.%u", major, minor); }

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string real_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return "";
  std::string out(resolved);
  std::free(resolved);
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Whether whoever may write `path` could swap the code ufab is about to run.
// The rule (documented in docs/plugin-guide.md, "Where ufab looks"):
//  - nobody but the owner and trusted groups may write it: not world-writable;
//  - the owner is root or the user running ufab (an owner can always chmod
//    the file back to writable);
//  - group-writable only for root's group (gid 0) or our own effective group.
// Only the file and the directory holding it are checked, not every ancestor:
// a system-wide check would refuse the usual /tmp-based test setups while
// the sticky bit already keeps other users from renaming entries there.
Status check_safe(const std::string& path, const char* what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return fail_errno(std::string("cannot check ") + what + " " + path);
  unsigned mode = st.st_mode & 07777;
  if ((st.st_mode & S_IWOTH) && S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX)) {
    // chmod o-w on /tmp would break the system; the plugins must move.
    return fail(EPERM, format("%s %s is a shared scratch directory (mode %04o, writable by every user), so anyone "
                              "could place plugin code there; refused. Fix: put plugins in a directory of their "
                              "own (mkdir -m 755 DIR) and point UFAB_PLUGIN_PATH at it",
                              what, path.c_str(), mode));
  }
  if (st.st_mode & S_IWOTH) {
    return fail(EPERM, format("%s %s is writable by every user (mode %04o), so anyone could replace the plugin code "
                              "ufab runs; refused. Fix: chmod o-w %s",
                              what, path.c_str(), mode, path.c_str()));
  }
  uid_t me = ::geteuid();
  if (st.st_uid != 0 && st.st_uid != me) {
    return fail(EPERM, format("%s %s is owned by uid %u, which is neither root nor the user running ufab (uid %u), "
                              "so its owner could replace the plugin code; refused. Fix: chown root %s (or to "
                              "yourself)",
                              what, path.c_str(), unsigned(st.st_uid), unsigned(me), path.c_str()));
  }
  if ((st.st_mode & S_IWGRP) && st.st_gid != 0 && st.st_gid != ::getegid()) {
    return fail(EPERM, format("%s %s is writable by group %u (mode %04o), which is neither root's group nor yours, "
                              "so members of it could replace the plugin code; refused. Fix: chmod g-w %s",
                              what, path.c_str(), unsigned(st.st_gid), mode, path.c_str()));
  }
  return {};
}

// File, the directory it is named through and, when it is a symlink, the
// directory of its target: whoever can write any of those decides what
// dlopen maps.
Status check_file_and_dirs(const std::string& path) {
  if (auto st = check_safe(path, "plugin file"); !st) return st;
  std::string dir = parent_dir(path);
  if (auto st = check_safe(dir, "plugin directory"); !st) return st;
  std::string real = real_path(path);
  if (!real.empty()) {
    std::string real_dir = parent_dir(real);
    if (real_dir != real_path(dir)) {
      if (auto st = check_safe(real_dir, "directory of the plugin's real file"); !st) return st;
    }
  }
  return {};
}

Status check_name(const char* name) {
  if (name == nullptr || name[0] == '\0') {
    return fail(ENOEXEC, "the driver table has no name: set .name in its struct ufab_driver");
  }
  size_t len = std::strlen(name);
  bool ok = len <= kMaxNameLength;
  for (size_t i = 0; ok && i < len; ++i) {
    char c = name[i];
    ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  }
  if (!ok) {
    // Print at most the allowed length: the name may be garbage.
    return fail(ENOEXEC, "plugin name \"" + std::string(name, std::min(len, kMaxNameLength)) +
                             "\" is not valid: use 1 to 64 letters, digits, '_', '-' or '.' (users type it)");
  }
  return {};
}

// How precisely a row describes a device, compared lexicographically:
// vendor/device ids first, then subsystem ids, then the number of class
// bits the row pins. A row that names the exact device beats one that
// names only the vendor, which beats a class-only row.
using Score = std::array<int, 3>;

bool row_matches(const ufab_pci_match& row, const PciIdentity& id) {
  auto id_ok = [](uint16_t want, uint16_t have) { return want == UFAB_PCI_ANY || want == have; };
  return id_ok(row.vendor_id, id.vendor_id) && id_ok(row.device_id, id.device_id) &&
         id_ok(row.subsystem_vendor_id, id.subsystem_vendor_id) &&
         id_ok(row.subsystem_device_id, id.subsystem_device_id) &&
         (id.class_code & row.class_mask) == (row.class_code & row.class_mask);
}

Score row_score(const ufab_pci_match& row) {
  auto exact = [](uint16_t v) { return v == UFAB_PCI_ANY ? 0 : 1; };
  return {exact(row.vendor_id) + exact(row.device_id), exact(row.subsystem_vendor_id) + exact(row.subsystem_device_id),
          std::popcount(row.class_mask & 0xffffffu)};
}

}  // namespace

PluginRegistry::PluginRegistry() = default;

PluginRegistry::~PluginRegistry() {
  // Plugins (and their function pointers) first, then the code they point
  // into, newest library first.
  plugins_.clear();
  while (!libraries_.empty()) libraries_.pop_back();
}

PluginRegistry::PluginRegistry(PluginRegistry&&) noexcept = default;

PluginRegistry& PluginRegistry::operator=(PluginRegistry&& other) noexcept {
  if (this != &other) {
    plugins_.clear();
    while (!libraries_.empty()) libraries_.pop_back();
    plugins_ = std::move(other.plugins_);
    libraries_ = std::move(other.libraries_);
    warnings_ = std::move(other.warnings_);
    rdma_providers_ = std::move(other.rdma_providers_);
    force_secure_ = other.force_secure_;
  }
  return *this;
}

Status PluginRegistry::add_builtin(const ufab_driver* driver) {
  if (auto st = register_driver(driver, "built-in"); !st) {
    return std::unexpected(st.error().context("adding built-in plugin"));
  }
  return {};
}

Status PluginRegistry::register_driver(const ufab_driver* driver, const std::string& origin) {
  if (driver == nullptr) return fail(EINVAL, "no driver table (NULL pointer)");
  // The major decides the layout of everything after the version fields, so
  // it is checked before anything else is read.
  if (driver->abi_major != UFAB_ABI_MAJOR) {
    return fail(ENOEXEC, "built for ABI " + abi_version(driver->abi_major, driver->abi_minor) + ", this ufab speaks " +
                             abi_version(UFAB_ABI_MAJOR, UFAB_ABI_MINOR) +
                             ": rebuild the plugin against abi/raw_frame.h of this ufab");
  }
  if (driver->size < kDriverHeaderSize) {
    return fail(ENOEXEC, format("driver table is %u bytes, smaller than the %zu-byte header every ABI %u.x table "
                                "starts with: set .size = sizeof(struct ufab_driver) and rebuild the plugin",
                                unsigned(driver->size), kDriverHeaderSize, unsigned(UFAB_ABI_MAJOR)));
  }
  // From here on only fields within `size` are read, through a bounded copy.
  ufab_driver ops = complete_driver_ops(*driver);
  if (auto st = check_name(ops.name); !st) return st;
  std::string name = ops.name;
  std::vector<std::string> stubbed = stubbed_driver_ops(*driver);
  if (std::find(stubbed.begin(), stubbed.end(), "open") != stubbed.end()) {
    return fail(ENOEXEC, "plugin \"" + name +
                             "\" has no open operation, so it cannot drive any device: set .open in its "
                             "struct ufab_driver (with ufab::sdk::make_driver, give the class a static open())");
  }
  if (const Plugin* taken = by_name(name)) {
    return fail(EEXIST, "plugin name \"" + name + "\" is already registered, from " + taken->origin +
                            "; the first one wins: remove one of the two or rename its driver");
  }

  auto plugin = std::make_unique<Plugin>();
  plugin->name = name;
  plugin->description = ops.description != nullptr ? ops.description : "";
  plugin->origin = origin;
  plugin->abi_major = driver->abi_major;
  plugin->abi_minor = driver->abi_minor;
  plugin->software = (ops.flags & UFAB_DRIVER_F_SOFTWARE) != 0;
  plugin->stubbed_ops = std::move(stubbed);
  if (ops.pci_match != nullptr) {
    size_t i = 0;
    for (; i < kMaxMatchRows && ops.pci_match[i].vendor_id != 0; ++i) {
      ufab_pci_match row = ops.pci_match[i];
      plugin->model_storage.emplace_back(row.model != nullptr ? row.model : "");
      row.model = plugin->model_storage.back().c_str();
      plugin->matches.push_back(row);
    }
    if (i == kMaxMatchRows) {
      return fail(ENOEXEC, format("plugin \"%s\": match table has no terminating row (vendor_id 0) within %zu "
                                  "rows: end it with {0}",
                                  name.c_str(), kMaxMatchRows));
    }
  }
  plugin->ops = ops;

  if (driver->abi_minor > UFAB_ABI_MINOR) {
    warnings_.push_back(origin + ": plugin \"" + name + "\" was built for ABI " +
                        abi_version(driver->abi_major, driver->abi_minor) + ", this ufab speaks " +
                        abi_version(UFAB_ABI_MAJOR, UFAB_ABI_MINOR) + ": it is loaded, but operations added after " +
                        abi_version(UFAB_ABI_MAJOR, UFAB_ABI_MINOR) + " are not used (update ufab to use them)");
  }
  plugins_.push_back(std::move(plugin));
  return {};
}

namespace {

// The entry symbol of another ABI major, if the library has one: turns "not
// a plugin" into "a plugin for another ufab", which needs a different fix.
std::string other_major_entry(void* handle) {
  for (unsigned major = 0; major < 16; ++major) {
    if (major == UFAB_ABI_MAJOR) continue;
    std::string symbol = format("ufab_driver_entry_v%u", major);
    if (dlsym(handle, symbol.c_str()) != nullptr) return symbol;
  }
  return "";
}

}  // namespace

Status PluginRegistry::load_file(const std::string& so_path) {
  auto load = [&]() -> Status {
    struct stat st {};
    if (::stat(so_path.c_str(), &st) != 0) {
      if (errno == ENOENT) return fail(ENOENT, "no such file: check the path");
      return fail_errno("cannot stat it");
    }
    if (!S_ISREG(st.st_mode)) return fail(ENOEXEC, "not a regular file");
    if (auto safe = check_file_and_dirs(so_path); !safe) return safe;

    // Without a slash dlopen would search LD_LIBRARY_PATH and the system
    // directories instead of opening the file we were given (and checked).
    std::string dl_path = so_path.find('/') == std::string::npos ? "./" + so_path : so_path;
    // RTLD_NOW: an unresolved symbol fails here, with a message, rather than
    // killing the process on the first call. RTLD_LOCAL: one plugin's symbols
    // never satisfy another's.
    void* handle = dlopen(dl_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      return fail(ENOEXEC, std::string("dlopen failed: ") + (why != nullptr ? why : "unknown error") +
                               " (a missing library or symbol shows in: ldd -r " + so_path + ")");
    }
    auto library = std::make_unique<Library>(handle);

    dlerror();
    void* entry = dlsym(handle, UFAB_DRIVER_ENTRY_SYMBOL);
    // A plugin that implements queue pairs itself exports the RDMA provider
    // entry instead (or as well): kept for the provider layer, which checks
    // its table (core/provider/providers.h).
    const ufab_rdma_provider* provider = nullptr;
    if (void* rdma_entry = dlsym(handle, UFAB_RDMA_PROVIDER_ENTRY_SYMBOL); rdma_entry != nullptr) {
      provider = reinterpret_cast<ufab_rdma_provider_entry_fn>(rdma_entry)();
      if (provider == nullptr) {
        return fail(ENOEXEC, UFAB_RDMA_PROVIDER_ENTRY_SYMBOL "() returned NULL: the plugin gave no provider table");
      }
      if (entry == nullptr) {
        rdma_providers_.push_back({provider, so_path});
        libraries_.push_back(std::move(library));
        return {};
      }
    }
    if (entry == nullptr) {
      std::string other = other_major_entry(handle);
      if (!other.empty()) {
        return fail(ENOEXEC, "not a ufab plugin for this ufab: no symbol " UFAB_DRIVER_ENTRY_SYMBOL
                             ", but it exports " +
                                 other + ", so it was built for another ABI major; this ufab speaks " +
                                 abi_version(UFAB_ABI_MAJOR, UFAB_ABI_MINOR) +
                                 ": rebuild the plugin against abi/raw_frame.h of this ufab");
      }
      return fail(ENOEXEC, "not a ufab plugin: no symbol " UFAB_DRIVER_ENTRY_SYMBOL " or "
                           UFAB_RDMA_PROVIDER_ENTRY_SYMBOL " (a plugin defines it in its <name>_entry.cc and exports it; see "
                           "docs/plugin-guide.md)");
    }
    auto entry_fn = reinterpret_cast<ufab_driver_entry_fn>(entry);
    const ufab_driver* driver = entry_fn();
    if (driver == nullptr) {
      return fail(ENOEXEC, UFAB_DRIVER_ENTRY_SYMBOL "() returned NULL: the plugin gave no driver table");
    }
    if (auto st = register_driver(driver, so_path); !st) return st;
    // Kept only with its library: a refused driver table closes it.
    if (provider != nullptr) rdma_providers_.push_back({provider, so_path});
    libraries_.push_back(std::move(library));
    return {};
  };
  if (auto st = load(); !st) return std::unexpected(st.error().context("loading plugin " + so_path));
  return {};
}

Status PluginRegistry::load_directory_impl(const std::string& dir, bool missing_is_warning) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT && missing_is_warning) {
      warnings_.push_back("plugin directory " + dir + " does not exist; skipped");
      return {};
    }
    if (err == ENOENT) return fail(ENOENT, "plugin directory " + dir + " does not exist: create it or fix the path");
    return fail_errno(err, "cannot open plugin directory " + dir);
  }
  if (!S_ISDIR(st.st_mode)) return fail(ENOTDIR, "plugin directory " + dir + " is not a directory");
  if (auto safe = check_safe(dir, "plugin directory"); !safe) return safe;

  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return fail_errno("cannot list plugin directory " + dir);
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (ends_with(n, ".so")) names.push_back(n);
  }
  ::closedir(d);
  // Name order makes "first wins" for duplicate names the same on every run.
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    std::string path = dir == "/" ? "/" + n : dir + "/" + n;
    if (auto st = load_file(path); !st) {
      // load_file's message starts with "loading plugin <path>: ".
      std::string why = st.error().message();
      std::string prefix = "loading plugin " + path + ": ";
      if (why.compare(0, prefix.size(), prefix) == 0) why.erase(0, prefix.size());
      warnings_.push_back("skipped " + path + ": " + why);
    }
  }
  return {};
}

Status PluginRegistry::load_directory(const std::string& dir) { return load_directory_impl(dir, false); }

Status PluginRegistry::load_default() {
  const char* env = std::getenv("UFAB_PLUGIN_PATH");
  bool use_env = env != nullptr && env[0] != '\0';
  if (use_env && secure_mode()) {
    // A setuid program must not load code chosen by whoever started it.
    warnings_.push_back(
        "UFAB_PLUGIN_PATH is ignored: this process runs setuid or setgid, and the variable would let the user "
        "who started it load any code with its privileges; using the default plugin directory instead");
    use_env = false;
  }
  if (use_env) {
    Status first_error;
    std::string path = env;
    size_t start = 0;
    while (start <= path.size()) {
      size_t colon = path.find(':', start);
      if (colon == std::string::npos) colon = path.size();
      std::string dir = path.substr(start, colon - start);
      start = colon + 1;
      // An empty entry means "current directory" in PATH; here it means
      // nothing, so a stray colon cannot load plugins from wherever ufab runs.
      if (dir.empty()) continue;
      if (auto st = load_directory_impl(dir, true); !st && first_error) {
        first_error = std::unexpected(st.error().context("UFAB_PLUGIN_PATH"));
      }
    }
    return first_error;
  }
  std::string dir = default_directory();
  if (dir.empty()) {
    warnings_.push_back(
        "cannot tell where this program lives, so the default plugin directory is not searched; "
        "set UFAB_PLUGIN_PATH");
    return {};
  }
  // The default directory is optional: most installations have only
  // built-ins, so its absence is not worth a warning on every run.
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 && errno == ENOENT) return {};
  return load_directory_impl(dir, true);
}

std::string PluginRegistry::default_directory() {
  Dl_info info{};
  link_map* map = nullptr;
  // Any function of this library locates the file it was loaded from.
  void* self = reinterpret_cast<void*>(&PluginRegistry::default_directory);
  if (dladdr1(self, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 || map == nullptr) return "";
  std::string file;
  if (map->l_name == nullptr || map->l_name[0] == '\0') {
    // Linked into the main program: dladdr would report argv[0], which may
    // be relative or a bare name found through PATH; /proc/self/exe is the
    // real file.
    file = real_path("/proc/self/exe");
  } else {
    file = real_path(map->l_name);
  }
  if (file.empty()) return "";
  return parent_dir(file) + "/ufab-plugins";
}

const Plugin* PluginRegistry::for_pci(const PciIdentity& id, const ufab_pci_match** row) const {
  const Plugin* best = nullptr;
  const ufab_pci_match* best_row = nullptr;
  Score best_score{};
  for (const auto& p : plugins_) {
    if (p->software) continue;
    for (const ufab_pci_match& r : p->matches) {
      if (!row_matches(r, id)) continue;
      Score s = row_score(r);
      // Strictly better only: on a tie the plugin registered first (built-ins
      // before loaded ones) and its first row win.
      if (best == nullptr || s > best_score) {
        best = p.get();
        best_row = &r;
        best_score = s;
      }
    }
  }
  if (row != nullptr) *row = best_row;
  return best;
}

const Plugin* PluginRegistry::by_name(const std::string& name) const {
  for (const auto& p : plugins_) {
    if (p->name == name) return p.get();
  }
  return nullptr;
}

const std::vector<std::unique_ptr<Plugin>>& PluginRegistry::plugins() const { return plugins_; }

const std::vector<PluginRegistry::RdmaProviderTable>& PluginRegistry::rdma_providers() const {
  return rdma_providers_;
}

const std::vector<std::string>& PluginRegistry::warnings() const { return warnings_; }

void PluginRegistry::set_secure_mode_for_testing(bool secure) { force_secure_ = secure; }

bool PluginRegistry::secure_mode() const { return force_secure_ || getauxval(AT_SECURE) != 0; }

}  // namespace ufab::core
