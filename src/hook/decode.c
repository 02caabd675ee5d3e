/* SPDX-License-Identifier: MIT */
/* Read-outs of an attachment: the coverage of each generation and the current
 * generation's maps decoded by the conventions of <megascope/bpf/megascope.h>
 * (histograms as histograms, class ids as names), as JSON or as text. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "megascope/plan_ir.h"
#include "hook/hook_impl.h"
#include "megascope/json.h"

enum label { LABEL_NUM, LABEL_CLASS, LABEL_EVCLASS, LABEL_REQ };

static enum label label_of(const char *map_name) {
  if (strstr(map_name, "evclass")) return LABEL_EVCLASS;
  if (strstr(map_name, "class")) return LABEL_CLASS;
  if (strstr(map_name, "req")) return LABEL_REQ;
  return LABEL_NUM;
}

static void label_str(const struct ms_plan *p, enum label l, uint64_t v, char *buf, size_t n) {
  if (l == LABEL_CLASS && p && v < (uint64_t)p->n_classes)
    snprintf(buf, n, "%s", p->classes[v].name);
  else if (l == LABEL_EVCLASS && p && v < (uint64_t)p->n_ev_classes)
    snprintf(buf, n, "%s", p->ev_classes[v]);
  else if (l == LABEL_REQ)
    snprintf(buf, n, "slot %" PRIu64 " gen %" PRIu64, v >> 32, v & 0xffffffffu);
  else
    snprintf(buf, n, "%" PRIu64, v);
}

/* Sums of one map's entries over workers: key (as u64) -> value words. */
struct entry {
  uint64_t key;
  uint64_t *words;
};
struct collect {
  const struct ms_bpf_map_def *def;
  uint32_t n_workers;
  struct entry *e;
  size_t n, cap;
  int err;
};

static int collect_fn(void *user, const void *key, const void *values) {
  struct collect *c = user;
  uint32_t vs = c->def->value_size, nw = 1, words = (vs + 7) / 8;
  if (c->def->type == MS_BPF_MAP_PERCPU_ARRAY || c->def->type == MS_BPF_MAP_PERCPU_HASH) nw = c->n_workers;
  uint64_t k = 0;
  memcpy(&k, key, c->def->key_size < 8 ? c->def->key_size : 8);
  uint64_t *sum = calloc(words, sizeof *sum);
  if (!sum) return c->err = -ENOMEM;
  int any = 0;
  for (uint32_t w = 0; w < nw; w++)
    for (uint32_t i = 0; i < words; i++) {
      uint64_t v = 0;
      uint32_t off = i * 8, len = vs - off < 8 ? vs - off : 8;
      memcpy(&v, (const char *)values + (size_t)w * vs + off, len);
      sum[i] += v;
      any |= v != 0;
    }
  int is_array = c->def->type == MS_BPF_MAP_ARRAY || c->def->type == MS_BPF_MAP_PERCPU_ARRAY;
  if (is_array && !any) {
    free(sum);
    return 0;  /* arrays list only entries that were touched */
  }
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 64;
    struct entry *n = realloc(c->e, cap * sizeof *n);
    if (!n) {
      free(sum);
      return c->err = -ENOMEM;
    }
    c->e = n;
    c->cap = cap;
  }
  c->e[c->n++] = (struct entry){k, sum};
  return 0;
}

static int cmp_entry(const void *a, const void *b) {
  uint64_t x = ((const struct entry *)a)->key, y = ((const struct entry *)b)->key;
  return (x > y) - (x < y);
}

static void write_hist(struct collect *c, const struct ms_plan *p, enum label l, struct ms_json *j, FILE *f) {
  /* entries sorted by key: rows are runs of the same key / MS_HIST_BUCKETS */
  for (size_t i = 0; i < c->n;) {
    uint64_t row = c->e[i].key / MS_HIST_BUCKETS, total = 0;
    size_t end = i;
    while (end < c->n && c->e[end].key / MS_HIST_BUCKETS == row) total += c->e[end++].words[0];
    char name[96];
    label_str(p, l, row, name, sizeof name);
    uint64_t seen = 0, p50 = 0, p99 = 0;
    for (size_t k = i; k < end; k++) {
      uint64_t hi = 2ull << (c->e[k].key % MS_HIST_BUCKETS);
      seen += c->e[k].words[0];
      if (!p50 && seen * 2 >= total) p50 = hi;
      if (!p99 && seen * 100 >= total * 99) p99 = hi;
    }
    if (j) {
      ms_json_obj_begin(j);
      ms_json_kstr(j, "row", name);
      ms_json_kuint(j, "count", total);
      ms_json_kuint(j, "p50_le", p50);
      ms_json_kuint(j, "p99_le", p99);
      ms_json_key(j, "buckets");
      ms_json_arr_begin(j);
      for (size_t k = i; k < end; k++) {
        ms_json_obj_begin(j);
        ms_json_kuint(j, "ge", c->e[k].key % MS_HIST_BUCKETS ? 1ull << (c->e[k].key % MS_HIST_BUCKETS) : 0);
        ms_json_kuint(j, "lt", 2ull << (c->e[k].key % MS_HIST_BUCKETS));
        ms_json_kuint(j, "count", c->e[k].words[0]);
        ms_json_obj_end(j);
      }
      ms_json_arr_end(j);
      ms_json_obj_end(j);
    } else {
      fprintf(f, "    %-28s count %-8" PRIu64 " p50 <= %-10" PRIu64 " p99 <= %-10" PRIu64 " |", name, total, p50, p99);
      for (size_t k = i; k < end; k++)
        fprintf(f, " 2^%u:%" PRIu64, (unsigned)(c->e[k].key % MS_HIST_BUCKETS), c->e[k].words[0]);
      fputc('\n', f);
    }
    i = end;
  }
}

static void write_entries(struct collect *c, const struct ms_plan *p, enum label l, struct ms_json *j, FILE *f) {
  uint32_t words = (c->def->value_size + 7) / 8;
  for (size_t i = 0; i < c->n; i++) {
    char name[96];
    label_str(p, l, c->e[i].key, name, sizeof name);
    if (j) {
      ms_json_obj_begin(j);
      ms_json_kstr(j, "key", name);
      ms_json_key(j, "value");
      if (words == 1) {
        ms_json_uint(j, c->e[i].words[0]);
      } else {
        ms_json_arr_begin(j);
        for (uint32_t w = 0; w < words; w++) ms_json_uint(j, c->e[i].words[w]);
        ms_json_arr_end(j);
      }
      ms_json_obj_end(j);
    } else {
      fprintf(f, "    %-28s", name);
      for (uint32_t w = 0; w < words; w++) fprintf(f, " %" PRIu64, c->e[i].words[w]);
      fputc('\n', f);
    }
  }
}

static int write_map(struct ms_bpf_map *m, uint32_t n_workers, const struct ms_plan *p, struct ms_json *j, FILE *f) {
  const struct ms_bpf_map_def *d = ms_bpf_map_info(m);
  if (d->name[0] == '.' || strstr(d->name, ".rodata") || strstr(d->name, ".data") || strstr(d->name, ".bss"))
    return 0;  /* global data of the program, not a result */
  const char *kind = d->type == MS_BPF_MAP_RINGBUF ? "ringbuf" : !strncmp(d->name, "hist_", 5) ? "histogram" :
                     d->type == MS_BPF_MAP_HASH || d->type == MS_BPF_MAP_PERCPU_HASH ? "hash" : "array";
  if (j) {
    ms_json_obj_begin(j);
    ms_json_kstr(j, "name", d->name);
    ms_json_kstr(j, "kind", kind);
    ms_json_kbool(j, "per_worker", d->type == MS_BPF_MAP_PERCPU_ARRAY || d->type == MS_BPF_MAP_PERCPU_HASH);
  } else {
    fprintf(f, "  map %s (%s%s)\n", d->name, kind,
            d->type == MS_BPF_MAP_PERCPU_ARRAY || d->type == MS_BPF_MAP_PERCPU_HASH ? ", summed over workers" : "");
  }
  if (d->type == MS_BPF_MAP_RINGBUF) {
    if (j) {
      ms_json_kuint(j, "lost", ms_bpf_ringbuf_lost(m));
      ms_json_obj_end(j);
    } else {
      fprintf(f, "    records lost when full: %" PRIu64 "\n", ms_bpf_ringbuf_lost(m));
    }
    return 0;
  }
  struct collect c = {.def = d, .n_workers = n_workers};
  int rc = ms_bpf_map_foreach(m, collect_fn, &c);
  if (!rc) rc = c.err;
  if (c.n > 1) qsort(c.e, c.n, sizeof *c.e, cmp_entry);
  enum label l = label_of(d->name);
  if (j) ms_json_key(j, !strncmp(d->name, "hist_", 5) ? "rows" : "entries"), ms_json_arr_begin(j);
  if (!strncmp(d->name, "hist_", 5) && d->value_size == 8)
    write_hist(&c, p, l, j, f);
  else
    write_entries(&c, p, l, j, f);
  if (j) {
    ms_json_arr_end(j);
    ms_json_obj_end(j);
  }
  for (size_t i = 0; i < c.n; i++) free(c.e[i].words);
  free(c.e);
  return rc;
}

void ms_coverage_write_json(struct ms_json *j, const struct ms_coverage *cv) {
  ms_json_obj_begin(j);
  ms_json_kuint(j, "generation", cv->generation);
  ms_json_kuint(j, "eligible", cv->eligible);
  ms_json_kuint(j, "executed", cv->executed);
  ms_json_kuint(j, "throttled", cv->throttled);
  ms_json_kuint(j, "lost", cv->lost);
  ms_json_kuint(j, "failed", cv->failed);
  ms_json_kuint(j, "first_step", cv->first_step);
  ms_json_kuint(j, "last_step", cv->last_step);
  if (cv->t_start) ms_json_knum(j, "seconds", ((cv->t_end ? cv->t_end : ms_now_ns()) - cv->t_start) / 1e9);
  ms_json_obj_end(j);
}

static void write_cov(const struct ms_coverage *cv, struct ms_json *j, FILE *f) {
  if (j) {
    ms_coverage_write_json(j, cv);
  } else {
    fprintf(f, "  generation %u: eligible %" PRIu64 ", executed %" PRIu64 ", throttled %" PRIu64 ", lost %" PRIu64
               ", failed %" PRIu64 " (steps %" PRIu64 "..%" PRIu64 ")\n",
            cv->generation, cv->eligible, cv->executed, cv->throttled, cv->lost, cv->failed, cv->first_step,
            cv->last_step);
  }
}

int ms_hook_write(struct ms_hook_table *t, int id, const struct ms_plan *p, FILE *f, struct ms_json *j) {
  pthread_mutex_lock(&t->mu);
  struct attachment *a = ms_hook_find(t, id);
  if (!a) {
    pthread_mutex_unlock(&t->mu);
    return -ENOENT;
  }
  struct ms_gen *g = a->cur;
  if (j) {
    ms_json_obj_begin(j);
    ms_json_kint(j, "id", a->id);
    ms_json_kstr(j, "monitor", g->mon->name);
    ms_json_kbool(j, "attached", a->attached);
    ms_json_key(j, "programs");
    ms_json_arr_begin(j);
    for (int i = 0; i < g->mon->n_progs; i++) {
      ms_json_obj_begin(j);
      ms_json_kstr(j, "name", ms_bpf_prog_name(g->mon->progs[i]));
      ms_json_kstr(j, "hook", ms_hook_name(g->mon->hook[i]));
      ms_json_kstr(j, "type", ms_prog_type_name(g->mon->type[i]));
      const struct ms_bpf_jit *jit = g->jits ? g->jits[i] : NULL;
      ms_json_kstr(j, "exec", jit ? "jit" : "interp");
      if (jit) ms_json_kuint(j, "code_bytes", ms_bpf_jit_code_size(jit));
      ms_json_obj_end(j);
    }
    ms_json_arr_end(j);
  } else {
    fprintf(f, "attachment %d: %s (%s, %d of %d programs JIT-compiled)\n", a->id, g->mon->name,
            a->attached ? "attached" : "detached", g->n_jitted, g->mon->n_progs);
  }
  struct ms_coverage cv;
  ms_hook_coverage(t, g, &cv);
  if (j) {
    ms_json_key(j, "coverage");
    write_cov(&cv, j, f);
    ms_json_key(j, "generations");
    ms_json_arr_begin(j);
  } else {
    fprintf(f, "  coverage (generation %u): eligible %" PRIu64 ", executed %" PRIu64 ", throttled %" PRIu64
               ", lost %" PRIu64 "\n", cv.generation, cv.eligible, cv.executed, cv.throttled, cv.lost);
  }
  for (struct ms_gen *h = g; h; h = h->prev) {
    ms_hook_coverage(t, h, &cv);
    write_cov(&cv, j, f);
  }
  int rc = 0;
  if (j) {
    ms_json_arr_end(j);
    ms_json_key(j, "maps");
    ms_json_arr_begin(j);
  }
  for (int i = 0; i < g->n_maps && !rc; i++) rc = write_map(g->maps[i], (uint32_t)t->n_workers, p, j, f);
  if (j) {
    ms_json_arr_end(j);
    ms_json_obj_end(j);
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

/* For backends that hold their own maps (the CUDA engine): one coverage record
 * and the maps, decoded as above. */
int ms_monitor_write_maps(const char *name, struct ms_bpf_map *const *maps, int n, uint32_t n_workers,
                          const struct ms_coverage *cov, const struct ms_plan *p, FILE *f, int as_json) {
  struct ms_json js, *j = NULL;
  if (as_json) {
    ms_json_init(&js, f, 1);
    j = &js;
    ms_json_obj_begin(j);
    ms_json_kstr(j, "monitor", name);
    ms_json_key(j, "coverage");
  } else {
    fprintf(f, "monitor %s\n", name);
  }
  write_cov(cov, j, f);
  int rc = 0;
  if (j) {
    ms_json_key(j, "maps");
    ms_json_arr_begin(j);
  }
  for (int i = 0; i < n && !rc; i++) rc = write_map(maps[i], n_workers, p, j, f);
  if (j) {
    ms_json_arr_end(j);
    ms_json_obj_end(j);
    ms_json_end(j);
  }
  return rc;
}
