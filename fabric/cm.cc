// Connection management: libfabric's passive endpoints, fi_connect,
// fi_accept, fi_reject and fi_shutdown over ufab's connection manager
// (<ufab/cm.h>), and the thread per device that turns its events into EQ
// entries.
#include <arpa/inet.h>
#include <poll.h>

#include <cstdlib>
#include <cstring>
#include <random>

#include "fabric/provider.h"

namespace ufab_fi {

namespace {

std::mutex g_cm_mu;
// Never destroyed (as shm_cm.cc's g_shm): the CM threads may look at them
// until libfabric's destructor calls the provider's cleanup.
std::unordered_map<ufab_cm_listener*, Pep*>& g_listeners = *new std::unordered_map<ufab_cm_listener*, Pep*>;
std::unordered_set<Ep*>& g_live_eps = *new std::unordered_set<Ep*>;

sockaddr_in sin_of(uint32_t ip, uint16_t port) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_addr.s_addr = htonl(ip);
  s.sin_port = htons(port);
  return s;
}

EqEntry cm_entry(uint32_t event, fid_t fid, fi_info* info, const uint8_t* data, size_t len) {
  EqEntry e;
  e.event = event;
  e.bytes.resize(sizeof(fi_eq_cm_entry) + len);
  fi_eq_cm_entry ce{};
  ce.fid = fid;
  ce.info = info;
  std::memcpy(e.bytes.data(), &ce, sizeof ce);
  if (len > 0) std::memcpy(e.bytes.data() + sizeof ce, data, len);
  return e;
}

EqEntry err_entry(Ep* ep, int err, int prov_errno, const uint8_t* data, size_t len) {
  EqEntry e;
  e.is_err = true;
  e.err.fid = &ep->ep.fid;
  e.err.context = ep->ep.fid.context;
  e.err.err = err;
  e.err.prov_errno = prov_errno;
  e.err_data.assign(data, data + len);
  return e;
}

fi_info* connreq_info(Pep* pep, Dev* d, uint32_t peer_ip, uint16_t peer_port, uint16_t local_port, ConnReq* cr) {
  fi_info* info = fi_dupinfo(pep->info);
  sockaddr_in peer = sin_of(peer_ip, peer_port), local = sin_of(d->ip, local_port);
  std::free(info->dest_addr);
  info->dest_addr = std::calloc(1, sizeof peer);
  std::memcpy(info->dest_addr, &peer, sizeof peer);
  info->dest_addrlen = sizeof peer;
  std::free(info->src_addr);
  info->src_addr = std::calloc(1, sizeof local);
  std::memcpy(info->src_addr, &local, sizeof local);
  info->src_addrlen = sizeof local;
  info->handle = &cr->fid_;
  return info;
}

Ep* ep_of(ufab_cm_id* id) {
  auto* ep = static_cast<Ep*>(ufab_cm_id_context(id));
  return ep != nullptr && g_live_eps.count(ep) != 0 ? ep : nullptr;
}

void route(Dev* d, const ufab_cm_event& ev) {
  switch (ev.type) {
    case UFAB_CM_EVENT_CONNECT_REQUEST: {
      auto it = g_listeners.find(ev.listener);
      Pep* pep = it != g_listeners.end() ? it->second : nullptr;
      if (pep == nullptr || pep->eq == nullptr) {
        ufab_cm_reject(ev.id, nullptr, 0);
        ufab_cm_id_destroy(ev.id);
        return;
      }
      auto* cr = new ConnReq;
      cr->fid_.fclass = FI_CLASS_CONNREQ;
      cr->dev = d;
      cr->id = ev.id;
      fi_info* info = connreq_info(pep, d, ev.peer_ip, ev.peer_port, ev.local_port, cr);
      pep->eq->push(cm_entry(FI_CONNREQ, &pep->pep.fid, info, ev.private_data, ev.private_data_len));
      return;
    }
    case UFAB_CM_EVENT_ESTABLISHED: {
      Ep* ep = ep_of(ev.id);
      if (ep == nullptr || ep->eq == nullptr) return;
      ep->state = EpState::kConnected;
      ep->peer = sin_of(ev.peer_ip, ev.peer_port);
      ep->local = sin_of(d->ip, ev.local_port);
      ep->eq->push(cm_entry(FI_CONNECTED, &ep->ep.fid, nullptr, ev.private_data, ev.private_data_len));
      return;
    }
    case UFAB_CM_EVENT_REJECTED: {
      Ep* ep = ep_of(ev.id);
      if (ep == nullptr || ep->eq == nullptr) return;
      ep->state = EpState::kShutdown;
      ep->eq->push(err_entry(ep, FI_ECONNREFUSED, ev.reject_reason, ev.private_data, ev.private_data_len));
      return;
    }
    case UFAB_CM_EVENT_UNREACHABLE:
    case UFAB_CM_EVENT_CONNECT_ERROR: {
      Ep* ep = ep_of(ev.id);
      if (ep == nullptr || ep->eq == nullptr) return;  // a request the peer gave up before the accept
      ep->state = EpState::kShutdown;
      int err = ev.type == UFAB_CM_EVENT_CONNECT_ERROR ? FI_ECONNABORTED
                : ev.status != 0                       ? -ev.status
                                                       : FI_ETIMEDOUT;
      ep->eq->push(err_entry(ep, err, 0, nullptr, 0));
      return;
    }
    case UFAB_CM_EVENT_DISCONNECTED: {
      Ep* ep = ep_of(ev.id);
      if (ep == nullptr || ep->eq == nullptr) return;
      ep->state = EpState::kShutdown;
      ep->eq->push(cm_entry(FI_SHUTDOWN, &ep->ep.fid, nullptr, nullptr, 0));
      return;
    }
    default: return;
  }
}

}  // namespace

std::mutex& cm_mutex() { return g_cm_mu; }
void cm_push_entry(Eq* eq, uint32_t event, fid_t fid, fi_info* info, const uint8_t* data, size_t len) {
  eq->push(cm_entry(event, fid, info, data, len));
}
void cm_push_error(Ep* ep, int err, int prov_errno, const uint8_t* data, size_t len) {
  if (ep->eq != nullptr) ep->eq->push(err_entry(ep, err, prov_errno, data, len));
}
bool cm_ep_live(Ep* ep) { return g_live_eps.count(ep) != 0; }
fi_info* cm_connreq_info(Pep* pep, Dev* d, uint32_t peer_ip, uint16_t peer_port, uint16_t local_port, ConnReq* cr) {
  return connreq_info(pep, d, peer_ip, peer_port, local_port, cr);
}

// One round of the device's CM thread: wait up to 100 ms for events, route
// them.
void cm_dispatch(Dev* d) {
  pollfd p{ufab_cm_event_fd(d->cm), POLLIN, 0};
  (void)::poll(&p, 1, 100);
  for (;;) {
    std::lock_guard<std::mutex> lk(g_cm_mu);
    ufab_cm_event ev{};
    if (ufab_cm_get_event(d->cm, &ev, 0) != 0) return;
    route(d, ev);
  }
}

int cm_listen(Pep* pep) {
  if (shm_device(pep->dev)) {
    std::lock_guard<std::mutex> lk(g_cm_mu);
    if (pep->shm_link != nullptr) return -FI_EOPBADSTATE;
    return shm_listen(pep);
  }
  int rc = ensure_cm(pep->dev);
  if (rc != 0) return rc;
  std::lock_guard<std::mutex> lk(g_cm_mu);
  if (pep->listener != nullptr) return -FI_EOPBADSTATE;
  if (pep->port != 0) {
    rc = ufab_cm_listen(pep->dev->cm, pep->port, &pep->listener);
    if (rc != 0) return neg(-rc) == -EADDRINUSE ? -FI_EADDRINUSE : neg(-rc);
  } else {
    std::random_device rd;
    std::mt19937 gen(rd());
    for (int tries = 0; tries < 64; tries++) {
      auto port = static_cast<uint16_t>(20000 + gen() % 40000);
      rc = ufab_cm_listen(pep->dev->cm, port, &pep->listener);
      if (rc == 0) {
        pep->port = port;
        break;
      }
      if (rc != -EADDRINUSE) return neg(-rc);
    }
    if (pep->listener == nullptr) return -FI_EADDRINUSE;
  }
  g_listeners[pep->listener] = pep;
  return 0;
}

void cm_forget_pep(Pep* pep) {
  std::lock_guard<std::mutex> lk(g_cm_mu);
  if (shm_device(pep->dev)) {
    shm_forget_pep(pep);
    return;
  }
  if (pep->listener != nullptr) {
    g_listeners.erase(pep->listener);
    ufab_cm_listener_close(pep->listener);
    pep->listener = nullptr;
  }
}

void cm_register_ep(Ep* ep) {
  std::lock_guard<std::mutex> lk(g_cm_mu);
  g_live_eps.insert(ep);
}

int cm_connect(Ep* ep, const sockaddr_in& dest, const void* param, size_t len) {
  if (len > kConnectDataMax) return -FI_EINVAL;
  if (shm_device(ep->dom->dev)) {
    std::lock_guard<std::mutex> lk(g_cm_mu);
    return shm_connect(ep, dest, param, len);
  }
  int rc = ensure_cm(ep->dom->dev);
  if (rc != 0) return rc;
  ufab_cm_conn_param p{};
  p.private_data = len > 0 ? param : nullptr;
  p.private_data_len = static_cast<uint8_t>(len);
  std::lock_guard<std::mutex> lk(g_cm_mu);
  if (ep->id != nullptr) return -FI_EISCONN;
  rc = ufab_cm_connect(ep->dom->dev->cm, ep->qp, ntohl(dest.sin_addr.s_addr), ntohs(dest.sin_port), &p, &ep->id);
  if (rc != 0) return neg(-rc);
  ufab_cm_id_set_context(ep->id, ep);
  ep->peer = dest;
  ep->state = EpState::kConnecting;
  return 0;
}

int cm_accept(Ep* ep, const void* param, size_t len) {
  if (len > kAcceptDataMax) return -FI_EINVAL;
  if (ep->connreq == nullptr) return -FI_EOPBADSTATE;
  if (shm_device(ep->dom->dev)) {
    std::lock_guard<std::mutex> lk(g_cm_mu);
    return shm_accept(ep, param, len);
  }
  ufab_cm_conn_param p{};
  p.private_data = len > 0 ? param : nullptr;
  p.private_data_len = static_cast<uint8_t>(len);
  std::lock_guard<std::mutex> lk(g_cm_mu);
  ufab_cm_id* id = ep->connreq->id;
  ufab_cm_id_set_context(id, ep);
  int rc = ufab_cm_accept(id, ep->qp, &p);
  if (rc != 0) {
    ufab_cm_id_set_context(id, nullptr);
    return neg(-rc);
  }
  ep->id = id;
  ep->state = EpState::kAccepting;
  return 0;
}

int cm_reject(Pep* pep, ConnReq* req, const void* param, size_t len) {
  (void)pep;
  if (len > kRejectDataMax) return -FI_EINVAL;
  std::lock_guard<std::mutex> lk(g_cm_mu);
  if (shm_device(req->dev)) return shm_reject(req, param, len);
  int rc = ufab_cm_reject(req->id, param, static_cast<uint8_t>(len));
  ufab_cm_id_destroy(req->id);
  delete req;
  return rc != 0 ? neg(-rc) : 0;
}

int cm_shutdown(Ep* ep) {
  std::lock_guard<std::mutex> lk(g_cm_mu);
  if (shm_device(ep->dom->dev)) return shm_shutdown(ep);
  if (ep->id == nullptr) return -FI_ENOTCONN;
  if (ep->state == EpState::kShutdown) return 0;
  int rc = ufab_cm_disconnect(ep->id);
  return rc != 0 ? neg(-rc) : 0;
}

void cm_forget_ep(Ep* ep) {
  std::lock_guard<std::mutex> lk(g_cm_mu);
  g_live_eps.erase(ep);
  if (shm_device(ep->dom->dev)) {
    shm_forget_ep(ep);
    return;
  }
  if (ep->id != nullptr) {
    ufab_cm_id_set_context(ep->id, nullptr);
    ufab_cm_id_destroy(ep->id);
    ep->id = nullptr;
  } else if (ep->connreq != nullptr) {
    // Never accepted: turn the peer away.
    ufab_cm_reject(ep->connreq->id, nullptr, 0);
    ufab_cm_id_destroy(ep->connreq->id);
  }
  delete ep->connreq;
  ep->connreq = nullptr;
}

// -------------------------------------------------------- passive endpoint

namespace {

int no_ops_open(fid*, const char*, uint64_t, void**, void*) { return -FI_ENOSYS; }

int pep_close(fid* f) {
  auto* pep = reinterpret_cast<Pep*>(f);
  cm_forget_pep(pep);
  if (pep->eq != nullptr) pep->eq->refs--;
  fi_freeinfo(pep->info);
  delete pep;
  return 0;
}

int pep_bind(fid* f, fid* b, uint64_t) {
  auto* pep = reinterpret_cast<Pep*>(f);
  if (b->fclass != FI_CLASS_EQ) return -FI_EINVAL;
  std::lock_guard<std::mutex> lk(g_cm_mu);
  if (pep->eq != nullptr) pep->eq->refs--;
  pep->eq = reinterpret_cast<Eq*>(b);
  pep->eq->refs++;
  return 0;
}

int pep_control(fid*, int, void*) { return -FI_ENOSYS; }

fi_ops g_pep_fi_ops = {sizeof(fi_ops), pep_close, pep_bind, pep_control, no_ops_open, nullptr, nullptr};

int pep_getname(fid_t f, void* addr, size_t* addrlen) {
  auto* pep = reinterpret_cast<Pep*>(f);
  sockaddr_in s = sin_of(pep->dev->ip, pep->port);
  size_t have = *addrlen;
  *addrlen = sizeof s;
  if (have < sizeof s) return -FI_ETOOSMALL;
  std::memcpy(addr, &s, sizeof s);
  return 0;
}

int pep_setname(fid_t f, void* addr, size_t addrlen) {
  auto* pep = reinterpret_cast<Pep*>(f);
  if (addrlen < sizeof(sockaddr_in) || static_cast<sockaddr*>(addr)->sa_family != AF_INET) return -FI_EINVAL;
  auto* s = static_cast<sockaddr_in*>(addr);
  Dev* d = device_by_ip(ntohl(s->sin_addr.s_addr));
  if (d == nullptr || (d != pep->dev)) return -FI_EINVAL;
  if (pep->listener != nullptr) return -FI_EOPBADSTATE;
  pep->port = ntohs(s->sin_port);
  return 0;
}

int pep_listen(fid_pep* p) { return cm_listen(reinterpret_cast<Pep*>(p)); }

int pep_reject(fid_pep* p, fid_t handle, const void* param, size_t len) {
  if (handle == nullptr || handle->fclass != FI_CLASS_CONNREQ) return -FI_EINVAL;
  return cm_reject(reinterpret_cast<Pep*>(p), reinterpret_cast<ConnReq*>(handle), param, len);
}

int no_getpeer(fid_ep*, void*, size_t*) { return -FI_ENOSYS; }
int no_connect(fid_ep*, const void*, const void*, size_t) { return -FI_ENOSYS; }
int no_accept(fid_ep*, const void*, size_t) { return -FI_ENOSYS; }
int no_shutdown(fid_ep*, uint64_t) { return -FI_ENOSYS; }
int no_join(fid_ep*, const void*, uint64_t, fid_mc**, void*) { return -FI_ENOSYS; }

fi_ops_cm g_pep_cm_ops = {sizeof(fi_ops_cm), pep_setname, pep_getname, no_getpeer, no_connect,
                          pep_listen,        no_accept,   pep_reject,  no_shutdown, no_join};

int pep_getopt(fid_t, int level, int optname, void* optval, size_t* optlen) {
  if (level != FI_OPT_ENDPOINT) return -FI_ENOPROTOOPT;
  if (optname == FI_OPT_CM_DATA_SIZE) {
    if (*optlen < sizeof(size_t)) return -FI_ETOOSMALL;
    *static_cast<size_t*>(optval) = kConnectDataMax;
    *optlen = sizeof(size_t);
    return 0;
  }
  return -FI_ENOPROTOOPT;
}
int pep_setopt(fid_t, int, int, const void*, size_t) { return -FI_ENOPROTOOPT; }
ssize_t pep_cancel(fid_t, void*) { return -FI_ENOENT; }

fi_ops_ep g_pep_ep_ops = {sizeof(fi_ops_ep), pep_cancel, pep_getopt, pep_setopt, nullptr, nullptr, nullptr, nullptr};

}  // namespace

int pep_open(fid_fabric* fabric, fi_info* info, fid_pep** out, void* context) {
  if (info == nullptr || info->ep_attr == nullptr || info->ep_attr->type != FI_EP_MSG) return -FI_EINVAL;
  Dev* d = nullptr;
  uint16_t port = 0;
  if (info->src_addr != nullptr && info->src_addrlen >= sizeof(sockaddr_in)) {
    auto* s = static_cast<sockaddr_in*>(info->src_addr);
    if (s->sin_family == AF_INET) {
      d = device_by_ip(ntohl(s->sin_addr.s_addr));
      port = ntohs(s->sin_port);
    }
  }
  if (d == nullptr && info->domain_attr != nullptr && info->domain_attr->name != nullptr)
    d = device_by_name(info->domain_attr->name);
  if (d == nullptr) return -FI_ENODEV;
  auto* pep = new Pep;
  pep->fabric = reinterpret_cast<Fabric*>(fabric);
  pep->info = fi_dupinfo(info);
  pep->dev = d;
  pep->port = port;
  pep->pep.fid.fclass = FI_CLASS_PEP;
  pep->pep.fid.context = context;
  pep->pep.fid.ops = &g_pep_fi_ops;
  pep->pep.ops = &g_pep_ep_ops;
  pep->pep.cm = &g_pep_cm_ops;
  *out = &pep->pep;
  return 0;
}

}  // namespace ufab_fi
