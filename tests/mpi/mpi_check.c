/* An MPI program that checks what it moves (issue 15): point-to-point
 * between ranks 0 and 1 at 1 B to 4 MiB (powers of two and odd sizes),
 * every byte compared, blocking ping-pong and both directions at once with
 * nonblocking calls; then, on every rank, MPI_Allreduce (sum of int64 and
 * double, max) and MPI_Bcast checked against the arithmetic. With
 * --bench it measures instead: ping-pong latency (half a round trip: the
 * mean, and the typical one, the median round trip's half) and
 * bandwidth (a window of nonblocking sends, one reply) between ranks 0 and
 * 1, and rank 0 prints a table and, with --json FILE, writes it.
 * --sizes A,B,... measures those sizes (at most 16, each 1 B to 4 MiB);
 * --lat-iters N sets the round trips per latency measurement below 64 KiB
 * (default 2000; a tenth of it from 64 KiB), --bw-windows N the windows of
 * 16 sends per bandwidth measurement below 64 KiB (default 200; a quarter
 * of it from 64 KiB, a twentieth from 1 MiB): fewer for slow transports
 * (TCG).
 *
 *   mpirun -np 2 mpi_check [--iters N]
 *   mpirun -np 2 mpi_check --bench [--json FILE] [--sizes A,B,...] [--lat-iters N] [--bw-windows N]
 *
 * Exit status 0 when every check passed (rank 0 prints "mpi_check: N
 * checks passed"), 1 with the first difference printed otherwise. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;
static long checks;

static uint8_t pattern(size_t size, size_t i, int iter, int from) {
  return (uint8_t)(i * 131 + (i >> 8) * 7 + (i >> 16) * 3 + size * 17 + (size_t)iter * 29 + (size_t)from * 101 + 1);
}

static void fill(uint8_t* buf, size_t size, int iter, int from) {
  for (size_t i = 0; i < size; ++i) buf[i] = pattern(size, i, iter, from);
}

static void check_bytes(const uint8_t* buf, size_t size, int iter, int from, const char* what) {
  for (size_t i = 0; i < size; ++i) {
    if (buf[i] != pattern(size, i, iter, from)) {
      fprintf(stderr, "mpi_check: rank %d: %s of %zu bytes (iteration %d, from rank %d): byte %zu is 0x%02x, "
              "expected 0x%02x\n", rank, what, size, iter, from, i, buf[i], pattern(size, i, iter, from));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  ++checks;
}

static void point_to_point(int iters) {
  static const size_t odd[] = {3, 1000, 4097, 65537, 1048577};
  size_t sizes[64];
  int n = 0;
  for (size_t s = 1; s <= (4u << 20); s <<= 1) sizes[n++] = s;
  for (size_t k = 0; k < sizeof odd / sizeof odd[0]; ++k) sizes[n++] = odd[k];
  uint8_t* out = malloc(4u << 20 | 1u << 20);
  uint8_t* in = malloc(4u << 20 | 1u << 20);
  if (!out || !in) MPI_Abort(MPI_COMM_WORLD, 1);
  const int peer = 1 - rank;
  for (int k = 0; k < n; ++k) {
    size_t size = sizes[k];
    int it = size >= (1u << 20) ? (iters + 3) / 4 : iters;
    for (int iter = 0; iter < it; ++iter) {
      /* Blocking ping-pong: rank 0 sends, rank 1 answers with its own bytes. */
      if (rank == 0) {
        fill(out, size, iter, 0);
        MPI_Send(out, (int)size, MPI_BYTE, peer, iter, MPI_COMM_WORLD);
        MPI_Recv(in, (int)size, MPI_BYTE, peer, iter, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        check_bytes(in, size, iter, 1, "ping-pong reply");
      } else {
        MPI_Status st;
        MPI_Recv(in, (int)size, MPI_BYTE, peer, iter, MPI_COMM_WORLD, &st);
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if ((size_t)count != size) {
          fprintf(stderr, "mpi_check: rank 1: received %d bytes, expected %zu\n", count, size);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        check_bytes(in, size, iter, 0, "ping-pong request");
        fill(out, size, iter, 1);
        MPI_Send(out, (int)size, MPI_BYTE, peer, iter, MPI_COMM_WORLD);
      }
      /* Both directions at once. */
      MPI_Request rq[2];
      fill(out, size, iter + 1000, rank);
      MPI_Irecv(in, (int)size, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &rq[0]);
      MPI_Isend(out, (int)size, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &rq[1]);
      MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
      check_bytes(in, size, iter + 1000, peer, "exchange");
    }
  }
  free(out);
  free(in);
}

static void collectives(void) {
  static const int counts[] = {1, 7, 1024, 65536, 1 << 20};
  for (size_t k = 0; k < sizeof counts / sizeof counts[0]; ++k) {
    int n = counts[k];
    int64_t* a = malloc(sizeof *a * (size_t)n);
    int64_t* r = malloc(sizeof *r * (size_t)n);
    double* d = malloc(sizeof *d * (size_t)n);
    double* dr = malloc(sizeof *dr * (size_t)n);
    if (!a || !r || !d || !dr) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < n; ++i) {
      a[i] = (int64_t)i * (rank + 1) + rank;
      d[i] = 0.5 * (double)rank + (double)(i % 1000);
    }
    MPI_Allreduce(a, r, n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(d, dr, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    /* sum over ranks p of i*(p+1)+p = i*R(R+1)/2 + R(R-1)/2; doubles: R(R-1)/4 + R*(i%1000),
     * exact in binary (halves and integers). */
    const int64_t R = nranks;
    for (int i = 0; i < n; ++i) {
      int64_t want = (int64_t)i * R * (R + 1) / 2 + R * (R - 1) / 2;
      double dwant = (double)(R * (R - 1)) / 4.0 + (double)R * (double)(i % 1000);
      if (r[i] != want || dr[i] != dwant) {
        fprintf(stderr, "mpi_check: rank %d: allreduce of %d elements: element %d is %lld / %.17g, expected %lld / %.17g\n",
                rank, n, i, (long long)r[i], dr[i], (long long)want, dwant);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    ++checks;
    int64_t mx = 0, mine = (int64_t)rank * 1000 + n;
    MPI_Allreduce(&mine, &mx, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (mx != (R - 1) * 1000 + n) {
      fprintf(stderr, "mpi_check: rank %d: allreduce max is %lld, expected %lld\n", rank, (long long)mx,
              (long long)((R - 1) * 1000 + n));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    ++checks;
    uint8_t* b = (uint8_t*)a;
    size_t bytes = sizeof *a * (size_t)n;
    if (rank == nranks - 1) fill(b, bytes, n, nranks - 1);
    MPI_Bcast(b, (int)bytes, MPI_BYTE, nranks - 1, MPI_COMM_WORLD);
    check_bytes(b, bytes, n, nranks - 1, "broadcast");
    free(a);
    free(r);
    free(d);
    free(dr);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

static size_t bench_sizes[16] = {8, 64, 1024, 4096, 65536, 1 << 20, 4 << 20};
static int bench_nsizes = 7, lat_iters = 2000, bw_windows = 200;

/* "A,B,..." into bench_sizes; 0 when the list is not 1 to 16 sizes of
 * 1 B to 4 MiB. */
static int parse_sizes(const char* list) {
  int n = 0;
  const char* p = list;
  while (*p) {
    char* end = NULL;
    unsigned long v = strtoul(p, &end, 10);
    if (end == p || v < 1 || v > (4u << 20) || n == 16 || (*end != ',' && *end != '\0')) return 0;
    bench_sizes[n++] = v;
    p = *end == ',' ? end + 1 : end;
  }
  bench_nsizes = n;
  return n > 0;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void bench(const char* json) {
  const size_t* sizes = bench_sizes;
  const int nsizes = bench_nsizes;
  double lat[16], typ[16], bw[16];
  uint8_t* buf = malloc(4u << 20);
  double* rt = malloc(sizeof(double) * (size_t)lat_iters);
  if (!buf || !rt) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(buf, 0x5a, 4u << 20);
  const int peer = 1 - rank;
  for (int k = 0; k < nsizes; ++k) {
    size_t size = sizes[k];
    int iters = size >= 65536 ? (lat_iters + 9) / 10 : lat_iters, warm = (iters + 9) / 10;
    double t0 = 0, t = 0;
    for (int i = 0; i < iters + warm; ++i) {
      if (i == warm) t0 = MPI_Wtime();
      if (i >= warm) t = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
      }
      if (i >= warm) rt[i - warm] = MPI_Wtime() - t;
    }
    lat[k] = (MPI_Wtime() - t0) / iters / 2 * 1e6;
    /* The typical round trip (the median, perftest's t_typical): a round
     * trip that waited for a descheduled process moves the mean, not it. */
    qsort(rt, (size_t)iters, sizeof(double), cmp_double);
    typ[k] = rt[iters / 2] / 2 * 1e6;
    /* Bandwidth: windows of 16 nonblocking sends, a 1-byte reply each. */
    enum { kWindow = 16 };
    MPI_Request rq[kWindow];
    int windows = size >= (1u << 20) ? (bw_windows + 19) / 20 : size >= 65536 ? (bw_windows + 3) / 4 : bw_windows;
    for (int w = 0; w < windows + 2; ++w) {
      if (w == 2) t0 = MPI_Wtime();
      for (int j = 0; j < kWindow; ++j) {
        if (rank == 0) MPI_Isend(buf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &rq[j]);
        else MPI_Irecv(buf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &rq[j]);
      }
      MPI_Waitall(kWindow, rq, MPI_STATUSES_IGNORE);
      if (rank == 0) MPI_Recv(buf, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      else MPI_Send(buf, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
    }
    bw[k] = (double)size * kWindow * windows / (MPI_Wtime() - t0) / (1 << 20);
  }
  if (rank == 0) {
    printf("%10s %14s %14s %14s\n", "bytes", "latency[us]", "typical[us]", "bw[MiB/s]");
    for (int k = 0; k < nsizes; ++k) printf("%10zu %14.2f %14.2f %14.1f\n", sizes[k], lat[k], typ[k], bw[k]);
    if (json) {
      FILE* f = fopen(json, "w");
      if (!f) {
        perror(json);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      fprintf(f, "{\"benchmark\":\"mpi_pingpong\",\"results\":[");
      for (int k = 0; k < nsizes; ++k) {
        fprintf(f, "%s{\"size\":%zu,\"latency_usec\":%.3f,\"latency_typical_usec\":%.3f,\"bw_mib_s\":%.3f}",
                k ? "," : "", sizes[k], lat[k], typ[k], bw[k]);
      }
      fprintf(f, "]}\n");
      fclose(f);
    }
  }
  free(rt);
  free(buf);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int iters = 4, do_bench = 0;
  const char* json = NULL;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--bench")) do_bench = 1;
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(argv[i], "--sizes") && i + 1 < argc && parse_sizes(argv[i + 1])) ++i;
    else if (!strcmp(argv[i], "--lat-iters") && i + 1 < argc && atoi(argv[i + 1]) > 0) lat_iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bw-windows") && i + 1 < argc && atoi(argv[i + 1]) > 0) bw_windows = atoi(argv[++i]);
    else {
      if (rank == 0)
        fprintf(stderr, "usage: mpi_check [--iters N] | --bench [--json FILE] [--sizes A,B,... (1..4194304, at most 16)] "
                        "[--lat-iters N] [--bw-windows N]\n");
      MPI_Finalize();
      return 2;
    }
  }
  if (nranks < 2) {
    if (rank == 0) fprintf(stderr, "mpi_check: needs at least 2 ranks (mpirun -np 2)\n");
    MPI_Finalize();
    return 2;
  }
  if (do_bench) {
    if (rank < 2) bench(json);
  } else {
    if (rank < 2) point_to_point(iters < 1 ? 1 : iters);
    collectives();
    long total = 0;
    MPI_Reduce(&checks, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi_check: %ld checks passed on %d ranks\n", total, nranks);
  }
  MPI_Finalize();
  return 0;
}
