// Connection management for shared-memory devices (shm:DOMAIN), which have
// no GSI QP for ufab's connection manager: the provider's own three-way
// exchange over AF_UNIX stream sockets (fixed-size messages) in the abstract namespace,
// one listening socket per passive endpoint, named
//   "\0ufab-fi/DOMAIN/<device address in hex>/<port>".
// Messages (struct Msg): REQ (the active side's QP number, PSN and CM
// data), REP (the passive side's, after its QP went to RTS) or REJ (reject
// data), RTU (the active side's QP is at RTS), DISC (fi_shutdown). The
// socket stays open while the endpoints are connected: its end (the peer
// closed its endpoint or died) is a disconnection, as is DISC. One thread
// per device polls the sockets and turns messages into EQ entries.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fabric/provider.h"

namespace ufab_fi {

void cm_push_entry(Eq* eq, uint32_t event, fid_t fid, fi_info* info, const uint8_t* data, size_t len);
void cm_push_error(Ep* ep, int err, int prov_errno, const uint8_t* data, size_t len);
bool cm_ep_live(Ep* ep);
fi_info* cm_connreq_info(Pep* pep, Dev* d, uint32_t peer_ip, uint16_t peer_port, uint16_t local_port, ConnReq* cr);
std::mutex& cm_mutex();

namespace {

constexpr uint32_t kMagic = 0x55464d43;  // "UFMC"
enum MsgType : uint8_t { kReq = 1, kRep = 2, kRej = 3, kRtu = 4, kDisc = 5 };

struct Msg {
  uint32_t magic;
  uint8_t type;
  uint8_t len;
  uint16_t port;  // REQ: the active side's endpoint number (its "port")
  uint32_t ip;    // the sender's device address
  uint32_t qpn;
  uint32_t psn;
  uint8_t data[kAcceptDataMax];
};

// What the thread watches.
struct Link {
  int fd = -1;
  Pep* pep = nullptr;     // a listening socket
  Ep* ep = nullptr;       // a connection's endpoint (active, or passive once accepted)
  ConnReq* req = nullptr; // passive, not yet accepted or rejected
  bool dead = false;
  // REJ sent: kept open until the peer closes its end (or 5 s pass), so
  // the REJ is read before the socket's end is seen.
  bool closing = false;
  std::chrono::steady_clock::time_point close_by{};
};

struct ShmCm {
  Dev* dev = nullptr;
  std::mutex mu;  // links
  std::vector<Link*> links;
  int wake = -1;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<uint16_t> next_port{1};
};

// Never destroyed: libfabric calls the provider's cleanup (which stops the
// threads through this map) from its own destructor, after this library's
// static objects are gone.
std::mutex g_shm_mu;
std::unordered_map<Dev*, ShmCm*>& g_shm = *new std::unordered_map<Dev*, ShmCm*>;

std::string sock_name(Dev* d, uint32_t ip, uint16_t port) {
  // The domain is the device name after "shm:".
  std::string dom = d->name.size() > 4 ? d->name.substr(4) : d->name;
  char tail[32];
  std::snprintf(tail, sizeof tail, "/%08x/%u", ip, port);
  return "ufab-fi/" + dom + tail;
}

socklen_t fill_addr(sockaddr_un* a, const std::string& name) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof(a->sun_path) - 2);
  std::memcpy(a->sun_path + 1, name.data(), n);  // abstract: leading NUL
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

bool send_msg(int fd, uint8_t type, uint32_t ip, uint32_t qpn, uint32_t psn, const void* data, size_t len,
              uint16_t port = 0) {
  Msg m{};
  m.magic = kMagic;
  m.type = type;
  m.len = static_cast<uint8_t>(len);
  m.port = port;
  m.ip = ip;
  m.qpn = qpn;
  m.psn = psn;
  if (len > 0) std::memcpy(m.data, data, len);
  return ::send(fd, &m, sizeof m, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof m);
}

void wake(ShmCm* c) {
  uint64_t one = 1;
  (void)!::write(c->wake, &one, sizeof one);
}

void add_link(ShmCm* c, Link* l) {
  {
    std::lock_guard<std::mutex> lk(c->mu);
    c->links.push_back(l);
  }
  wake(c);
}

// RESET/INIT -> RTR -> RTS toward the peer's QP (shm: av.dest_ip is the
// peer device's address).
int qp_to_rts(Ep* ep, uint32_t peer_ip, uint32_t peer_qpn, uint32_t peer_psn, uint32_t my_psn) {
  ufab_qp_attr a;
  ufab_qp_attr_defaults(&a);
  a.state = UFAB_QPS_RTR;
  a.av = ufab_av{};
  a.av.dest_ip = peer_ip;
  a.path_mtu = ep->dom->dev->attr.active_mtu;
  a.dest_qpn = peer_qpn;
  a.rq_psn = peer_psn;
  int rc = ufab_qp_modify(ep->qp, &a,
                          UFAB_QP_STATE | UFAB_QP_AV | UFAB_QP_PATH_MTU | UFAB_QP_DEST_QPN | UFAB_QP_RQ_PSN |
                              UFAB_QP_MAX_DEST_RD_ATOMIC | UFAB_QP_MIN_RNR_TIMER);
  if (rc != 0) return rc;
  a.state = UFAB_QPS_RTS;
  a.sq_psn = my_psn;
  return ufab_qp_modify(ep->qp, &a,
                        UFAB_QP_STATE | UFAB_QP_SQ_PSN | UFAB_QP_TIMEOUT | UFAB_QP_RETRY_CNT | UFAB_QP_RNR_RETRY |
                            UFAB_QP_MAX_QP_RD_ATOMIC);
}

void qp_to_error(Ep* ep) {
  if (ep->qp == nullptr) return;
  ufab_qp_attr a{};
  a.state = UFAB_QPS_ERR;
  ufab_qp_modify(ep->qp, &a, UFAB_QP_STATE);
}

// The connection of `ep` ended (peer's DISC or its socket closed).
void disconnected(Ep* ep) {
  if (ep->state.load() == EpState::kShutdown) return;
  bool was_connecting = ep->state.load() == EpState::kConnecting || ep->state.load() == EpState::kAccepting;
  ep->state = EpState::kShutdown;
  // Take in what the peer answered before it left (the ACK of a last
  // SEND), so that work already done completes as done, not flushed: up to
  // 50 ms for the sends in flight to complete, then the QP goes to ERROR.
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  for (;;) {
    ufab_device_progress(ep->dom->dev->dev);
    if (ep->tx_u != nullptr) poll_ucq(ep->dom, ep->tx_u);
    bool sends = false;
    {
      std::lock_guard<std::mutex> lk(ep->dom->mu);
      for (Op* op : ep->ops)
        if ((op->flags & FI_RECV) == 0) sends = true;
    }
    if (!sends || std::chrono::steady_clock::now() > until) break;
    std::this_thread::yield();
  }
  qp_to_error(ep);
  if (ep->eq == nullptr) return;
  if (was_connecting)
    cm_push_error(ep, FI_ECONNABORTED, 0, nullptr, 0);
  else
    cm_push_entry(ep->eq, FI_SHUTDOWN, &ep->ep.fid, nullptr, nullptr, 0);
}

// One readable link (cm_mutex held).
void on_readable(ShmCm* c, Link* l) {
  if (l->pep != nullptr) {  // a listener: a new connection
    int fd = ::accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    auto* nl = new Link;
    nl->fd = fd;
    nl->pep = nullptr;
    // Remember which listener it came in on until the REQ arrives.
    nl->req = new ConnReq;
    nl->req->fid_.fclass = FI_CLASS_CONNREQ;
    nl->req->dev = c->dev;
    nl->req->shm_link = nl;
    nl->req->shm_pep = l->pep;
    {
      std::lock_guard<std::mutex> lk(c->mu);
      c->links.push_back(nl);
    }
    return;
  }
  Msg m{};
  // Messages are written whole; poll said there is data, so wait for all
  // of it (a stream socket may hand it over in pieces).
  ssize_t n = ::recv(l->fd, &m, sizeof m, MSG_WAITALL);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (l->closing) {
    if (n <= 0) l->dead = true;  // the peer read our REJ and left
    return;
  }
  if (std::getenv("FI_UFAB_SHM_TRACE") != nullptr)
    std::fprintf(stderr, "shm_cm[%d]: fd %d recv %zd errno %d type %d ep %p req %p\n", getpid(), l->fd, n,
                 n < 0 ? errno : 0, n > 0 ? m.type : -1, static_cast<void*>(l->ep), static_cast<void*>(l->req));
  if (n <= 0 || n != static_cast<ssize_t>(sizeof m) || m.magic != kMagic) {
    // The peer went away (or spoke nonsense): the link ends.
    l->dead = true;
    if (l->ep != nullptr && cm_ep_live(l->ep)) {
      l->ep->shm_link = nullptr;
      disconnected(l->ep);
    }
    l->ep = nullptr;
    if (l->req != nullptr) {
      if (l->req->shm_announced) {
        l->req->shm_link = nullptr;  // the application still holds it; fi_accept will fail
      } else {
        delete l->req;
      }
      l->req = nullptr;
    }
    return;
  }
  switch (m.type) {
    case kReq: {
      ConnReq* cr = l->req;
      if (cr == nullptr || cr->shm_announced) return;
      Pep* pep = cr->shm_pep;
      cr->shm_peer_ip = m.ip;
      cr->shm_peer_qpn = m.qpn;
      cr->shm_peer_psn = m.psn;
      if (pep == nullptr || pep->eq == nullptr) {
        send_msg(l->fd, kRej, c->dev->ip, 0, 0, nullptr, 0);
        l->dead = true;
        delete cr;
        l->req = nullptr;
        return;
      }
      cr->shm_announced = true;
      fi_info* info = cm_connreq_info(pep, c->dev, m.ip, m.port, pep->port, cr);
      cm_push_entry(pep->eq, FI_CONNREQ, &pep->pep.fid, info, m.data, m.len);
      return;
    }
    case kRep: {
      Ep* ep = l->ep;
      if (ep == nullptr || !cm_ep_live(ep) || ep->state.load() != EpState::kConnecting) return;
      ufab_conn me{};
      ufab_qp_local(ep->qp, &me);
      int rc = qp_to_rts(ep, m.ip, m.qpn, m.psn, me.psn);
      if (rc != 0 || !send_msg(l->fd, kRtu, c->dev->ip, me.qpn, me.psn, nullptr, 0)) {
        ep->state = EpState::kShutdown;
        cm_push_error(ep, FI_ECONNABORTED, 0, nullptr, 0);
        l->dead = true;
        ep->shm_link = nullptr;
        l->ep = nullptr;
        return;
      }
      ep->state = EpState::kConnected;
      ep->peer.sin_family = AF_INET;
      ep->peer.sin_addr.s_addr = htonl(m.ip);
      if (ep->eq != nullptr) cm_push_entry(ep->eq, FI_CONNECTED, &ep->ep.fid, nullptr, m.data, m.len);
      return;
    }
    case kRej: {
      Ep* ep = l->ep;
      l->dead = true;
      if (ep == nullptr || !cm_ep_live(ep)) return;
      ep->state = EpState::kShutdown;
      ep->shm_link = nullptr;
      l->ep = nullptr;
      cm_push_error(ep, FI_ECONNREFUSED, UFAB_CM_REJ_CONSUMER_REJECTED, m.data, m.len);
      return;
    }
    case kRtu: {
      Ep* ep = l->ep;
      if (ep == nullptr || !cm_ep_live(ep) || ep->state.load() != EpState::kAccepting) return;
      ep->state = EpState::kConnected;
      if (ep->eq != nullptr) cm_push_entry(ep->eq, FI_CONNECTED, &ep->ep.fid, nullptr, nullptr, 0);
      return;
    }
    case kDisc: {
      Ep* ep = l->ep;
      l->dead = true;
      if (ep != nullptr && cm_ep_live(ep)) {
        ep->shm_link = nullptr;
        disconnected(ep);
      }
      l->ep = nullptr;
      return;
    }
    default: return;
  }
}

void thread_main(ShmCm* c) {
  std::vector<pollfd> fds;
  std::vector<Link*> ls;
  while (!c->stop.load()) {
    fds.clear();
    ls.clear();
    fds.push_back(pollfd{c->wake, POLLIN, 0});
    {
      std::lock_guard<std::mutex> lk(c->mu);
      // Drop dead links first.
      auto now = std::chrono::steady_clock::now();
      for (auto it = c->links.begin(); it != c->links.end();) {
        if ((*it)->closing && now > (*it)->close_by) (*it)->dead = true;
        if ((*it)->dead) {
          ::close((*it)->fd);
          delete *it;
          it = c->links.erase(it);
        } else {
          ++it;
        }
      }
      for (Link* l : c->links) {
        fds.push_back(pollfd{l->fd, POLLIN, 0});
        ls.push_back(l);
      }
    }
    int n = ::poll(fds.data(), fds.size(), 200);
    if (n <= 0) continue;
    if (fds[0].revents != 0) {
      uint64_t v;
      (void)!::read(c->wake, &v, sizeof v);
    }
    std::lock_guard<std::mutex> g(cm_mutex());
    for (size_t i = 1; i < fds.size(); i++) {
      if (fds[i].revents == 0) continue;
      Link* l = ls[i - 1];
      bool still;
      {
        std::lock_guard<std::mutex> lk(c->mu);
        still = !l->dead && std::find(c->links.begin(), c->links.end(), l) != c->links.end();
      }
      if (still) on_readable(c, l);
    }
  }
}

ShmCm* shm_cm(Dev* d) {
  std::lock_guard<std::mutex> lk(g_shm_mu);
  auto it = g_shm.find(d);
  if (it != g_shm.end()) return it->second;
  auto* c = new ShmCm;
  c->dev = d;
  c->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  c->thread = std::thread(thread_main, c);
  g_shm[d] = c;
  return c;
}

}  // namespace

bool shm_device(const Dev* d) { return std::strcmp(d->attr.provider, "shm") == 0; }

// cm_mutex() held by the callers below.

int shm_listen(Pep* pep) {
  ShmCm* c = shm_cm(pep->dev);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return neg(errno);
  auto try_port = [&](uint16_t port) {
    sockaddr_un a;
    socklen_t len = fill_addr(&a, sock_name(pep->dev, pep->dev->ip, port));
    return ::bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0;
  };
  bool ok = false;
  if (pep->port != 0) {
    ok = try_port(pep->port);
    if (!ok) {
      int e = errno;
      ::close(fd);
      return e == EADDRINUSE ? -FI_EADDRINUSE : neg(e);
    }
  } else {
    for (int i = 0; i < 1000 && !ok; i++) {
      uint16_t port = static_cast<uint16_t>(20000 + (getpid() * 7 + c->next_port++ * 13) % 40000);
      if (try_port(port)) {
        pep->port = port;
        ok = true;
      }
    }
    if (!ok) {
      ::close(fd);
      return -FI_EADDRINUSE;
    }
  }
  if (::listen(fd, 128) != 0) {
    int e = errno;
    ::close(fd);
    return neg(e);
  }
  auto* l = new Link;
  l->fd = fd;
  l->pep = pep;
  pep->shm_link = l;
  if (std::getenv("FI_UFAB_SHM_TRACE") != nullptr)
    std::fprintf(stderr, "shm_cm[%d]: listening fd %d on %s\n", getpid(), fd,
                 sock_name(pep->dev, pep->dev->ip, pep->port).c_str());
  add_link(c, l);
  return 0;
}

void shm_forget_pep(Pep* pep) {
  auto* l = static_cast<Link*>(pep->shm_link);
  if (l == nullptr) return;
  ShmCm* c = shm_cm(pep->dev);
  std::lock_guard<std::mutex> lk(c->mu);
  l->pep = nullptr;
  l->dead = true;
  // Requests that came in on it and were never announced lose their listener.
  for (Link* x : c->links)
    if (x->req != nullptr && x->req->shm_pep == pep) x->req->shm_pep = nullptr;
  pep->shm_link = nullptr;
  wake(c);
}

int shm_connect(Ep* ep, const sockaddr_in& dest, const void* param, size_t len) {
  ShmCm* c = shm_cm(ep->dom->dev);
  if (ep->shm_link != nullptr) return -FI_EISCONN;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return neg(errno);
  sockaddr_un a;
  socklen_t alen = fill_addr(&a, sock_name(ep->dom->dev, ntohl(dest.sin_addr.s_addr), ntohs(dest.sin_port)));
  ep->peer = dest;
  // Refused: nobody listens on that name (a listening socket takes
  // connections into its backlog without its owner's help, and a blocking
  // connect waits while the backlog is full).
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), alen);
  if (rc != 0) {
    // Nobody listens there: as a REJ "invalid service id" from a CM.
    if (std::getenv("FI_UFAB_SHM_TRACE") != nullptr)
      std::fprintf(stderr, "shm_cm[%d]: connect %s: errno %d\n", getpid(),
                   sock_name(ep->dom->dev, ntohl(dest.sin_addr.s_addr), ntohs(dest.sin_port)).c_str(), errno);
    ::close(fd);
    ep->state = EpState::kShutdown;
    cm_push_error(ep, FI_ECONNREFUSED, UFAB_CM_REJ_INVALID_SERVICE_ID, nullptr, 0);
    return 0;
  }
  ufab_conn me{};
  ufab_qp_local(ep->qp, &me);
  if (!send_msg(fd, kReq, ep->dom->dev->ip, me.qpn, me.psn, param, len, static_cast<uint16_t>(c->next_port++))) {
    int e = errno;
    ::close(fd);
    return neg(e);
  }
  auto* l = new Link;
  l->fd = fd;
  l->ep = ep;
  ep->shm_link = l;
  ep->state = EpState::kConnecting;
  add_link(c, l);
  return 0;
}

int shm_accept(Ep* ep, const void* param, size_t len) {
  ConnReq* cr = ep->connreq;
  auto* l = static_cast<Link*>(cr->shm_link);
  if (l == nullptr) return -FI_ECONNABORTED;  // the peer gave up
  ShmCm* c = shm_cm(ep->dom->dev);
  ufab_conn me{};
  ufab_qp_local(ep->qp, &me);
  int rc = qp_to_rts(ep, cr->shm_peer_ip, cr->shm_peer_qpn, cr->shm_peer_psn, me.psn);
  if (rc != 0) return neg(-rc);
  {
    std::lock_guard<std::mutex> lk(c->mu);
    l->req = nullptr;
    l->ep = ep;
  }
  ep->shm_link = l;
  ep->state = EpState::kAccepting;
  ep->peer.sin_family = AF_INET;
  ep->peer.sin_addr.s_addr = htonl(cr->shm_peer_ip);
  if (!send_msg(l->fd, kRep, ep->dom->dev->ip, me.qpn, me.psn, param, len)) return -FI_ECONNABORTED;
  cr->shm_link = nullptr;
  return 0;
}

int shm_reject(ConnReq* cr, const void* param, size_t len) {
  auto* l = static_cast<Link*>(cr->shm_link);
  if (l != nullptr) {
    bool sent = send_msg(l->fd, kRej, cr->dev->ip, 0, 0, param, len);
    ShmCm* c = shm_cm(cr->dev);
    std::lock_guard<std::mutex> lk(c->mu);
    l->req = nullptr;
    if (sent) {
      l->closing = true;
      l->close_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    } else {
      l->dead = true;
    }
    wake(c);
  }
  delete cr;
  return 0;
}

int shm_shutdown(Ep* ep) {
  auto* l = static_cast<Link*>(ep->shm_link);
  if (l == nullptr) return ep->state.load() == EpState::kShutdown ? 0 : -FI_ENOTCONN;
  send_msg(l->fd, kDisc, ep->dom->dev->ip, 0, 0, nullptr, 0);
  ShmCm* c = shm_cm(ep->dom->dev);
  {
    std::lock_guard<std::mutex> lk(c->mu);
    l->ep = nullptr;
    l->dead = true;
  }
  wake(c);
  ep->shm_link = nullptr;
  disconnected(ep);  // our own FI_SHUTDOWN, as the CM gives both sides one
  return 0;
}

void shm_forget_ep(Ep* ep) {
  auto* l = static_cast<Link*>(ep->shm_link);
  ShmCm* c = shm_cm(ep->dom->dev);
  if (l != nullptr) {
    send_msg(l->fd, kDisc, ep->dom->dev->ip, 0, 0, nullptr, 0);
    std::lock_guard<std::mutex> lk(c->mu);
    l->ep = nullptr;
    l->dead = true;
    wake(c);
  }
  ep->shm_link = nullptr;
  if (ep->connreq != nullptr) {
    // Never accepted: turn the peer away.
    shm_reject(ep->connreq, nullptr, 0);
    ep->connreq = nullptr;
  }
}

void shm_shutdown_all() {
  std::lock_guard<std::mutex> lk(g_shm_mu);
  for (auto& [d, c] : g_shm) {
    c->stop = true;
    wake(c);
    if (c->thread.joinable()) c->thread.join();
    for (Link* l : c->links) {
      ::close(l->fd);
      delete l;
    }
    ::close(c->wake);
    delete c;
  }
  g_shm.clear();
}

}  // namespace ufab_fi
