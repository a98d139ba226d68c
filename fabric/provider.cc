// The provider's entry point, its configuration (FI_UFAB_* environment
// variables), fi_getinfo, the fabric, the domain and memory registration.
#include "fabric/provider.h"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ufab_fi {

int neg(int err) { return err > 0 ? -err : err; }

std::string ip_text(uint32_t ip) {
  char b[INET_ADDRSTRLEN];
  in_addr a{htonl(ip)};
  inet_ntop(AF_INET, &a, b, sizeof b);
  return b;
}

std::string ud_name(uint32_t ip, uint32_t qpn) { return "fi_ufab_ud://" + ip_text(ip) + ":" + std::to_string(qpn); }

bool parse_ud_name(const char* s, size_t len, uint32_t* ip, uint32_t* qpn) {
  std::string t(s, strnlen(s, len));
  const std::string prefix = "fi_ufab_ud://";
  if (t.rfind(prefix, 0) != 0) return false;
  t = t.substr(prefix.size());
  auto colon = t.find(':');
  if (colon == std::string::npos) return false;
  in_addr a{};
  if (inet_pton(AF_INET, t.substr(0, colon).c_str(), &a) != 1) return false;
  char* end = nullptr;
  unsigned long q = strtoul(t.c_str() + colon + 1, &end, 10);
  if (end == t.c_str() + colon + 1 || *end != '\0' || q > 0xffffff) return false;
  *ip = ntohl(a.s_addr);
  *qpn = static_cast<uint32_t>(q);
  return true;
}

bool Dev::soft_roce() const { return std::strcmp(attr.provider, "soft-roce") == 0; }
bool Dev::has_msg() const { return soft_roce() || shm_device(this); }
bool Dev::has_hmem() const { return (attr.mem_types & (1u << UFAB_MEM_CUDA)) != 0; }
bool Dev::has_pmem() const {
  return soft_roce() && (attr.caps & UFAB_DEVICE_CAP_FLUSH_PERSISTENT) != 0 &&
         (attr.mem_types & (1u << UFAB_MEM_PERSISTENT)) != 0;
}

// ------------------------------------------------------------ configuration

namespace {

bool env_true(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && (std::strcmp(v, "1") == 0 || std::strcmp(v, "yes") == 0 || std::strcmp(v, "true") == 0);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    // trim spaces
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::mutex g_dev_mu;
DeviceList* g_devices = nullptr;

void warn(const std::string& what) {
  if (!env_true("FI_UFAB_QUIET")) std::fprintf(stderr, "libufab-fi: %s\n", what.c_str());
}

DeviceList* load_devices() {
  auto* list = new DeviceList;
  const char* spec = std::getenv("FI_UFAB_DEVICES");
  if (spec == nullptr || *spec == '\0') return list;
  std::vector<std::string> params_s;
  if (const char* p = std::getenv("FI_UFAB_PARAMS")) params_s = split(p, ',');
  std::vector<const char*> params;
  for (auto& p : params_s) params.push_back(p.c_str());
  params.push_back(nullptr);
  for (const std::string& item : split(spec, ',')) {
    auto at = item.rfind('@');
    std::string name = item.substr(0, at);
    std::string ip = at == std::string::npos ? "" : item.substr(at + 1);
    auto* d = new Dev;
    d->name = name;
    d->ip_text = ip;
    in_addr a{};
    if (!ip.empty()) {
      if (inet_pton(AF_INET, ip.c_str(), &a) != 1) {
        warn("FI_UFAB_DEVICES: \"" + item + "\": \"" + ip + "\" is not an IPv4 address (NAME@A.B.C.D); device skipped");
        delete d;
        continue;
      }
      d->ip = ntohl(a.s_addr);
    }
    ufab_device_opts opts{};
    opts.size = sizeof opts;
    opts.ip = ip.empty() ? nullptr : d->ip_text.c_str();
    opts.params = params.size() > 1 ? params.data() : nullptr;
    opts.progress_thread = progress_thread_on() ? 1 : 0;
    int rc = ufab_device_open(name.c_str(), &opts, &d->dev);
    if (rc != 0) {
      warn("opening " + name + " (FI_UFAB_DEVICES): " + ufab_last_error() + "; device skipped");
      delete d;
      continue;
    }
    if (ufab_device_query(d->dev, &d->attr) != 0 || ufab_pd_alloc(d->dev, &d->pd) != 0) {
      warn("querying " + name + ": " + ufab_last_error() + "; device skipped");
      ufab_device_close(d->dev);
      delete d;
      continue;
    }
    if (d->ip == 0) d->ip = d->attr.ip;
    list->devs.push_back(d);
  }
  return list;
}

void cm_thread_main(Dev* d);

}  // namespace

bool progress_thread_on() { return env_true("FI_UFAB_PROGRESS_THREAD"); }

const DeviceList& devices() {
  std::lock_guard<std::mutex> lk(g_dev_mu);
  if (g_devices == nullptr) g_devices = load_devices();
  return *g_devices;
}

Dev* device_by_name(const char* name) {
  for (Dev* d : devices().devs)
    if (d->name == name) return d;
  return nullptr;
}

Dev* device_by_ip(uint32_t ip) {
  for (Dev* d : devices().devs)
    if (d->ip == ip) return d;
  return nullptr;
}

void cm_dispatch(Dev* d);  // cm.cc

namespace {
void cm_thread_main(Dev* d) {
  while (!d->stop.load()) cm_dispatch(d);
}
}  // namespace

int ensure_cm(Dev* d) {
  std::lock_guard<std::mutex> lk(g_dev_mu);
  if (d->cm != nullptr) return 0;
  if (!d->soft_roce()) return -FI_EOPNOTSUPP;
  ufab_cm_opts o{};
  o.size = sizeof o;
  int rc = ufab_cm_open(d->dev, &o, &d->cm);
  if (rc != 0) {
    warn("opening the connection manager of " + d->name + ": " + ufab_last_error());
    return neg(-rc);
  }
  d->cm_thread = std::thread(cm_thread_main, d);
  return 0;
}

void shutdown_devices() {
  shm_shutdown_all();
  std::lock_guard<std::mutex> lk(g_dev_mu);
  if (g_devices == nullptr) return;
  const bool stats = env_true("FI_UFAB_STATS");
  for (Dev* d : g_devices->devs) {
    ufab_device_stats st{};
    if (stats && ufab_device_query_stats(d->dev, &st) == 0) {
      // One line per device, for tests that must see the traffic on the
      // device (not through some other path).
      std::fprintf(stderr,
                   "libufab-fi: stats %s: tx_frames %llu rx_frames %llu rx_roce %llu tx_data_packets %llu "
                   "rx_data_packets %llu retransmits %llu\n",
                   d->name.c_str(), static_cast<unsigned long long>(st.tx_frames),
                   static_cast<unsigned long long>(st.rx_frames), static_cast<unsigned long long>(st.rx_roce),
                   static_cast<unsigned long long>(st.tx_data_packets),
                   static_cast<unsigned long long>(st.rx_data_packets),
                   static_cast<unsigned long long>(st.retransmits));
    }
    if (d->cm != nullptr) {
      d->stop = true;
      if (d->cm_thread.joinable()) d->cm_thread.join();
      ufab_cm_close(d->cm);
    }
    if (d->pd != nullptr) ufab_pd_free(d->pd);
    ufab_device_close(d->dev);
    delete d;
  }
  delete g_devices;
  g_devices = nullptr;
}

// ----------------------------------------------------------------- getinfo

namespace {

constexpr uint64_t kMrMode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;

uint64_t msg_caps(Dev* d) {
  uint64_t c = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE |
               FI_REMOTE_COMM;
  if (d->has_atomics()) c |= FI_ATOMIC;
  if (d->has_hmem()) c |= FI_HMEM;       // CUDA memory through staging (soft-RoCE and shm)
  if (d->has_pmem()) c |= FI_RMA_PMEM;   // FI_COMMIT_COMPLETE writes into persistent memory
  return c;
}
uint64_t dgram_caps() { return FI_MSG | FI_SEND | FI_RECV | FI_REMOTE_COMM; }

sockaddr_in sin_of(uint32_t ip, uint16_t port) {
  sockaddr_in s{};
  s.sin_family = AF_INET;
  s.sin_addr.s_addr = htonl(ip);
  s.sin_port = htons(port);
  return s;
}

void* dup_bytes(const void* p, size_t n) {
  void* q = std::calloc(1, n);
  if (q != nullptr && p != nullptr) std::memcpy(q, p, n);
  return q;
}

bool mr_mode_ok(const fi_info* hints) {
  if (hints == nullptr || hints->domain_attr == nullptr) return true;
  int m = hints->domain_attr->mr_mode;
  if (m == FI_MR_BASIC) return (hints->mode & FI_LOCAL_MR) != 0;  // old style
  if (m == FI_MR_SCALABLE || m == FI_MR_UNSPEC) return false;
  return (static_cast<uint64_t>(m) & kMrMode) == kMrMode;
}

// The address a hint or node/service names, as (ip, port); false on a
// format we cannot take.
bool parse_sin(const void* addr, size_t len, uint32_t* ip, uint16_t* port) {
  if (addr == nullptr || len < sizeof(sockaddr_in)) return false;
  auto* s = static_cast<const sockaddr_in*>(addr);
  if (s->sin_family != AF_INET) return false;
  *ip = ntohl(s->sin_addr.s_addr);
  *port = ntohs(s->sin_port);
  return true;
}

}  // namespace

fi_info* make_info(Dev* d, fi_ep_type type, const fi_info* hints) {
  fi_info* fi = fi_allocinfo();
  if (fi == nullptr) return nullptr;
  const ufab_device_attr& a = d->attr;
  uint32_t sge = a.max_sge < UFAB_MAX_SGE ? a.max_sge : UFAB_MAX_SGE;
  fi->caps = type == FI_EP_MSG ? msg_caps(d) : dgram_caps();
  fi->mode = 0;
  fi->addr_format = type == FI_EP_MSG ? FI_SOCKADDR_IN : FI_ADDR_STR;
  fi->ep_attr->type = type;
  fi->ep_attr->protocol = FI_PROTO_UNSPEC;
  fi->ep_attr->protocol_version = 1;
  fi->ep_attr->max_msg_size = type == FI_EP_MSG ? (1ull << 31) : a.active_mtu;
  fi->ep_attr->msg_prefix_size = type == FI_EP_DGRAM ? kUdPrefix : 0;
  fi->ep_attr->max_order_raw_size = type == FI_EP_MSG ? (1ull << 31) : 0;  // a READ sees earlier WRITEs (RC order)
  fi->ep_attr->max_order_war_size = 0;
  fi->ep_attr->max_order_waw_size = type == FI_EP_MSG ? (1ull << 31) : 0;
  fi->ep_attr->tx_ctx_cnt = 1;
  fi->ep_attr->rx_ctx_cnt = 1;
  fi->ep_attr->auth_key_size = 0;

  fi->tx_attr->caps = fi->caps & ~(FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE);
  fi->tx_attr->mode = 0;
  fi->tx_attr->op_flags = 0;
  fi->tx_attr->msg_order = FI_ORDER_SAS | (type == FI_EP_MSG ? (FI_ORDER_RAW | FI_ORDER_WAW | FI_ORDER_WAS | FI_ORDER_SAW) : 0);
  fi->tx_attr->comp_order = FI_ORDER_STRICT;
  fi->tx_attr->inject_size = a.max_inline_data;
  if (type == FI_EP_DGRAM && fi->tx_attr->inject_size > a.active_mtu) fi->tx_attr->inject_size = a.active_mtu;
  fi->tx_attr->size = a.max_qp_wr;
  fi->tx_attr->iov_limit = sge;
  fi->tx_attr->rma_iov_limit = type == FI_EP_MSG ? 1 : 0;

  fi->rx_attr->caps = fi->caps & ~(FI_SEND | FI_READ | FI_WRITE);
  fi->rx_attr->mode = 0;
  fi->rx_attr->op_flags = 0;
  fi->rx_attr->msg_order = fi->tx_attr->msg_order;
  fi->rx_attr->comp_order = FI_ORDER_STRICT;
  fi->rx_attr->total_buffered_recv = 0;
  fi->rx_attr->size = a.max_qp_wr;
  fi->rx_attr->iov_limit = sge;

  if (type == FI_EP_DGRAM) {
    fi->mode |= FI_MSG_PREFIX;
    fi->rx_attr->mode |= FI_MSG_PREFIX;
  } else if (hints == nullptr || (hints->mode & FI_RX_CQ_DATA) != 0) {
    // Remote CQ data of an RMA write (immediate data) takes a posted receive.
    fi->mode |= FI_RX_CQ_DATA;
    fi->rx_attr->mode |= FI_RX_CQ_DATA;
  }

  fi->domain_attr->name = strdup(d->name.c_str());
  fi->domain_attr->threading = FI_THREAD_SAFE;
  fi->domain_attr->control_progress = FI_PROGRESS_AUTO;  // the CM's thread
  fi->domain_attr->data_progress = progress_thread_on() ? FI_PROGRESS_AUTO : FI_PROGRESS_MANUAL;
  fi->domain_attr->resource_mgmt = FI_RM_DISABLED;
  fi->domain_attr->av_type = type == FI_EP_DGRAM ? FI_AV_TABLE : FI_AV_UNSPEC;
  fi->domain_attr->mr_mode = static_cast<int>(kMrMode);
  fi->domain_attr->mr_key_size = 4;
  fi->domain_attr->cq_data_size = 4;
  // ufab has no fixed bound on CQs, counters or regions (memory is the
  // bound); these say how many an application may count on, as QPs do.
  fi->domain_attr->cq_cnt = a.max_qp;
  fi->domain_attr->ep_cnt = a.max_qp;
  fi->domain_attr->tx_ctx_cnt = a.max_qp;
  fi->domain_attr->rx_ctx_cnt = a.max_qp;
  fi->domain_attr->max_ep_tx_ctx = 1;
  fi->domain_attr->max_ep_rx_ctx = 1;
  fi->domain_attr->max_ep_stx_ctx = 0;
  fi->domain_attr->max_ep_srx_ctx = 0;
  fi->domain_attr->cntr_cnt = a.max_qp;
  fi->domain_attr->mr_iov_limit = 1;
  fi->domain_attr->caps = FI_REMOTE_COMM;
  fi->domain_attr->mode = 0;
  fi->domain_attr->max_err_data = 256;
  fi->domain_attr->mr_cnt = 65536;

  fi->fabric_attr->name = strdup(kFabricName);
  // prov_name stays NULL: libfabric sets it (and layers utility providers' names on it).
  fi->fabric_attr->prov_version = kProviderVersion;
  fi->fabric_attr->api_version = kApiVersion;

  if (type == FI_EP_MSG) {
    sockaddr_in s = sin_of(d->ip, 0);
    fi->src_addr = dup_bytes(&s, sizeof s);
    fi->src_addrlen = sizeof s;
  } else {
    std::string n = ud_name(d->ip, 0);
    fi->src_addr = dup_bytes(n.c_str(), n.size() + 1);
    fi->src_addrlen = n.size() + 1;
  }
  return fi;
}

namespace {

// Whether `fi` (for device d) meets the hints; narrows fi to what they ask.
bool fits(fi_info* fi, const fi_info* h) {
  if (h == nullptr) return true;
  if (h->ep_attr != nullptr && h->ep_attr->type != FI_EP_UNSPEC && h->ep_attr->type != fi->ep_attr->type) return false;
  if ((h->caps & ~fi->caps) != 0) return false;
  if (h->addr_format != FI_FORMAT_UNSPEC && h->addr_format != fi->addr_format) return false;
  // Modes we need that the application does not support.
  uint64_t need = fi->mode & (FI_MSG_PREFIX);
  if ((h->mode & need) != need) return false;
  if (!mr_mode_ok(h)) return false;
  if (h->fabric_attr != nullptr && h->fabric_attr->name != nullptr && std::strcmp(h->fabric_attr->name, kFabricName) != 0)
    return false;
  if (h->fabric_attr != nullptr && h->fabric_attr->api_version != 0 && h->fabric_attr->api_version > kApiVersion)
    return false;
  if (h->domain_attr != nullptr) {
    const fi_domain_attr* hd = h->domain_attr;
    if (hd->name != nullptr && std::strcmp(hd->name, fi->domain_attr->name) != 0) return false;
    if (hd->cq_data_size > fi->domain_attr->cq_data_size) return false;
    if (hd->data_progress == FI_PROGRESS_AUTO && fi->domain_attr->data_progress != FI_PROGRESS_AUTO) return false;
    if ((hd->caps & ~fi->domain_attr->caps & (FI_LOCAL_COMM | FI_REMOTE_COMM)) != 0) return false;
    if (hd->av_type != FI_AV_UNSPEC && fi->ep_attr->type == FI_EP_DGRAM) fi->domain_attr->av_type = hd->av_type;
    if (hd->threading != FI_THREAD_UNSPEC) fi->domain_attr->threading = hd->threading;
    if (hd->mr_mode == FI_MR_BASIC) fi->domain_attr->mr_mode = FI_MR_BASIC;
  }
  if (h->ep_attr != nullptr) {
    if (h->ep_attr->max_msg_size > fi->ep_attr->max_msg_size) return false;
    if (h->ep_attr->rx_ctx_cnt == FI_SHARED_CONTEXT || h->ep_attr->tx_ctx_cnt == FI_SHARED_CONTEXT) return false;
    if (h->ep_attr->protocol != FI_PROTO_UNSPEC) return false;
  }
  if (h->tx_attr != nullptr) {
    if (h->tx_attr->size > fi->tx_attr->size || h->tx_attr->iov_limit > fi->tx_attr->iov_limit ||
        h->tx_attr->inject_size > fi->tx_attr->inject_size)
      return false;
    if (h->tx_attr->size != 0) fi->tx_attr->size = h->tx_attr->size;
    // FI_COMMIT_COMPLETE as a default flag: only where a WRITE can be
    // made durable (FLUSH PERSISTENT), else the hints do not fit.
    uint64_t commit = fi->ep_attr->type == FI_EP_MSG && (fi->caps & FI_RMA_PMEM) != 0 ? FI_COMMIT_COMPLETE : 0;
    if ((h->tx_attr->op_flags & FI_COMMIT_COMPLETE) != 0 && commit == 0) return false;
    fi->tx_attr->op_flags = h->tx_attr->op_flags & (FI_COMPLETION | FI_INJECT_COMPLETE | FI_TRANSMIT_COMPLETE |
                                                     FI_DELIVERY_COMPLETE | commit);
  }
  if (h->rx_attr != nullptr) {
    if (h->rx_attr->size > fi->rx_attr->size || h->rx_attr->iov_limit > fi->rx_attr->iov_limit) return false;
    if (h->rx_attr->size != 0) fi->rx_attr->size = h->rx_attr->size;
    if ((h->rx_attr->op_flags & FI_MULTI_RECV) != 0) return false;
    fi->rx_attr->op_flags = h->rx_attr->op_flags & FI_COMPLETION;
  }
  // Narrow the capabilities to those asked for (secondary ones stay).
  if (h->caps != 0) {
    uint64_t primary = FI_MSG | FI_RMA | FI_ATOMIC | FI_TAGGED;
    uint64_t want = h->caps;
    uint64_t keep = fi->caps;
    if ((want & primary) != 0) {
      keep = (fi->caps & ~primary) | (want & primary);
      // Direction bits: none asked means all of the kept ones.
      uint64_t dirs = FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
      if ((want & dirs) != 0) keep = (keep & ~dirs) | (want & dirs);
    }
    // FI_HMEM is primary too: offered only to applications that ask for
    // it. FI_RMA_PMEM goes with FI_RMA.
    if ((want & FI_HMEM) == 0) keep &= ~FI_HMEM;
    if ((keep & FI_RMA) == 0) keep &= ~FI_RMA_PMEM;
    fi->caps = keep;
    fi->tx_attr->caps &= keep;
    fi->rx_attr->caps &= keep;
  }
  return true;
}

}  // namespace

int getinfo(uint32_t version, const char* node, const char* service, uint64_t flags, const fi_info* hints,
            fi_info** info) {
  *info = nullptr;
  if (FI_MAJOR(version) != 1) return -FI_ENODATA;
  // Source and destination from node/service or the hints.
  bool have_src = false, have_dest = false;
  uint32_t src_ip = 0, dest_ip = 0;
  uint16_t src_port = 0, dest_port = 0;
  if (node != nullptr || service != nullptr) {
    uint32_t ip = 0;
    if (node != nullptr) {
      in_addr a{};
      if (inet_pton(AF_INET, node, &a) != 1) return -FI_ENODATA;  // names: only dotted quads
      ip = ntohl(a.s_addr);
    }
    uint16_t port = service != nullptr ? static_cast<uint16_t>(std::atoi(service)) : 0;
    if ((flags & FI_SOURCE) != 0) {
      have_src = node != nullptr;
      src_ip = ip;
      src_port = port;
    } else if (node != nullptr) {
      have_dest = true;
      dest_ip = ip;
      dest_port = port;
    } else {
      src_port = port;
    }
  }
  const void* hint_dest = nullptr;
  size_t hint_dest_len = 0;
  if (hints != nullptr && hints->src_addr != nullptr) {
    uint32_t ip = 0, qpn = 0;
    uint16_t port = 0;
    if (parse_sin(hints->src_addr, hints->src_addrlen, &ip, &port)) {
      have_src = ip != 0;
      src_ip = ip;
      src_port = port;
    } else if (parse_ud_name(static_cast<const char*>(hints->src_addr), hints->src_addrlen, &ip, &qpn)) {
      have_src = true;
      src_ip = ip;
    } else {
      return -FI_ENODATA;
    }
  }
  if (hints != nullptr && hints->dest_addr != nullptr) {
    hint_dest = hints->dest_addr;
    hint_dest_len = hints->dest_addrlen;
  }

  fi_info* head = nullptr;
  fi_info** tail = &head;
  for (Dev* d : devices().devs) {
    if (have_src && src_ip != d->ip) continue;
    for (fi_ep_type type : {FI_EP_MSG, FI_EP_DGRAM}) {
      if (type == FI_EP_MSG && !d->has_msg()) continue;  // no way to connect
      if (type == FI_EP_DGRAM && !d->has_ud()) continue;
      fi_info* fi = make_info(d, type, hints);
      if (fi == nullptr) break;
      bool ok = fits(fi, hints);
      // Addresses: the hint's destination must be of this type's format.
      if (ok && hint_dest != nullptr) {
        uint32_t ip = 0, qpn = 0;
        uint16_t port = 0;
        if (type == FI_EP_MSG)
          ok = parse_sin(hint_dest, hint_dest_len, &ip, &port);
        else
          ok = parse_ud_name(static_cast<const char*>(hint_dest), hint_dest_len, &ip, &qpn);
        if (ok) {
          fi->dest_addr = dup_bytes(hint_dest, hint_dest_len);
          fi->dest_addrlen = hint_dest_len;
        }
      }
      if (ok && have_dest) {
        if (type == FI_EP_MSG) {
          sockaddr_in s = sin_of(dest_ip, dest_port);
          std::free(fi->dest_addr);
          fi->dest_addr = dup_bytes(&s, sizeof s);
          fi->dest_addrlen = sizeof s;
        } else {
          ok = false;  // a DGRAM peer is named by its address string (fi_getname), not node/service
        }
      }
      if (ok && type == FI_EP_MSG && src_port != 0) {
        sockaddr_in s = sin_of(d->ip, src_port);
        std::memcpy(fi->src_addr, &s, sizeof s);
      }
      if (!ok) {
        fi_freeinfo(fi);
        continue;
      }
      *tail = fi;
      tail = &fi->next;
    }
  }
  *info = head;
  return head != nullptr ? 0 : -FI_ENODATA;
}

// ------------------------------------------------------------------ fabric

namespace {

int fabric_close(fid* f) {
  delete reinterpret_cast<Fabric*>(f);
  return 0;
}
int no_bind(fid*, fid*, uint64_t) { return -FI_ENOSYS; }
int no_control(fid*, int, void*) { return -FI_ENOSYS; }
int no_ops_open(fid*, const char*, uint64_t, void**, void*) { return -FI_ENOSYS; }

fi_ops g_fabric_fi_ops = {sizeof(fi_ops), fabric_close, no_bind, no_control, no_ops_open, nullptr, nullptr};

int wait_open(fid_fabric*, fi_wait_attr*, fid_wait**) { return -FI_ENOSYS; }
int trywait(fid_fabric*, fid**, int count) {
  // Our CQs' fds are armed in FI_GETWAIT users' trywait; report "go wait"
  // only when no CQ has entries queued (checked by the callers' reads).
  (void)count;
  return 0;
}
int domain2(fid_fabric* f, fi_info* info, fid_domain** dom, uint64_t, void* ctx) {
  return domain_open(f, info, dom, ctx);
}

fi_ops_fabric g_fabric_ops = {sizeof(fi_ops_fabric), domain_open, pep_open, eq_open, wait_open, trywait, domain2};

}  // namespace

int fabric_open(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  if (attr != nullptr && attr->name != nullptr && std::strcmp(attr->name, kFabricName) != 0) return -FI_ENODATA;
  auto* f = new Fabric;
  f->fab.fid.fclass = FI_CLASS_FABRIC;
  f->fab.fid.context = context;
  f->fab.fid.ops = &g_fabric_fi_ops;
  f->fab.ops = &g_fabric_ops;
  f->fab.api_version = kApiVersion;
  *fabric = &f->fab;
  return 0;
}

// ------------------------------------------------------------------ domain

Op* Domain::get_op() {
  if (free_ops.empty()) return new Op;
  Op* o = free_ops.back();
  free_ops.pop_back();
  *o = Op{};
  return o;
}
void Domain::put_op(Op* o) {
  if (!o->quiet) free_ops.push_back(o);
}

void Domain::progress_all(UCq* except) {
  std::lock_guard<std::mutex> lk(mu);
  for (UCq* u : ucqs)
    if (u != except) poll_ucq_locked(this, u);
}

namespace {

int domain_close(fid* f) {
  auto* d = reinterpret_cast<Domain*>(f);
  if (d->refs.load() != 0) return -FI_EBUSY;
  for (Op* o : d->free_ops) delete o;
  fi_freeinfo(d->info);
  delete d;
  return 0;
}

int domain_bind(fid*, fid*, uint64_t) { return -FI_ENOSYS; }

fi_ops g_domain_fi_ops = {sizeof(fi_ops), domain_close, domain_bind, no_control, no_ops_open, nullptr, nullptr};

int scalable_ep(fid_domain*, fi_info*, fid_ep**, void*) { return -FI_ENOSYS; }
int poll_open(fid_domain*, fi_poll_attr*, fid_poll**) { return -FI_ENOSYS; }
int stx_ctx(fid_domain*, fi_tx_attr*, fid_stx**, void*) { return -FI_ENOSYS; }
int srx_ctx(fid_domain*, fi_rx_attr*, fid_ep**, void*) { return -FI_ENOSYS; }
int query_atomic(fid_domain* domain, fi_datatype dt, fi_op op, fi_atomic_attr* attr, uint64_t flags) {
  auto* d = reinterpret_cast<Domain*>(domain);
  if (!d->dev->has_atomics()) return -FI_EOPNOTSUPP;
  if ((flags & FI_TAGGED) != 0) return -FI_EOPNOTSUPP;
  if (dt != FI_UINT64 && dt != FI_INT64) return -FI_EOPNOTSUPP;
  bool fetch = (flags & FI_FETCH_ATOMIC) != 0, cmp = (flags & FI_COMPARE_ATOMIC) != 0;
  if (cmp ? op != FI_CSWAP : !(fetch && (op == FI_SUM || op == FI_ATOMIC_READ))) return -FI_EOPNOTSUPP;
  attr->count = 1;
  attr->size = 8;
  return 0;
}
int query_collective(fid_domain*, fi_collective_op, fi_collective_attr*, uint64_t) { return -FI_ENOSYS; }
int endpoint2(fid_domain* d, fi_info* info, fid_ep** ep, uint64_t, void* ctx) { return ep_open(d, info, ep, ctx); }

fi_ops_domain g_domain_ops = {sizeof(fi_ops_domain), av_open,   cq_open,      ep_open,
                              scalable_ep,           cntr_open, poll_open,    stx_ctx,
                              srx_ctx,               query_atomic, query_collective, endpoint2};

fi_ops_mr g_mr_ops = {sizeof(fi_ops_mr), mr_reg, mr_regv, mr_regattr};

}  // namespace

int domain_open(fid_fabric* fabric, fi_info* info, fid_domain** dom, void* context) {
  if (info == nullptr || info->domain_attr == nullptr || info->domain_attr->name == nullptr) return -FI_EINVAL;
  Dev* dev = device_by_name(info->domain_attr->name);
  if (dev == nullptr) return -FI_ENODEV;
  auto* d = new Domain;
  const uint64_t quiet_flags[4] = {FI_MSG | FI_SEND, FI_RMA | FI_WRITE, FI_RMA | FI_READ, FI_ATOMIC | FI_READ};
  for (int k = 0; k < 4; k++) {
    d->quiet[k].flags = quiet_flags[k];
    d->quiet[k].quiet = true;
  }
  d->dom.fid.fclass = FI_CLASS_DOMAIN;
  d->dom.fid.context = context;
  d->dom.fid.ops = &g_domain_fi_ops;
  d->dom.ops = &g_domain_ops;
  d->dom.mr = &g_mr_ops;
  d->fabric = reinterpret_cast<Fabric*>(fabric);
  d->dev = dev;
  d->info = fi_dupinfo(info);
  *dom = &d->dom;
  return 0;
}

// ---------------------------------------------------------------------- MR

bool Domain::touches_cuda(const void* addr, uint64_t len) {
  if (cuda_mrs.load(std::memory_order_relaxed) == 0) return false;
  auto a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lk(mr_mu);
  for (const CudaRange& r : cuda_ranges)
    if (a < r.addr + r.len && r.addr < a + len) return true;
  return false;
}

namespace {

int mr_close(fid* f) {
  auto* m = reinterpret_cast<Mr*>(f);
  int rc = ufab_mr_dereg(m->umr);
  if (rc != 0) return neg(-rc) == -EBUSY ? -FI_EBUSY : -FI_EINVAL;
  if (m->cuda) {
    std::lock_guard<std::mutex> lk(m->dom->mr_mu);
    auto& v = m->dom->cuda_ranges;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it->addr == m->addr && it->len == m->len) {
        v.erase(it);
        break;
      }
    }
    m->dom->cuda_mrs--;
  }
  m->dom->refs--;
  delete m;
  return 0;
}
int mr_bind(fid*, fid*, uint64_t) { return -FI_ENOSYS; }
int mr_control(fid*, int, void*) { return -FI_ENOSYS; }

fi_ops g_mr_fi_ops = {sizeof(fi_ops), mr_close, mr_bind, mr_control, no_ops_open, nullptr, nullptr};

const char* iface_name(fi_hmem_iface iface) {
  switch (iface) {
    case FI_HMEM_SYSTEM: return "FI_HMEM_SYSTEM";
    case FI_HMEM_CUDA: return "FI_HMEM_CUDA";
    case FI_HMEM_ROCR: return "FI_HMEM_ROCR";
    case FI_HMEM_ZE: return "FI_HMEM_ZE";
    case FI_HMEM_NEURON: return "FI_HMEM_NEURON";
    case FI_HMEM_SYNAPSEAI: return "FI_HMEM_SYNAPSEAI";
  }
  return "an unknown iface";
}

// One registration: host memory (FI_HMEM_SYSTEM), CUDA device memory
// (FI_HMEM_CUDA: ufab's UFAB_MEM_CUDA, moved through the staging
// pipeline), or persistent memory (FI_RMA_PMEM: UFAB_MEM_PERSISTENT, a
// FLUSH PERSISTENT target for FI_COMMIT_COMPLETE writes).
int register_region(fid* fid, const void* buf, size_t len, uint64_t access, uint64_t offset, uint64_t flags,
                    fi_hmem_iface iface, fid_mr** mr, void* context) {
  if (fid->fclass != FI_CLASS_DOMAIN) return -FI_EINVAL;
  // Offsets belong to FI_MR_SCALABLE. Flags: FI_RMA_PMEM is ours;
  // FI_HMEM_DEVICE_ONLY / FI_HMEM_HOST_ALLOC say nothing ufab does not
  // learn itself; utility providers pass their own (FI_PROV_SPECIFIC
  // range), which are theirs to mean.
  if (offset != 0) return -FI_EINVAL;
  auto* d = reinterpret_cast<Domain*>(fid);
  const bool pmem = (flags & FI_RMA_PMEM) != 0;
  const bool cuda = iface == FI_HMEM_CUDA;
  if (iface != FI_HMEM_SYSTEM && iface != FI_HMEM_CUDA) {
    warn(std::string("fi_mr_regattr on ") + d->dev->name + ": " + iface_name(iface) +
         " memory is not supported; ufab moves host memory (FI_HMEM_SYSTEM) and CUDA device memory "
         "(FI_HMEM_CUDA) only");
    return -FI_EOPNOTSUPP;
  }
  if (cuda && !d->dev->has_hmem()) {
    warn("fi_mr_regattr on " + d->dev->name +
         ": FI_HMEM_CUDA memory is not supported on this domain (this ufab was built without CUDA's headers; "
         "rebuild with the CUDA Toolkit installed, or copy into host memory)");
    return -FI_EOPNOTSUPP;
  }
  if (cuda && pmem) {
    warn("fi_mr_regattr on " + d->dev->name +
         ": FI_HMEM_CUDA with FI_RMA_PMEM: GPU memory is never a durable (FLUSH PERSISTENT) target");
    return -FI_EOPNOTSUPP;
  }
  if (pmem && !d->dev->has_pmem()) {
    warn("fi_mr_reg on " + d->dev->name + ": FI_RMA_PMEM is not supported on this domain (no FLUSH PERSISTENT; "
         "it does not advertise FI_RMA_PMEM)");
    return -FI_EOPNOTSUPP;
  }
  // Local write always (receives, READ results); remote rights as asked.
  uint32_t acc = UFAB_ACCESS_LOCAL_WRITE;
  if ((access & FI_REMOTE_WRITE) != 0) acc |= UFAB_ACCESS_REMOTE_WRITE;
  if ((access & FI_REMOTE_READ) != 0) acc |= UFAB_ACCESS_REMOTE_READ;
  // Atomics on GPU memory are not supported (ufab refuses the right).
  if ((access & FI_REMOTE_WRITE) != 0 && d->dev->has_atomics() && !cuda) acc |= UFAB_ACCESS_REMOTE_ATOMIC;
  // A durable target: a peer's FLUSH (what FI_COMMIT_COMPLETE sends after
  // the WRITE) may make it visible and durable.
  if (pmem && (access & (FI_REMOTE_WRITE | FI_REMOTE_READ)) != 0)
    acc |= UFAB_ACCESS_FLUSH_GLOBAL | UFAB_ACCESS_FLUSH_PERSISTENT;
  auto* m = new Mr;
  m->dom = d;
  // A zero-length registration is legal in libfabric; ufab wants bytes.
  static char zero_byte;
  ufab_mr_attr ua{};
  ua.size = sizeof ua;
  ua.access = acc;
  ua.addr = len == 0 ? static_cast<void*>(&zero_byte) : const_cast<void*>(buf);
  ua.length = len == 0 ? 1 : len;
  ua.mem_type = len != 0 && cuda ? UFAB_MEM_CUDA : pmem && len != 0 ? UFAB_MEM_PERSISTENT : UFAB_MEM_HOST;
  int rc = ufab_mr_reg_attr(d->dev->pd, &ua, &m->umr);
  bool found_cuda = false;
  if (rc == -EOPNOTSUPP && !cuda && !pmem && (acc & UFAB_ACCESS_REMOTE_ATOMIC) != 0) {
    // CUDA device memory given as host memory: ufab recognises it by its
    // pointer attributes and refuses only the atomic right (no atomics on
    // GPU memory). Registered without it, as FI_HMEM_CUDA would have been.
    ua.access &= ~uint32_t{UFAB_ACCESS_REMOTE_ATOMIC};
    rc = ufab_mr_reg_attr(d->dev->pd, &ua, &m->umr);
    found_cuda = rc == 0;
  }
  if (rc != 0) {
    warn(std::string(cuda ? "fi_mr_regattr (FI_HMEM_CUDA)" : pmem ? "fi_mr_reg (FI_RMA_PMEM)" : "fi_mr_reg") +
         " on " + d->dev->name + ": " + ufab_last_error());
    delete m;
    return neg(-rc);
  }
  m->mr.fid.fclass = FI_CLASS_MR;
  m->mr.fid.context = context;
  m->mr.fid.ops = &g_mr_fi_ops;
  m->lkey = ufab_mr_lkey(m->umr);
  m->mr.mem_desc = m;
  m->mr.key = ufab_mr_rkey(m->umr);
  if ((cuda || found_cuda) && len != 0) {
    m->cuda = true;
    m->addr = reinterpret_cast<uintptr_t>(buf);
    m->len = len;
    std::lock_guard<std::mutex> lk(d->mr_mu);
    d->cuda_ranges.push_back(CudaRange{m->addr, m->len});
    d->cuda_mrs++;
  }
  d->refs++;
  *mr = &m->mr;
  return 0;
}

}  // namespace

int mr_reg(fid* fid, const void* buf, size_t len, uint64_t access, uint64_t offset, uint64_t requested_key,
           uint64_t flags, fid_mr** mr, void* context) {
  (void)requested_key;  // FI_MR_PROV_KEY: the provider picks keys
  // Host memory; in a process that uses CUDA, ufab recognises device
  // memory given here by its pointer attributes and registers it as CUDA.
  return register_region(fid, buf, len, access, offset, flags, FI_HMEM_SYSTEM, mr, context);
}

int mr_regv(fid* fid, const iovec* iov, size_t count, uint64_t access, uint64_t offset, uint64_t requested_key,
            uint64_t flags, fid_mr** mr, void* context) {
  if (count != 1) return -FI_EINVAL;  // mr_iov_limit 1
  return mr_reg(fid, iov[0].iov_base, iov[0].iov_len, access, offset, requested_key, flags, mr, context);
}

int mr_regattr(fid* fid, const fi_mr_attr* attr, uint64_t flags, fid_mr** mr) {
  if (attr == nullptr || attr->iov_count != 1) return -FI_EINVAL;
  // attr->device.cuda (the GPU's ordinal) is not needed: ufab learns the
  // GPU from the pointer (one GPU per ufab device).
  return register_region(fid, attr->mr_iov[0].iov_base, attr->mr_iov[0].iov_len, attr->access, attr->offset, flags,
                         attr->iface, mr, attr->context);
}

}  // namespace ufab_fi

// ------------------------------------------------------------- entry point

namespace {

int prov_getinfo(uint32_t version, const char* node, const char* service, uint64_t flags, const fi_info* hints,
                 fi_info** info) {
  return ufab_fi::getinfo(version, node, service, flags, hints, info);
}
int prov_fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context) {
  return ufab_fi::fabric_open(attr, fabric, context);
}
void prov_cleanup() { ufab_fi::shutdown_devices(); }

fi_provider g_provider = {
    ufab_fi::kProviderVersion, ufab_fi::kApiVersion, {}, ufab_fi::kProviderName, prov_getinfo, prov_fabric,
    prov_cleanup,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) fi_provider* fi_prov_ini(void) { return &g_provider; }
