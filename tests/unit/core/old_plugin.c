/* A plugin written in plain C whose table is shorter than this ufab's: its
 * `size` ends before `link`, as if it had been built against an older ABI
 * minor. The loader must use open/close/info and stub everything after,
 * without looking at what lies beyond `size`. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "abi/raw_frame.h"

struct ufab_dev {
  int opened;
};

static int old_open(const struct ufab_host_ops* ops, struct ufab_host* host, struct ufab_dev** out) {
  (void)ops;
  (void)host;
  *out = calloc(1, sizeof(**out));
  if (*out == NULL) return -ENOMEM;
  (*out)->opened = 1;
  return 0;
}

static void old_close(struct ufab_dev* dev) { free(dev); }

static int old_info(struct ufab_dev* dev, struct ufab_dev_info* out) {
  (void)dev;
  memset(out, 0, sizeof(*out));
  strcpy(out->model, "old");
  return 0;
}

/* Lies beyond `size`: a loader that called it would get 42, not -EOPNOTSUPP. */
static int beyond_size(struct ufab_dev* dev) {
  (void)dev;
  return 42;
}

static const struct ufab_driver old_driver = {
    .abi_major = UFAB_ABI_MAJOR,
    .abi_minor = 0,
    .size = offsetof(struct ufab_driver, link),
    .name = "old",
    .description = "C plugin with a short table",
    .pci_match = NULL,
    .flags = UFAB_DRIVER_F_SOFTWARE,
    .open = old_open,
    .close = old_close,
    .info = old_info,
    .start = beyond_size,
};

__attribute__((visibility("default"))) const struct ufab_driver* ufab_driver_entry_v1(void) { return &old_driver; }
