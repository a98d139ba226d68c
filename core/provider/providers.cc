#include "core/provider/providers.h"

#include <cerrno>
#include <cstddef>
#include <cstring>


namespace ufab::provider {
namespace {

// Bytes of the header every 1.x table has; operations start after it.
constexpr size_t kHeaderSize = offsetof(ufab_rdma_provider, open_device);
constexpr size_t kMaxPrefixes = 64;

// One stub per operation: -EOPNOTSUPP with a sentence naming it (void ones
// do nothing, wc_detail has no text).
template <typename Name, typename R, typename... Args>
struct Stub;
template <typename Name, typename... Args>
struct Stub<Name, int, Args...> {
  static int fn(Args...) {
    last_error() = std::string("this device's RDMA provider does not implement ") + Name::name() +
                   " (`ufab plugins` lists what each provider lacks)";
    return -EOPNOTSUPP;
  }
};
template <typename Name, typename... Args>
struct Stub<Name, void, Args...> {
  static void fn(Args...) {}
};
template <typename Name, typename... Args>
struct Stub<Name, const char*, Args...> {
  static const char* fn(Args...) { return nullptr; }
};

template <typename Name, typename R, typename... Args>
void fill(R (*&op)(Args...), size_t offset, size_t size, std::vector<std::string>* stubbed) {
  if (offset + sizeof op <= size && op != nullptr) return;
  op = &Stub<Name, R, Args...>::fn;
  if (stubbed != nullptr) stubbed->push_back(Name::name());
}

}  // namespace

std::string& last_error() {
  thread_local std::string text;
  return text;
}

int report(const Error& e) {
  last_error() = e.message();
  return -e.code();
}

int invalid(const char* message) {
  last_error() = message;
  return -EINVAL;
}

ufab_rdma_provider complete_provider_ops(const ufab_rdma_provider& table, std::vector<std::string>* stubbed) {
  ufab_rdma_provider out{};
  size_t size = std::min<size_t>(table.size, sizeof out);
  std::memcpy(&out, &table, size);
  out.size = sizeof out;
#define UFAB_FILL(op)                                                  \
  do {                                                                 \
    struct Name {                                                      \
      static const char* name() { return #op; }                        \
    };                                                                 \
    fill<Name>(out.op, offsetof(ufab_rdma_provider, op), size, stubbed); \
  } while (0)
  UFAB_FILL(open_device);
  UFAB_FILL(close_device);
  UFAB_FILL(query_device);
  UFAB_FILL(device_stats);
  UFAB_FILL(progress);
  UFAB_FILL(start_progress_thread);
  UFAB_FILL(stop_progress_thread);
  UFAB_FILL(alloc_pd);
  UFAB_FILL(dealloc_pd);
  UFAB_FILL(reg_mr);
  UFAB_FILL(dereg_mr);
  UFAB_FILL(create_cq);
  UFAB_FILL(destroy_cq);
  UFAB_FILL(poll_cq);
  UFAB_FILL(wait_cq);
  UFAB_FILL(wc_detail);
  UFAB_FILL(req_notify_cq);
  UFAB_FILL(cq_event_fd);
  UFAB_FILL(create_qp);
  UFAB_FILL(destroy_qp);
  UFAB_FILL(modify_qp);
  UFAB_FILL(query_qp);
  UFAB_FILL(qp_initial_psn);
  UFAB_FILL(post_send);
  UFAB_FILL(post_recv);
  UFAB_FILL(create_ah);
  UFAB_FILL(destroy_ah);
#undef UFAB_FILL
  return out;
}

Status ProviderRegistry::add(const ufab_rdma_provider* table, const std::string& origin) {
  std::string where = "RDMA provider from " + origin;
  if (table == nullptr) return fail(EINVAL, where + ": no provider table");
  if (table->abi_major != UFAB_RDMA_ABI_MAJOR) {
    return fail(ENOEXEC, where + " was built for RDMA provider ABI " + std::to_string(table->abi_major) + "." +
                             std::to_string(table->abi_minor) + "; this ufab speaks " +
                             std::to_string(UFAB_RDMA_ABI_MAJOR) + "." + std::to_string(UFAB_RDMA_ABI_MINOR) +
                             ": rebuild it against this ufab's abi/rdma_provider.h");
  }
  if (table->size < kHeaderSize + sizeof(void*)) {
    return fail(ENOEXEC, where + ": its table is " + std::to_string(table->size) + " bytes, shorter than any 1.x table");
  }
  if (table->name == nullptr || *table->name == '\0' || std::strlen(table->name) > 31) {
    return fail(ENOEXEC, where + ": the provider has no name (1 to 31 characters)");
  }
  auto p = std::make_unique<Provider>();
  p->name = table->name;
  p->description = table->description != nullptr ? table->description : "";
  p->origin = origin;
  p->abi_major = table->abi_major;
  p->abi_minor = table->abi_minor;
  for (size_t i = 0; table->prefixes != nullptr && table->prefixes[i] != nullptr; ++i) {
    if (i == kMaxPrefixes) return fail(ENOEXEC, where + ": its prefix table has no terminating NULL");
    p->prefixes.emplace_back(table->prefixes[i]);
  }
  if (p->prefixes.empty() && table->open_device != nullptr) {
    for (const auto& other : providers_) {
      if (other->prefixes.empty()) {
        return fail(EEXIST, where + ": " + p->name + " serves no prefix, and " + other->name +
                                " is already the provider for unprefixed names");
      }
    }
  }
  for (const auto& other : providers_) {
    if (other->name == p->name) return fail(EEXIST, where + ": a provider named " + p->name + " is already registered");
    for (const auto& prefix : p->prefixes) {
      for (const auto& taken : other->prefixes) {
        if (prefix == taken) {
          return fail(EEXIST, where + ": prefix \"" + prefix + "\" is already served by " + other->name);
        }
      }
    }
  }
  p->ops = complete_provider_ops(*table, &p->stubbed_ops);
  providers_.push_back(std::move(p));
  return {};
}

Result<const Provider*> ProviderRegistry::for_device(const std::string& name) const {
  const Provider* fallback = nullptr;
  auto colon = name.find(':');
  std::string prefix = colon == std::string::npos ? "" : name.substr(0, colon);
  for (const auto& p : providers_) {
    if (p->prefixes.empty()) fallback = p.get();
    for (const auto& served : p->prefixes) {
      if (served == prefix) return p.get();
    }
  }
  if (fallback != nullptr) return fallback;
  std::string known;
  for (const auto& p : providers_) known += (known.empty() ? "" : ", ") + p->name;
  return fail(ENODEV, "no RDMA provider serves \"" + name + "\" (providers: " + (known.empty() ? "none" : known) + ")");
}

}  // namespace ufab::provider
