// fi_pingpong's 8-byte exchange, both ends in this one thread over one shm
// device, through the libfabric API and ufab's provider (libufab-fi.so,
// found through FI_PROVIDER_PATH; FI_UFAB_DEVICES=shm:DOMAIN). Each message
// is in the peer's ring when the peer's fi_cq_read runs, so no read comes
// back empty and the count does not depend on timing: tests/bench/fi_insn.sh
// runs it under callgrind with --toggle-collect=insn_measured (the N round
// trips after a warm-up) and divides by N. Per round trip, like
// fi_pingpong -e msg: each side posts a receive, sends with fi_inject, and
// reads its receive CQ until the message is there (no counters bound, the
// send CQ never read). Prints the fi_cq_read calls per round trip (2 when
// none came back empty) and checks every message's bytes.
//
//   fi_insn_bench [--n N] [--warmup N]
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const char* what, int rc) {
  std::fprintf(stderr, "fi_insn_bench: %s: %d (%s)\n", what, rc, fi_strerror(rc < 0 ? -rc : rc));
  std::exit(1);
}
#define CHECK(call)                \
  do {                             \
    int _rc = static_cast<int>(call); \
    if (_rc != 0) die(#call, _rc); \
  } while (0)

struct Side {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_eq* eq = nullptr;
  fid_cq* txcq = nullptr;
  fid_cq* rxcq = nullptr;
  fid_ep* ep = nullptr;
  fid_mr* mr = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(4096);
  void* desc() { return fi_mr_desc(mr); }
};

fi_info* getinfo(const char* domain) {
  fi_info* h = fi_allocinfo();
  h->ep_attr->type = FI_EP_MSG;
  h->caps = FI_MSG;
  h->mode = FI_CONTEXT | FI_MSG_PREFIX | FI_RX_CQ_DATA;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  h->fabric_attr->prov_name = strdup("ufab");
  h->domain_attr->name = strdup(domain);
  fi_info* info = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, h, &info);
  fi_freeinfo(h);
  if (rc != 0 || info == nullptr) die("fi_getinfo (is FI_PROVIDER_PATH the directory of libufab-fi.so?)", rc);
  return info;
}

void open_side(Side& s, const char* domain) {
  s.info = getinfo(domain);
  CHECK(fi_fabric(s.info->fabric_attr, &s.fabric, nullptr));
  fi_eq_attr ea{};
  ea.wait_obj = FI_WAIT_UNSPEC;
  CHECK(fi_eq_open(s.fabric, &ea, &s.eq, nullptr));
  CHECK(fi_domain(s.fabric, s.info, &s.domain, nullptr));
  CHECK(fi_mr_reg(s.domain, s.buf.data(), s.buf.size(), FI_SEND | FI_RECV, 0, 0, 0, &s.mr, nullptr));
}

void open_ep(Side& s, fi_info* info) {
  fi_cq_attr ca{};
  ca.format = FI_CQ_FORMAT_CONTEXT;
  ca.size = 256;
  CHECK(fi_cq_open(s.domain, &ca, &s.txcq, nullptr));
  CHECK(fi_cq_open(s.domain, &ca, &s.rxcq, nullptr));
  CHECK(fi_endpoint(s.domain, info, &s.ep, nullptr));
  CHECK(fi_ep_bind(s.ep, &s.eq->fid, 0));
  CHECK(fi_ep_bind(s.ep, &s.txcq->fid, FI_TRANSMIT | FI_SELECTIVE_COMPLETION));
  CHECK(fi_ep_bind(s.ep, &s.rxcq->fid, FI_RECV));
  CHECK(fi_enable(s.ep));
}

void expect_event(fid_eq* eq, uint32_t want, fi_info** info = nullptr) {
  uint32_t event = 0;
  alignas(fi_eq_cm_entry) uint8_t ebuf[sizeof(fi_eq_cm_entry) + 256];
  auto* entry = reinterpret_cast<fi_eq_cm_entry*>(ebuf);
  ssize_t rd = fi_eq_sread(eq, &event, entry, sizeof ebuf, 10000, 0);
  if (rd < 0) die("fi_eq_sread", static_cast<int>(rd));
  if (event != want) die("an unexpected EQ event", static_cast<int>(event));
  if (info != nullptr) *info = entry->info;
}

uint64_t g_reads = 0;

// Reads `cq` until one completion is there (bounded).
void one(fid_cq* cq) {
  fi_cq_entry e;
  for (long i = 0; i < 100000000L; i++) {
    ++g_reads;
    ssize_t r = fi_cq_read(cq, &e, 1);
    if (r == 1) return;
    if (r != -FI_EAGAIN) die("fi_cq_read", static_cast<int>(r));
  }
  die("fi_cq_read: no completion in 10^8 reads", 0);
}

void round_trip(Side& c, Side& s, uint64_t i) {
  uint64_t v = i * 0x9e3779b97f4a7c15ull;
  CHECK(fi_inject(c.ep, &v, sizeof v, FI_ADDR_UNSPEC));
  one(s.rxcq);
  uint64_t got;
  std::memcpy(&got, s.buf.data(), 8);
  if (got != v) die("the ping's bytes differ", 0);
  CHECK(fi_recv(s.ep, s.buf.data(), 64, s.desc(), FI_ADDR_UNSPEC, nullptr));
  CHECK(fi_inject(s.ep, &got, sizeof got, FI_ADDR_UNSPEC));
  one(c.rxcq);
  std::memcpy(&got, c.buf.data(), 8);
  if (got != v) die("the pong's bytes differ", 0);
  CHECK(fi_recv(c.ep, c.buf.data(), 64, c.desc(), FI_ADDR_UNSPEC, nullptr));
}

}  // namespace

// The measured part (callgrind --toggle-collect=insn_measured).
extern "C" __attribute__((noinline)) uint64_t insn_measured(Side* c, Side* s, uint64_t first, uint64_t n) {
  for (uint64_t i = first; i < first + n; i++) round_trip(*c, *s, i);
  return g_reads;
}

int main(int argc, char** argv) {
  uint64_t n = 10000, warmup = 1000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--n") == 0) {
      n = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (std::strcmp(argv[i], "--warmup") == 0) {
      warmup = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: fi_insn_bench [--n N] [--warmup N]\n");
      return 2;
    }
  }
  const char* devs = std::getenv("FI_UFAB_DEVICES");
  if (devs == nullptr || std::strncmp(devs, "shm:", 4) != 0) {
    std::fprintf(stderr, "fi_insn_bench: set FI_UFAB_DEVICES=shm:DOMAIN (and FI_PROVIDER_PATH)\n");
    return 2;
  }
  Side s, c;
  open_side(s, devs);
  open_side(c, devs);
  fid_pep* pep = nullptr;
  CHECK(fi_passive_ep(s.fabric, s.info, &pep, nullptr));
  CHECK(fi_pep_bind(pep, &s.eq->fid, 0));
  CHECK(fi_listen(pep));
  sockaddr_in addr{};
  size_t len = sizeof addr;
  CHECK(fi_getname(&pep->fid, &addr, &len));
  open_ep(c, c.info);
  CHECK(fi_recv(c.ep, c.buf.data(), 64, c.desc(), FI_ADDR_UNSPEC, nullptr));
  CHECK(fi_connect(c.ep, &addr, nullptr, 0));
  fi_info* req = nullptr;
  expect_event(s.eq, FI_CONNREQ, &req);
  open_ep(s, req);
  fi_freeinfo(req);
  CHECK(fi_recv(s.ep, s.buf.data(), 64, s.desc(), FI_ADDR_UNSPEC, nullptr));
  CHECK(fi_accept(s.ep, nullptr, 0));
  expect_event(c.eq, FI_CONNECTED);
  expect_event(s.eq, FI_CONNECTED);
  for (uint64_t i = 0; i < warmup; i++) round_trip(c, s, i);
  uint64_t before = g_reads;
  uint64_t after = insn_measured(&c, &s, warmup, n);
  std::printf("fi_insn_bench: %llu round trips, %.3f fi_cq_read calls per round trip\n",
              static_cast<unsigned long long>(n), static_cast<double>(after - before) / static_cast<double>(n));
  fi_shutdown(c.ep, 0);
  for (Side* x : {&c, &s}) {
    fi_close(&x->ep->fid);
    fi_close(&x->txcq->fid);
    fi_close(&x->rxcq->fid);
    fi_close(&x->mr->fid);
    fi_close(&x->domain->fid);
    fi_close(&x->eq->fid);
    fi_close(&x->fabric->fid);
    fi_freeinfo(x->info);
  }
  fi_close(&pep->fid);
  return 0;
}
