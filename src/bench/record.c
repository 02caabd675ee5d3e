/* SPDX-License-Identifier: MIT */
/* A benchmark run's evidence, kept to be judged again (bench diagnose --record
 * DIR, --replay DIR).
 *
 * On real clocks a scenario costs about a minute of a quiet machine (the
 * paired runs, the tuning, six observed runs), so trying a diagnoser's rule on
 * a whole split anew costs half an hour. A record keeps, for every scenario,
 * what the diagnosers were given, exactly as they were given it: the case
 * (the drawn scenario, its measured effect) and, for every method and budget,
 * the evidence of the faulty run, the fresh healthy run and the cached
 * references, taken just before the diagnosis (which reads the semantic rows
 * lazily and so changes them). A replay compiles the scenario's plan again
 * and asks the diagnosers of this build; the runs are not repeated.
 *
 * The file is this build's structs written as they lie in memory, behind a
 * header of their sizes: a record is read back by a build of the same
 * layout, and refused otherwise. It is a tool for trying rules on what was
 * measured; a held-out split is still run afresh after the last change. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

static const char magic[8] = "MSREC01";

struct rec_head {
  char magic[8];
  uint32_t case_size, ev_size, feat_size, stat_size, fs_count, bm_count;
  int32_t workers, n_budgets;
  uint64_t budgets[BENCH_MAX_BUDGETS];
};

static int put(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -EIO; }
static int get(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -EIO; }

FILE *bench_record_begin(const char *dir, int idx, const struct bench_case *c, int workers,
                         const struct bench_opts *o) {
  char path[4096];
  snprintf(path, sizeof path, "%s/case-%04d.rec", dir, idx);
  FILE *f = fopen(path, "wb");
  if (!f) return NULL;
  struct rec_head h = {.case_size = sizeof *c, .ev_size = sizeof(struct bench_evidence),
                       .feat_size = sizeof(struct bench_features), .stat_size = sizeof(struct bench_stat),
                       .fs_count = FS_COUNT, .bm_count = BM_COUNT, .workers = workers,
                       .n_budgets = o->n_budgets};
  memcpy(h.magic, magic, sizeof h.magic);
  memcpy(h.budgets, o->budgets, sizeof h.budgets);
  if (put(f, &h, sizeof h) || put(f, c, sizeof *c)) {
    fclose(f);
    return NULL;
  }
  return f;
}

static int put_evidence(FILE *f, const struct bench_evidence *ev) {
  int32_t has_feat = ev->feat != NULL;
  int rc = put(f, ev, sizeof *ev);
  if (!rc && ev->n_steps > 0) rc = put(f, ev->step_ns, sizeof *ev->step_ns * (size_t)ev->n_steps);
  if (!rc) rc = put(f, &has_feat, sizeof has_feat);
  if (!rc && has_feat) {
    rc = put(f, ev->feat, sizeof *ev->feat);
    for (int s = 0; s < FS_COUNT && !rc; s++)
      rc = put(f, ev->feat->row[s], sizeof **ev->feat->row * ((size_t)ev->feat->n[s] + 1));
  }
  return rc;
}

int bench_record_group(FILE *f, int meth, int b, const struct bench_evidence *fresh, int nf,
                       const struct bench_evidence *const *ref, int nref, const struct bench_evidence *ev) {
  int32_t hdr[4] = {meth, b, nref, nf};
  int rc = put(f, hdr, sizeof hdr);
  for (int i = 0; i < nf && !rc; i++) rc = put_evidence(f, &fresh[i]);
  for (int i = 0; i < nref && !rc; i++) rc = put_evidence(f, ref[i]);
  if (!rc) rc = put_evidence(f, ev);
  return rc;
}

int bench_record_end(FILE *f) {
  int32_t hdr[4] = {-1, -1, 0, 0};
  int rc = put(f, hdr, sizeof hdr);
  return fclose(f) || rc ? -EIO : 0;
}

/* One evidence as put_evidence wrote it, its pointers made anew. */
static int get_evidence(FILE *f, struct bench_evidence *ev) {
  int32_t has_feat;
  if (get(f, ev, sizeof *ev)) {
    memset(ev, 0, sizeof *ev);
    return -EIO;
  }
  ev->step_ns = NULL;
  struct bench_features *feat = NULL;
  ev->feat = NULL;
  if (ev->n_steps < 0 || ev->n_steps > (1 << 24)) return -EINVAL;
  if (ev->n_steps > 0) {
    if (!(ev->step_ns = malloc(sizeof *ev->step_ns * (size_t)ev->n_steps))) return -ENOMEM;
    if (get(f, ev->step_ns, sizeof *ev->step_ns * (size_t)ev->n_steps)) return -EIO;
  }
  if (get(f, &has_feat, sizeof has_feat)) return -EIO;
  if (!has_feat) return 0;
  if (!(feat = calloc(1, sizeof *feat))) return -ENOMEM;
  if (get(f, feat, sizeof *feat)) {
    free(feat);
    return -EIO;
  }
  for (int s = 0; s < FS_COUNT; s++) feat->row[s] = NULL;
  ev->feat = feat;
  feat->bytes = &ev->bytes;
  for (int s = 0; s < FS_COUNT; s++) {
    if (feat->n[s] < 0 || feat->n[s] > (1 << 20)) return -EINVAL;
    size_t k = (size_t)feat->n[s] + 1;
    if (!(feat->row[s] = malloc(sizeof **feat->row * k))) return -ENOMEM;
    if (get(f, feat->row[s], sizeof **feat->row * k)) return -EIO;
  }
  return 0;
}

int bench_replay_count(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -errno;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    int idx;
    char tail[8];
    if (sscanf(e->d_name, "case-%d.%7s", &idx, tail) == 2 && !strcmp(tail, "rec") && idx + 1 > n) n = idx + 1;
  }
  closedir(d);
  return n;
}

int bench_replay_budgets(const char *dir, struct bench_opts *o) {
  int n = bench_replay_count(dir);
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/case-%04d.rec", dir, i);
    FILE *f = fopen(path, "rb");
    struct rec_head h;
    int ok = f && !get(f, &h, sizeof h) && !memcmp(h.magic, magic, sizeof magic) && h.n_budgets > 0 &&
             h.n_budgets <= BENCH_MAX_BUDGETS;
    if (f) fclose(f);
    if (!ok) continue;
    o->n_budgets = h.n_budgets;
    memcpy(o->budgets, h.budgets, sizeof o->budgets);
    return 0;
  }
  return -ENOENT;
}

/* Where each recorded budget stands in o's (-1: not asked for); 0 when every
 * budget o asks for was recorded. */
static int budget_map(const struct rec_head *h, const struct bench_opts *o, int *map) {
  int found = 0;
  for (int b = 0; b < BENCH_MAX_BUDGETS; b++) {
    map[b] = -1;
    for (int k = 0; b < h->n_budgets && k < o->n_budgets; k++)
      if (o->budgets[k] == h->budgets[b]) map[b] = k, found++;
  }
  return found == o->n_budgets ? 0 : -1;
}

FILE *bench_replay_begin(const char *dir, int idx, const struct bench_opts *o, struct bench_case *c, int *workers,
                         int *bmap, char *why, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/case-%04d.rec", dir, idx);
  FILE *f = fopen(path, "rb");
  struct rec_head h;
  if (!f) {
    snprintf(why, n, "%s: %s", path, strerror(errno));
    return NULL;
  }
  if (get(f, &h, sizeof h) || memcmp(h.magic, magic, sizeof magic)) {
    snprintf(why, n, "%s: not a benchmark record", path);
  } else if (h.case_size != sizeof *c || h.ev_size != sizeof(struct bench_evidence) ||
             h.feat_size != sizeof(struct bench_features) || h.stat_size != sizeof(struct bench_stat) ||
             h.fs_count != FS_COUNT || h.bm_count != BM_COUNT) {
    snprintf(why, n, "%s: recorded by a build of another layout (case %u, evidence %u bytes; this build: %zu, %zu)",
             path, h.case_size, h.ev_size, sizeof *c, sizeof(struct bench_evidence));
  } else if (h.n_budgets < 1 || h.n_budgets > BENCH_MAX_BUDGETS || budget_map(&h, o, bmap)) {
    size_t k = (size_t)snprintf(why, n, "%s: recorded at other budgets: give --budgets from ", path);
    for (int b = 0; b < h.n_budgets && b < BENCH_MAX_BUDGETS && k < n; b++)
      k += (size_t)snprintf(why + k, n - k, "%s%llu", b ? "," : "", (unsigned long long)h.budgets[b]);
  } else if (get(f, c, sizeof *c)) {
    snprintf(why, n, "%s: cut short in its case", path);
  } else {
    *workers = h.workers;
    return f;
  }
  fclose(f);
  return NULL;
}

int bench_replay_group(FILE *f, int *meth, int *b, struct bench_evidence *fresh, int *nf,
                       struct bench_evidence *ref, int max_ref, int *nref, struct bench_evidence *ev) {
  int32_t hdr[4];
  if (get(f, hdr, sizeof hdr)) return -EIO;
  if (hdr[0] < 0) return 1;
  if (hdr[0] >= BM_COUNT || hdr[1] < 0 || hdr[1] >= BENCH_MAX_BUDGETS || hdr[2] < 1 || hdr[2] > max_ref ||
      hdr[3] < 0 || hdr[3] > 2)
    return -EINVAL;
  *meth = hdr[0];
  *b = hdr[1];
  *nref = hdr[2];
  *nf = hdr[3];  /* records made before the run after the faulty one hold 1 */
  int rc = 0;
  for (int i = 0; i < *nf && !rc; i++) rc = get_evidence(f, &fresh[i]);
  for (int i = 0; i < *nref && !rc; i++) rc = get_evidence(f, &ref[i]);
  if (!rc) rc = get_evidence(f, ev);
  return rc;
}
