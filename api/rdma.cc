#include "api/rdma.h"

#include <mutex>

#include "core/net/addresses.h"
#include "core/nic_open.h"
#include "core/transport/context.h"
#include "core/transport/link.h"
#include "core/transport/queue_pair.h"
#include "drivers/builtin.h"

namespace ufab::rdma {

using transport::Clock;

// ------------------------------------------------------------------- Device

Device::Device(std::shared_ptr<transport::Context> context) : context_(std::move(context)) {}
Device::~Device() = default;

Result<std::unique_ptr<Device>> Device::open(const std::string& spec, const DeviceOptions& options) {
  if (options.ip.empty()) {
    return fail(EINVAL, "opening " + spec + ": no IPv4 address given; a ufab port needs its own (e.g. ip = "
                        "\"10.0.0.1\"), since the kernel has no netdev for it");
  }
  auto ip = net::Ipv4Address::parse(options.ip);
  if (!ip) return std::unexpected(ip.error().context("opening " + spec));
  core::OpenOptions open_options;
  open_options.params = options.params;
  auto nic = core::open_nic(core::default_registry(drivers::builtin_drivers()), spec, open_options);
  if (!nic) return std::unexpected(nic.error());
  auto link = transport::NicLink::create(std::move(*nic), {.ring_size = options.ring_size});
  if (!link) return std::unexpected(link.error().context("opening " + spec));
  auto context = transport::Context::create(std::move(*link), *ip);
  if (!context) return std::unexpected(context.error().context("opening " + spec));
  std::unique_ptr<Device> device(new Device(std::move(*context)));
  if (options.progress_thread) {
    if (auto s = device->context_->start_progress_thread(); !s) return std::unexpected(s.error());
  }
  return device;
}

uint32_t Device::ip() const { return context_->ip().value; }
uint32_t Device::active_mtu() const { return context_->active_mtu(); }
std::string Device::name() const { return context_->link().name(); }

DeviceStats Device::stats() const {
  std::lock_guard lock(context_->mutex());
  return context_->stats();
}

Result<ProtectionDomain> Device::alloc_pd() {
  std::lock_guard lock(context_->mutex());
  auto pd = context_->memory().alloc_pd();
  if (!pd) return std::unexpected(pd.error());
  return ProtectionDomain(context_, *pd);
}

Result<std::unique_ptr<CompletionQueue>> Device::create_cq(uint32_t depth) {
  std::lock_guard lock(context_->mutex());
  auto cq = context_->create_cq_locked(depth);
  if (!cq) return std::unexpected(cq.error());
  return std::unique_ptr<CompletionQueue>(new CompletionQueue(context_, *cq));
}

Status Device::start_progress_thread() {
  if (context_->has_progress_thread()) return {};  // the device's own, or already started
  if (auto s = context_->start_progress_thread(); !s) return s;
  temporary_thread_ = true;
  return {};
}

void Device::stop_progress_thread() {
  if (!temporary_thread_) return;
  temporary_thread_ = false;
  context_->stop_progress_thread();
}

int Device::progress() {
  std::lock_guard lock(context_->mutex());
  return context_->progress_locked();
}

// --------------------------------------------------------- ProtectionDomain

ProtectionDomain::ProtectionDomain(ProtectionDomain&& other) noexcept
    : context_(std::move(other.context_)), id_(other.id_) {}

ProtectionDomain& ProtectionDomain::operator=(ProtectionDomain&& other) noexcept {
  if (this != &other) {
    release();
    context_ = std::move(other.context_);
    id_ = other.id_;
  }
  return *this;
}

ProtectionDomain::~ProtectionDomain() { release(); }

void ProtectionDomain::release() {
  if (context_ == nullptr) return;
  std::lock_guard lock(context_->mutex());
  // EBUSY while regions remain: they keep the PD's id alive in the table
  // and are freed with it when the device closes.
  (void)context_->memory().dealloc_pd(id_);
  context_.reset();
}

Result<MemoryRegion> ProtectionDomain::register_mr(void* addr, uint64_t length, AccessFlags access) {
  std::lock_guard lock(context_->mutex());
  auto keys = context_->memory().register_mr(id_, addr, length, access);
  if (!keys) return std::unexpected(keys.error());
  return MemoryRegion(context_, *keys, addr, length);
}

Result<AddressHandle> ProtectionDomain::create_ah(const AddressVector& av) {
  net::Ipv4Address ip{av.dest_ip};
  std::lock_guard lock(context_->mutex());
  if (!ip.is_unicast() || ip == context_->ip()) {
    return fail(EINVAL, "address handle for " + ip.str() + ": not a unicast IPv4 address of a peer (GID ::ffff:a.b.c.d)");
  }
  auto mac = context_->resolve_locked(ip);  // sends the first ARP request now
  if (!mac) return std::unexpected(mac.error().context("address handle for " + ip.str()));
  context_->link().tx_flush();
  return AddressHandle(av);
}

Result<std::unique_ptr<QueuePair>> ProtectionDomain::create_qp(const QpInit& init) {
  std::lock_guard lock(context_->mutex());
  auto qp = context_->create_qp_locked(id_, init.type, init.send_cq ? init.send_cq->impl_ : nullptr,
                                       init.recv_cq ? init.recv_cq->impl_ : nullptr, init.caps, init.sq_sig_all);
  if (!qp) return std::unexpected(qp.error());
  return std::unique_ptr<QueuePair>(new QueuePair(context_, *qp));
}

// ------------------------------------------------------------- MemoryRegion

MemoryRegion::MemoryRegion(MemoryRegion&& other) noexcept
    : context_(std::move(other.context_)), keys_(other.keys_), addr_(other.addr_), length_(other.length_) {}

MemoryRegion& MemoryRegion::operator=(MemoryRegion&& other) noexcept {
  if (this != &other) {
    (void)deregister();
    context_ = std::move(other.context_);
    keys_ = other.keys_;
    addr_ = other.addr_;
    length_ = other.length_;
  }
  return *this;
}

MemoryRegion::~MemoryRegion() { (void)deregister(); }

Sge MemoryRegion::sge(uint64_t offset, uint32_t length) const {
  return Sge{reinterpret_cast<uint64_t>(addr_) + offset, length, keys_.lkey};
}

Status MemoryRegion::deregister() {
  if (context_ == nullptr) return {};
  // No device lock here: checks in flight hold pins, and deregister_mr
  // waits for them, which needs the transport to keep running.
  auto s = context_->memory().deregister_mr(keys_.lkey);
  if (s) context_.reset();
  return s;
}

// ---------------------------------------------------------- CompletionQueue

CompletionQueue::~CompletionQueue() {
  std::lock_guard lock(context_->mutex());
  // Fails only while a QP still uses it; the context frees it at close then.
  (void)context_->destroy_cq_locked(impl_);
}

Result<size_t> CompletionQueue::poll(std::span<WorkCompletion> out) {
  std::lock_guard lock(context_->mutex());
  if (impl_->empty() && !context_->has_progress_thread()) context_->progress_locked();
  if (uint64_t lost = impl_->take_overflow()) {
    return fail(EOVERFLOW, "completion queue overflow: " + std::to_string(lost) +
                               " completions did not fit its " + std::to_string(impl_->depth()) +
                               " entries and were lost, and the QPs they belonged to went to ERROR; "
                               "poll more often or create a deeper CQ");
  }
  return impl_->pop(out);
}

Result<size_t> CompletionQueue::wait(std::span<WorkCompletion> out, std::chrono::milliseconds timeout) {
  context_->wait_for_completion(*impl_, Clock::now() + timeout);
  return poll(out);
}

int CompletionQueue::event_fd() const { return impl_->event_fd(); }

void CompletionQueue::request_notify() {
  std::lock_guard lock(context_->mutex());
  impl_->arm();
}

uint32_t CompletionQueue::depth() const { return impl_->depth(); }

// ---------------------------------------------------------------- QueuePair

QueuePair::~QueuePair() {
  std::lock_guard lock(context_->mutex());
  context_->destroy_qp_locked(impl_);
}

uint32_t QueuePair::qp_num() const { return impl_->qpn(); }
QpType QueuePair::type() const { return impl_->type(); }

QpState QueuePair::state() const {
  std::lock_guard lock(context_->mutex());
  return impl_->state();
}

QpAttr QueuePair::attr() const {
  std::lock_guard lock(context_->mutex());
  return impl_->attr();
}

Status QueuePair::modify(const QpAttr& attr, QpAttrMask mask) {
  std::lock_guard lock(context_->mutex());
  return impl_->modify(attr, mask);
}

ConnectionData QueuePair::local() const {
  return ConnectionData{.ip = context_->ip().value, .qpn = impl_->qpn(), .psn = impl_->initial_psn()};
}

Status QueuePair::connect(const ConnectionData& peer, const QpAttr& tuning) {
  QpAttr a = tuning;
  a.state = QpState::kInit;
  a.pkey_index = 0;
  a.port = 1;
  if (type() == QpType::kRc) {
    if (auto s = modify(a, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrAccessFlags); !s) return s;
    a.state = QpState::kRtr;
    a.av.dest_ip = peer.ip;
    a.dest_qpn = peer.qpn;
    a.rq_psn = peer.psn;
    a.path_mtu = std::min(tuning.path_mtu, context_->active_mtu());
    if (auto s = modify(a, kAttrState | kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic |
                               kAttrMinRnrTimer);
        !s) {
      return s;
    }
    a.state = QpState::kRts;
    a.sq_psn = impl_->initial_psn();
    return modify(a, kAttrState | kAttrSqPsn | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic);
  }
  if (auto s = modify(a, kAttrState | kAttrPkeyIndex | kAttrPort | kAttrQkey); !s) return s;
  a.state = QpState::kRtr;
  if (auto s = modify(a, kAttrState); !s) return s;
  a.state = QpState::kRts;
  a.sq_psn = impl_->initial_psn();
  return modify(a, kAttrState | kAttrSqPsn);
}

Status QueuePair::post_send(const SendWr& wr) { return post_send(std::span<const SendWr>(&wr, 1)); }

Status QueuePair::post_send(std::span<const SendWr> wrs) {
  std::lock_guard lock(context_->mutex());
  Status result;
  for (size_t i = 0; i < wrs.size() && result; ++i) {
    result = impl_->post_send(wrs[i]);
    if (!result && wrs.size() > 1) {
      result = std::unexpected(result.error().context("work request " + std::to_string(i) + " of " +
                                                      std::to_string(wrs.size()) + " (the ones before it are posted)"));
    }
  }
  // Straight to the wire when the window allows, one doorbell for the
  // list; the rest goes out as ACKs arrive.
  impl_->transmit();
  context_->link().tx_flush();
  return result;
}

Status QueuePair::post_recv(const RecvWr& wr) {
  std::lock_guard lock(context_->mutex());
  return impl_->post_recv(wr);
}

}  // namespace ufab::rdma
