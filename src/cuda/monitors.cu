/* SPDX-License-Identifier: MIT */
/* Monitors on the device, host side: the device hook table, attachments with
 * host maps and their device mirrors, publication, quiescence, coverage and
 * map read-back (see monitors.h, and bpf_dev.cuh's DESIGN). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "cuda/bpf_dev.cuh"
#include "cuda/monitors.h"

#define QUIESCE_TIMEOUT_NS 5000000000ull /* then what was unpublished is kept, not freed */
#define ARENA_ALIGN 256                   /* every span starts on a 256-byte boundary */
#define SNAP_TRIES 16                     /* copies of a generation's maps before a read-out gives up */
#define SNAP_DRAIN_NS 2000000ull          /* how long a snapshot waits for firings in flight to end */

/* One generation on the host: the monitor, its host maps and what it has on
 * the device (freed once unpublished and quiescent). */
struct gen {
  struct ms_monitor *mon;
  int n_maps, n_progs;
  struct ms_bpf_map **maps;          /* [n_maps] the CPU engine's memfd maps */
  struct ms_bpf_map_shm *hdr;        /* [n_maps] their headers */
  uint8_t **img;                     /* [n_maps] the memfds mapped here (total_size) */
  uint8_t **dimg;                    /* [n_maps] device images */
  struct msd_map *dmaps;             /* device [n_maps] */
  struct ms_bpf_insn **dinsns;       /* [n_progs] device */
  struct msd_prog *dprogs;           /* device [n_progs] */
  int *hook, *type;                  /* [n_progs] */
  struct msd_gen *dgen;              /* device */
  struct msd_cov *dcov;              /* device [n_sms] */
  uint32_t generation;
  uint64_t t_start, t_end;
  int on_device;                     /* 0 once its device memory is gone */
  int borrowed;                      /* mon and maps are the caller's (ms_cuda_mon_attach_shared) */
  struct ms_coverage final_cov;      /* when !on_device */
  struct gen *prev;
};

struct att {
  int id, attached;
  struct ms_attach_opts opts;
  struct gen *cur;
};

/* A span of the arena: [off, off + len). */
struct span {
  size_t off, len;
};

/* The arena: device memory allocated before the launch, handed out by a
 * first-fit free list kept here, on the host. Written by hand: the usual
 * sub-allocators (TLSF and the like) keep their bookkeeping inside the memory
 * they manage, and this memory is the device's. */
struct arena {
  uint8_t *base;                     /* device; NULL: none */
  size_t size, used, kept, peak;
  struct span *free_, *live;         /* sorted by offset */
  int n_free, n_live, cap_free, cap_live;
};

struct ms_cuda_mon {
  int n_sms;
  cudaStream_t s;
  struct arena ar;
  struct msd_hooks *dev;             /* device (the arena) */
  struct msd_qs *dqs;                /* device [n_sms] (the arena) */
  struct msd_set *hset;              /* [MS_HOOK_COUNT] what set[] holds, on the host */
  struct msd_set *dset[MS_HOOK_COUNT]; /* device sets published, NULL for none */
  uint64_t flip;
  int running;                       /* atomic: read by a control call's wait, set by the kernel's owner */
  cudaStream_t ks;                   /* atomic: the persistent kernel's stream, or NULL */
  struct att **atts;
  int n_atts, cap_atts;
  uint64_t torn;                     /* snapshots given up on (every copy saw a write) */
  /* One call at a time: held across the call's own copies and a control
   * call's quiescence wait, so the engine's driver only tries it
   * (ms_cuda_mon_sync_maps_try) and never waits on another call's device
   * work. Nothing it guards is touched by the kernel's owner's waits. */
  pthread_mutex_t mu;
};

/* ---- the arena ----------------------------------------------------------- */

static int spans_insert(struct span **v, int *n, int *cap, int at, struct span x) {
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 32;
    struct span *nv = (struct span *)realloc(*v, (size_t)c * sizeof *nv);
    if (!nv) return -ENOMEM;
    *v = nv;
    *cap = c;
  }
  memmove(&(*v)[at + 1], &(*v)[at], (size_t)(*n - at) * sizeof **v);
  (*v)[at] = x;
  (*n)++;
  return 0;
}

static void spans_remove(struct span *v, int *n, int at) {
  memmove(&v[at], &v[at + 1], (size_t)(*n - at - 1) * sizeof *v);
  (*n)--;
}

static int arena_init(struct arena *a, uint8_t *base, size_t size) {
  memset(a, 0, sizeof *a);
  a->base = base;
  a->size = size;
  return spans_insert(&a->free_, &a->n_free, &a->cap_free, 0, span{0, size});
}

/* First fit; *off on success. */
static int arena_get(struct arena *a, size_t n, size_t *off) {
  n = (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
  for (int i = 0; i < a->n_free; i++) {
    if (a->free_[i].len < n) continue;
    int at = 0;
    while (at < a->n_live && a->live[at].off < a->free_[i].off) at++;
    if (spans_insert(&a->live, &a->n_live, &a->cap_live, at, span{a->free_[i].off, n})) return -ENOMEM;
    *off = a->free_[i].off;
    a->free_[i].off += n;
    a->free_[i].len -= n;
    if (!a->free_[i].len) spans_remove(a->free_, &a->n_free, i);
    a->used += n;
    if (a->used > a->peak) a->peak = a->used;
    return 0;
  }
  return -ENOMEM;
}

/* The live span at off, removed from the live list; its length, 0: none. */
static size_t arena_take_live(struct arena *a, size_t off) {
  for (int i = 0; i < a->n_live; i++)
    if (a->live[i].off == off) {
      size_t len = a->live[i].len;
      spans_remove(a->live, &a->n_live, i);
      a->used -= len;
      return len;
    }
  return 0;
}

/* Back on the free list, merged with its neighbours. */
static void arena_put(struct arena *a, size_t off) {
  size_t len = arena_take_live(a, off);
  if (!len) return;
  int at = 0;
  while (at < a->n_free && a->free_[at].off < off) at++;
  if (at > 0 && a->free_[at - 1].off + a->free_[at - 1].len == off) {
    a->free_[at - 1].len += len;
    if (at < a->n_free && off + len == a->free_[at].off) {
      a->free_[at - 1].len += a->free_[at].len;
      spans_remove(a->free_, &a->n_free, at);
    }
    return;
  }
  if (at < a->n_free && off + len == a->free_[at].off) {
    a->free_[at].off = off;
    a->free_[at].len += len;
    return;
  }
  if (spans_insert(&a->free_, &a->n_free, &a->cap_free, at, span{off, len})) a->kept += len; /* lost, not reused */
}

static void arena_release(struct arena *a) {
  free(a->free_);
  free(a->live);
  memset(a, 0, sizeof *a);
}

/* ---- device memory: arena spans and copies on the copy stream ------------ */

static int ck(cudaError_t e, const char *what, struct ms_textbuf *log) {
  if (e == cudaSuccess) return 0;
  ms_textbuf_printf(log, "cuda monitors: %s: %s\n", what, cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

/* n bytes of the arena (contents undefined: every caller copies over them). */
static int dalloc(struct ms_cuda_mon *mon, void **p, size_t n, struct ms_textbuf *log) {
  size_t off = 0;
  *p = NULL;
  if (arena_get(&mon->ar, n ? n : 1, &off)) {
    ms_textbuf_printf(log, "cuda monitors: out of memory: the monitor arena (%zu KiB, %zu in use) has no %zu KiB "
                      "span free (ms_cuda_opts.monitor_mib sizes it)\n",
                      mon->ar.size >> 10, mon->ar.used >> 10, (n + 1023) >> 10);
    return -ENOMEM;
  }
  *p = mon->ar.base + off;
#ifdef MSD_HOST_EMU  /* the CPU run (tests/emu): a span reads as uninitialised as the device's */
  memset(*p, 0xa5, n);
#endif
  return 0;
}

static void dfree(struct ms_cuda_mon *mon, void *p) {
  if (!p) return;
  size_t off = (size_t)((uint8_t *)p - mon->ar.base);
#ifdef MSD_HOST_EMU  /* the CPU run: a span an SM still read would read garbage, not go unnoticed */
  for (int i = 0; i < mon->ar.n_live; i++)
    if (mon->ar.live[i].off == off) memset(p, 0xdb, mon->ar.live[i].len);
#endif
  arena_put(&mon->ar, off);
}

/* Memory an SM may still read: out of the live list, never handed out again. */
static void keep(struct ms_cuda_mon *mon, void *p) {
  if (p) mon->ar.kept += arena_take_live(&mon->ar, (size_t)((uint8_t *)p - mon->ar.base));
}

static int h2d(struct ms_cuda_mon *mon, void *d, const void *h, size_t n, struct ms_textbuf *log) {
  return ck(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, mon->s), "copy to the device", log);
}

static int d2h(struct ms_cuda_mon *mon, void *h, const void *d, size_t n) {
  return ck(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, mon->s), "copy from the device", NULL);
}

/* Zeros by copies from a zero block: a memset may be a kernel, which would
 * wait for an SM the resident kernel never gives up. */
static int dzero(struct ms_cuda_mon *mon, void *d, size_t n, struct ms_textbuf *log) {
  static const uint64_t zero[8192] = {0};
  int rc = 0;
  for (size_t at = 0; !rc && at < n; at += sizeof zero)
    rc = h2d(mon, (uint8_t *)d + at, zero, n - at < sizeof zero ? n - at : sizeof zero, log);
  return rc;
}

static int sync_stream(struct ms_cuda_mon *mon, struct ms_textbuf *log) {
  return ck(cudaStreamSynchronize(mon->s), "copy stream", log);
}

static int mon_running(const struct ms_cuda_mon *mon) { return __atomic_load_n(&mon->running, __ATOMIC_ACQUIRE); }

/* ---- the table ----------------------------------------------------------- */

/* 40 MiB: the largest ring a shipped monitor declares (16 MiB, diag_sample)
 * takes twice that on the device (its mirror), and small maps fit beside it. */
extern "C" size_t ms_cuda_mon_arena_default(int n_sms) { return ((size_t)40 << 20) + (size_t)n_sms * (2 << 20); }

extern "C" struct ms_cuda_mon *ms_cuda_mon_new(int n_sms, size_t arena_bytes, struct ms_textbuf *log) {
  if (n_sms < 1 || n_sms > 4096) {
    ms_textbuf_printf(log, "cuda monitors: %d SMs (1..4096)\n", n_sms);
    errno = EINVAL;
    return NULL;
  }
  struct ms_cuda_mon *mon = (struct ms_cuda_mon *)calloc(1, sizeof *mon);
  if (!mon) return NULL;
  pthread_mutex_init(&mon->mu, NULL);
  mon->n_sms = n_sms;
  mon->hset = (struct msd_set *)calloc(MS_HOOK_COUNT, sizeof *mon->hset);
  if (!arena_bytes) arena_bytes = ms_cuda_mon_arena_default(n_sms);
  struct msd_hooks h;
  memset(&h, 0, sizeof h);
  h.n_sms = (uint32_t)n_sms;
  void *base = NULL;
  int rc = mon->hset ? 0 : -ENOMEM;
  /* before any launch: the one allocation (see struct arena) */
  if (!rc) rc = ck(cudaStreamCreateWithFlags(&mon->s, cudaStreamNonBlocking), "stream", log);
  if (!rc) rc = ck(cudaMalloc(&base, arena_bytes), "the monitor arena", log);
  if (!rc) rc = arena_init(&mon->ar, (uint8_t *)base, arena_bytes);
  if (!rc) rc = dalloc(mon, (void **)&mon->dqs, (size_t)n_sms * sizeof(struct msd_qs), log);
  if (!rc) rc = dzero(mon, mon->dqs, (size_t)n_sms * sizeof(struct msd_qs), log);
  if (!rc) rc = dalloc(mon, (void **)&mon->dev, sizeof(struct msd_hooks), log);
  h.qs = mon->dqs;
  if (!rc) rc = h2d(mon, mon->dev, &h, sizeof h, log);
  if (!rc) rc = sync_stream(mon, log);
  if (rc) {
    if (base && !mon->ar.base) cudaFree(base);
    ms_cuda_mon_free(mon);
    errno = -rc;
    return NULL;
  }
  return mon;
}

extern "C" struct msd_hooks *ms_cuda_mon_device(struct ms_cuda_mon *mon) { return mon->dev; }

extern "C" void ms_cuda_mon_set_running(struct ms_cuda_mon *mon, int running) {
  __atomic_store_n(&mon->running, running, __ATOMIC_RELEASE);  /* a control call's wait reads it without the lock */
}

extern "C" void ms_cuda_mon_set_stream(struct ms_cuda_mon *mon, void *kernel_stream) {
  __atomic_store_n(&mon->ks, (cudaStream_t)kernel_stream, __ATOMIC_RELEASE);
}

extern "C" void ms_cuda_mon_arena(struct ms_cuda_mon *mon, size_t *size, size_t *used, size_t *kept) {
  pthread_mutex_lock(&mon->mu);
  *size = mon->ar.size;
  *used = mon->ar.used;
  *kept = mon->ar.kept;
  pthread_mutex_unlock(&mon->mu);
}

/* ---- generations --------------------------------------------------------- */

static void gen_free_device(struct ms_cuda_mon *mon, struct gen *g, int safe) {
  void *ps[4] = {g->dmaps, g->dprogs, g->dgen, g->dcov};
  for (int i = 0; i < 4; i++) safe ? dfree(mon, ps[i]) : keep(mon, ps[i]);
  for (int i = 0; g->dimg && i < g->n_maps; i++) safe ? dfree(mon, g->dimg[i]) : keep(mon, g->dimg[i]);
  for (int i = 0; g->dinsns && i < g->n_progs; i++) safe ? dfree(mon, g->dinsns[i]) : keep(mon, g->dinsns[i]);
  g->dmaps = NULL;
  g->dprogs = NULL;
  g->dgen = NULL;
  g->dcov = NULL;
  if (g->dimg) memset(g->dimg, 0, (size_t)g->n_maps * sizeof *g->dimg);
  if (g->dinsns) memset(g->dinsns, 0, (size_t)g->n_progs * sizeof *g->dinsns);
  g->on_device = 0;
}

/* Frees g and the generations before it; the monitor too unless keep_mon. */
static void gen_free(struct ms_cuda_mon *mon, struct gen *g, int keep_mon) {
  while (g) {
    struct gen *prev = g->prev;
    gen_free_device(mon, g, 1);
    for (int i = 0; i < g->n_maps; i++) {
      if (g->img && g->img[i]) munmap(g->img[i], g->hdr[i].total_size);
      if (g->maps && !g->borrowed) ms_bpf_map_free(g->maps[i]);
    }
    free(g->maps);
    free(g->hdr);
    free(g->img);
    free(g->dimg);
    free(g->dinsns);
    free(g->hook);
    free(g->type);
    if (!keep_mon && !g->borrowed) ms_monitor_free(g->mon);
    free(g);
    keep_mon = 0;
    g = prev;
  }
}

static int map_type_ok(uint32_t t) {
  return t == MS_BPF_MAP_HASH || t == MS_BPF_MAP_ARRAY || t == MS_BPF_MAP_PERCPU_HASH ||
         t == MS_BPF_MAP_PERCPU_ARRAY || t == MS_BPF_MAP_RINGBUF;
}

/* Whether the device can run every program of m: helpers and map types. */
static int check_supported(struct ms_monitor *m, struct ms_textbuf *log) {
  const struct ms_bpf_object *obj = ms_monitor_object(m);
  size_t n_maps = ms_bpf_object_map_count(obj);
  if (n_maps > MS_BPF_MAX_MAPS) {
    ms_textbuf_printf(log, "%s: %zu maps, the device takes %d\n", ms_monitor_name(m), n_maps, MS_BPF_MAX_MAPS);
    return -MS_E_UNSUPP;
  }
  for (int p = 0; p < ms_monitor_prog_count(m); p++) {
    const struct ms_bpf_prog *prog = ms_bpf_object_prog(obj, (size_t)p);
    size_t n;
    const struct ms_bpf_insn *in = ms_bpf_prog_insns(prog, &n);
    for (size_t i = 0; i < n; i++) {
      if (in[i].code == (MS_BPF_JMP | MS_BPF_CALL) && in[i].src_reg == 0 && !msd_helper_supported((uint32_t)in[i].imm)) {
        ms_textbuf_printf(log, "program '%s' of %s: insn %zu: helper %u is not supported on the device\n",
                          ms_bpf_prog_name(prog), ms_monitor_name(m), i, (uint32_t)in[i].imm);
        return -MS_E_UNSUPP;
      }
      if (in[i].code == (MS_BPF_LD | MS_BPF_IMM | MS_BPF_DW) && in[i].src_reg && (size_t)in[i].imm < n_maps) {
        const struct ms_bpf_map_def *d = ms_bpf_object_map(obj, (size_t)in[i].imm);
        if (!map_type_ok(d->type)) {
          ms_textbuf_printf(log, "program '%s' of %s: insn %zu: map %s of type %u is not supported on the device\n",
                            ms_bpf_prog_name(prog), ms_monitor_name(m), i, d->name, d->type);
          return -MS_E_UNSUPP;
        }
      }
    }
  }
  return 0;
}

/* Host maps as the CPU engine makes them (table.c), or the caller's (shared:
 * made that way already), and their device mirrors. */
static int gen_maps(struct ms_cuda_mon *mon, struct gen *g, struct ms_bpf_map **shared, struct ms_textbuf *log) {
  const struct ms_bpf_object *obj = ms_monitor_object(g->mon);
  struct msd_map *hm = (struct msd_map *)calloc((size_t)g->n_maps + 1, sizeof *hm);
  int rc = hm ? 0 : -ENOMEM;
  for (int i = 0; !rc && i < g->n_maps; i++) {
    if (shared) {
      g->maps[i] = shared[i];
    } else {
      g->maps[i] = ms_bpf_map_new(ms_bpf_object_map(obj, (size_t)i), (uint32_t)mon->n_sms, log);
      if (!g->maps[i]) {
        rc = -errno;
        break;
      }
      size_t n;
      const void *init = ms_bpf_object_map_init(obj, (size_t)i, &n);
      uint32_t key = 0;
      for (int w = 0; init && n && !rc && w < mon->n_sms; w++)
        rc = ms_bpf_map_update(g->maps[i], &key, init, MS_BPF_ANY, (uint32_t)w);
    }
    int fd = ms_bpf_map_fd(g->maps[i]);
    if (rc || pread(fd, &g->hdr[i], sizeof g->hdr[i], 0) != (ssize_t)sizeof g->hdr[i]) {
      rc = rc ? rc : -EIO;
      break;
    }
    void *p = mmap(NULL, g->hdr[i].total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      rc = -errno;
      break;
    }
    g->img[i] = (uint8_t *)p;
    uint64_t isz = msd_map_image_size(&g->hdr[i]);
    if ((rc = dalloc(mon, (void **)&g->dimg[i], isz, log))) break;
    if ((rc = h2d(mon, g->dimg[i], g->img[i], g->hdr[i].total_size, log))) break;
    if (isz > g->hdr[i].total_size &&  /* a ring's mirror past the image */
        (rc = dzero(mon, g->dimg[i] + g->hdr[i].total_size, isz - g->hdr[i].total_size, log)))
      break;
    msd_map_init(&hm[i], &g->hdr[i], g->dimg[i]);
  }
  if (!rc && g->n_maps) rc = dalloc(mon, (void **)&g->dmaps, (size_t)g->n_maps * sizeof *hm, log);
  if (!rc && g->n_maps) rc = h2d(mon, g->dmaps, hm, (size_t)g->n_maps * sizeof *hm, log);
  if (!rc) rc = sync_stream(mon, log); /* hm is freed next */
  if (rc && rc != -ENOMEM && rc != -EIO)
    ms_textbuf_printf(log, "%s: maps: %s\n", ms_monitor_name(g->mon), ms_strerror(rc));
  free(hm);
  return rc;
}

static int gen_progs(struct ms_cuda_mon *mon, struct gen *g, const struct ms_attach_opts *o,
                     uint32_t att_id, struct ms_textbuf *log) {
  const struct ms_bpf_object *obj = ms_monitor_object(g->mon);
  struct msd_prog *hp = (struct msd_prog *)calloc((size_t)g->n_progs, sizeof *hp);
  struct msd_cov *hc = (struct msd_cov *)calloc((size_t)mon->n_sms, sizeof *hc);
  int rc = hp && hc ? 0 : -ENOMEM;
  for (int p = 0; !rc && p < g->n_progs; p++) {
    size_t n;
    const struct ms_bpf_insn *in = ms_bpf_prog_insns(ms_bpf_object_prog(obj, (size_t)p), &n);
    g->hook[p] = ms_monitor_prog_hook(g->mon, p, &g->type[p]);
    if ((rc = dalloc(mon, (void **)&g->dinsns[p], n * sizeof *in, log))) break;
    if ((rc = h2d(mon, g->dinsns[p], in, n * sizeof *in, log))) break;
    hp[p].insns = g->dinsns[p];
    hp[p].n_insns = (uint32_t)n;
    hp[p].n_maps = (uint32_t)g->n_maps;
    hp[p].maps = g->dmaps;
    hp[p].type = g->type[p];
    hp[p].hook = g->hook[p];
  }
  if (!rc) rc = dalloc(mon, (void **)&g->dprogs, (size_t)g->n_progs * sizeof *hp, log);
  if (!rc) rc = h2d(mon, g->dprogs, hp, (size_t)g->n_progs * sizeof *hp, log);
  for (int s = 0; !rc && s < mon->n_sms; s++) hc[s].first_step = UINT64_MAX;
  if (!rc) rc = dalloc(mon, (void **)&g->dcov, (size_t)mon->n_sms * sizeof *hc, log);
  if (!rc) rc = h2d(mon, g->dcov, hc, (size_t)mon->n_sms * sizeof *hc, log);
  struct msd_gen hg;
  memset(&hg, 0, sizeof hg);
  hg.att_id = att_id;
  hg.generation = g->generation;
  hg.max_per_step = o->max_per_step;
  hg.sample_every = o->sample_every;
  hg.ring_budget = o->ringbuf_bytes;
  hg.cov = g->dcov;
  if (!rc) rc = dalloc(mon, (void **)&g->dgen, sizeof hg, log);
  if (!rc) rc = h2d(mon, g->dgen, &hg, sizeof hg, log);
  if (!rc) rc = sync_stream(mon, log);
  free(hp);
  free(hc);
  return rc;
}

/* shared: the host maps to use (n_shared of them), NULL: its own. */
static struct gen *gen_new(struct ms_cuda_mon *mon, struct ms_monitor *m, struct ms_bpf_map **shared,
                           int n_shared, const struct ms_attach_opts *o, uint32_t att_id, uint32_t generation,
                           struct ms_textbuf *log, int *rc) {
  if ((*rc = check_supported(m, log))) return NULL;
  if (shared && n_shared != (int)ms_bpf_object_map_count(ms_monitor_object(m))) {
    ms_textbuf_printf(log, "%s: %d host maps for %zu\n", ms_monitor_name(m), n_shared,
                      ms_bpf_object_map_count(ms_monitor_object(m)));
    *rc = -EINVAL;
    return NULL;
  }
  struct gen *g = (struct gen *)calloc(1, sizeof *g);
  *rc = -ENOMEM;
  if (!g) return NULL;
  g->mon = m;
  g->borrowed = shared != NULL;
  g->generation = generation;
  g->n_maps = (int)ms_bpf_object_map_count(ms_monitor_object(m));
  g->n_progs = ms_monitor_prog_count(m);
  g->maps = (struct ms_bpf_map **)calloc((size_t)g->n_maps + 1, sizeof *g->maps);
  g->hdr = (struct ms_bpf_map_shm *)calloc((size_t)g->n_maps + 1, sizeof *g->hdr);
  g->img = (uint8_t **)calloc((size_t)g->n_maps + 1, sizeof *g->img);
  g->dimg = (uint8_t **)calloc((size_t)g->n_maps + 1, sizeof *g->dimg);
  g->dinsns = (struct ms_bpf_insn **)calloc((size_t)g->n_progs + 1, sizeof *g->dinsns);
  g->hook = (int *)calloc((size_t)g->n_progs + 1, sizeof *g->hook);
  g->type = (int *)calloc((size_t)g->n_progs + 1, sizeof *g->type);
  g->on_device = 1;
  if (g->maps && g->hdr && g->img && g->dimg && g->dinsns && g->hook && g->type &&
      !(*rc = gen_maps(mon, g, shared, log)) && !(*rc = gen_progs(mon, g, o, att_id, log))) {
    g->t_start = ms_now_ns();
    return g;
  }
  gen_free(mon, g, 1); /* the caller keeps m */
  sync_stream(mon, NULL);
  return NULL;
}

/* ---- publication and quiescence ------------------------------------------ */

/* Waits until every SM's quiescent word reached flip f; 0, or -MS_E_STALL
 * after the timeout. */
static int quiesce(struct ms_cuda_mon *mon, uint64_t f) {
  if (!mon_running(mon)) return 0;
  struct msd_qs *qs = (struct msd_qs *)malloc((size_t)mon->n_sms * sizeof *qs);
  if (!qs) return -ENOMEM;
  uint64_t t0 = ms_now_ns();
  int rc = -MS_E_STALL;
  while (mon_running(mon) && ms_now_ns() - t0 < QUIESCE_TIMEOUT_NS) {
    if (d2h(mon, qs, mon->dqs, (size_t)mon->n_sms * sizeof *qs) || sync_stream(mon, NULL)) {
      rc = -EIO;
      break;
    }
    int s = 0;
    while (s < mon->n_sms && qs[s].v >= f) s++;
    /* The kernel's CTAs return when it exits without passing another quiescent
     * point: until the host's wait notices (set_running 0), their words stay
     * behind f for good. A completed stream means no SM holds anything. */
    cudaStream_t ks = __atomic_load_n(&mon->ks, __ATOMIC_ACQUIRE);
    if (s == mon->n_sms || (ks && cudaStreamQuery(ks) == cudaSuccess)) {
      rc = 0;
      break;
    }
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  if (!mon_running(mon)) rc = 0;
  free(qs);
  return rc;
}

/* Every hook's set without drop's entries and with add's programs; publishes
 * the sets, bumps flip and waits for quiescence. *quiet says whether what was
 * unpublished may be freed. */
static int publish(struct ms_cuda_mon *mon, const struct gen *drop, const struct gen *add, int *quiet,
                   struct ms_textbuf *log) {
  struct msd_set *next = (struct msd_set *)calloc(MS_HOOK_COUNT, sizeof *next);
  struct msd_set *dnext[MS_HOOK_COUNT], *dold[MS_HOOK_COUNT];
  memset(dnext, 0, sizeof dnext);
  int rc = next ? 0 : -ENOMEM;
  *quiet = 0;
  for (int h = 0; !rc && h < MS_HOOK_COUNT; h++) {
    struct msd_set *s = &next[h], *cur = &mon->hset[h];
    for (uint32_t i = 0; i < cur->n; i++)
      if (!drop || cur->e[i].gen != drop->dgen) s->e[s->n++] = cur->e[i];
    for (int p = 0; add && p < add->n_progs; p++) {
      if (add->hook[p] != h) continue;
      if (s->n == MSD_SET_MAX) {
        ms_textbuf_printf(log, "%s: hook %d would hold more than %d programs\n", ms_monitor_name(add->mon), h,
                          MSD_SET_MAX);
        rc = -MS_E_LIMIT;
        break;
      }
      s->e[s->n].prog = &add->dprogs[p];
      s->e[s->n].type = add->type[p];
      s->e[s->n++].gen = add->dgen;
    }
  }
  for (int h = 0; !rc && h < MS_HOOK_COUNT; h++) {
    next[h].n_hint = 0;
    for (uint32_t i = 0; i < next[h].n; i++) next[h].n_hint += next[h].e[i].type == MS_PROG_SCHED_HINT;
    if (!next[h].n) continue;
    if ((rc = dalloc(mon, (void **)&dnext[h], sizeof next[h], log))) break;
    rc = h2d(mon, dnext[h], &next[h], sizeof next[h], log);
  }
  if (!rc) rc = sync_stream(mon, log); /* the sets are in place before any pointer to them */
  if (rc) {
    for (int h = 0; h < MS_HOOK_COUNT; h++) dfree(mon, dnext[h]);
    sync_stream(mon, NULL);
    free(next);
    return rc;
  }
  /* the flip: set pointers (aligned 8-byte words), then the counter */
  struct msd_hooks hh;
  for (int h = 0; h < MS_HOOK_COUNT; h++) {
    hh.set[h] = dnext[h];
    dold[h] = mon->dset[h];
  }
  hh.flip = mon->flip + 1;
  rc = h2d(mon, mon->dev->set, hh.set, sizeof hh.set, log);
  if (!rc) rc = sync_stream(mon, log);
  if (!rc) rc = h2d(mon, &mon->dev->flip, &hh.flip, sizeof hh.flip, log);
  if (!rc) rc = sync_stream(mon, log);
  if (rc) { /* the device's view is unknown: keep everything */
    for (int h = 0; h < MS_HOOK_COUNT; h++) keep(mon, dnext[h]);
    free(next);
    return rc;
  }
  mon->flip++;
  memcpy(mon->hset, next, MS_HOOK_COUNT * sizeof *next);
  memcpy(mon->dset, dnext, sizeof dnext);
  free(next);
  int q = quiesce(mon, mon->flip);
  *quiet = q == 0;
  if (q) ms_textbuf_printf(log, "cuda monitors: an SM did not pass a quiescent point within %llu ms; the "
                           "unpublished programs are kept until the table is freed\n",
                           (unsigned long long)(QUIESCE_TIMEOUT_NS / 1000000));
  for (int h = 0; h < MS_HOOK_COUNT; h++) *quiet ? dfree(mon, dold[h]) : keep(mon, dold[h]);
  sync_stream(mon, NULL);
  return 0;
}

/* ---- read-back ----------------------------------------------------------- */

static void cov_sum(const struct msd_cov *c, int n_sms, const struct gen *g, struct ms_coverage *out) {
  memset(out, 0, sizeof *out);
  out->generation = g->generation;
  out->first_step = UINT64_MAX;
  for (int s = 0; s < n_sms; s++) {
    out->eligible += c[s].eligible;
    out->executed += c[s].executed;
    out->throttled += c[s].throttled;
    out->lost += c[s].lost;
    out->failed += c[s].failed;
    if (c[s].first_step < out->first_step) out->first_step = c[s].first_step;
    if (c[s].first_step != UINT64_MAX && c[s].last_step > out->last_step) out->last_step = c[s].last_step;
  }
  if (out->first_step == UINT64_MAX) out->first_step = 0;
  out->t_start = g->t_start;
  out->t_end = g->t_end;
}

static int gen_coverage(struct ms_cuda_mon *mon, const struct gen *g, struct ms_coverage *out) {
  if (!g->on_device) {
    *out = g->final_cov;
    out->t_end = g->t_end;
    return 0;
  }
  struct msd_cov *c = (struct msd_cov *)malloc((size_t)mon->n_sms * sizeof *c);
  int rc = c ? d2h(mon, c, g->dcov, (size_t)mon->n_sms * sizeof *c) : -ENOMEM;
  if (!rc) rc = sync_stream(mon, NULL);
  if (!rc) cov_sum(c, mon->n_sms, g, out);
  free(c);
  return rc;
}

/* A ring buffer's records: the host consumer's position first, so producers
 * may reuse the space; then the header (lost), the producer position, then
 * the records (the ring's own protocol says which are complete). */
static int ring_sync(struct ms_cuda_mon *mon, struct gen *g, int i) {
  const struct ms_bpf_map_shm *h = &g->hdr[i];
  uint8_t *img = g->img[i], *d = g->dimg[i];
  int rc = h2d(mon, d + h->ring_cons_off, img + h->ring_cons_off, 8, NULL);
  if (!rc) rc = d2h(mon, img, d, sizeof *h);
  if (!rc) rc = d2h(mon, img + h->ring_prod_off, d + h->ring_prod_off, h->ring_data_off - h->ring_prod_off);
  if (!rc) rc = d2h(mon, img + h->ring_data_off, d + h->ring_data_off, h->ring_size);
  return rc;
}

static int all_even(const struct msd_qs *q, int n) {
  for (int s = 0; s < n; s++)
    if (q[s].wseq & 1) return 0;
  return 1;
}

static int same_words(const struct msd_qs *a, const struct msd_qs *b, int n) {
  for (int s = 0; s < n; s++)
    if (a[s].wseq != b[s].wseq) return 0;
  return 1;
}

/* The SMs' write words once none is inside a firing (hold is set, so new
 * firings wait): 1, or 0 when some SM stayed inside past SNAP_DRAIN_NS. */
static int drained_words(struct ms_cuda_mon *mon, struct msd_qs *q) {
  uint64_t t0 = ms_now_ns();
  for (;;) {
    if (d2h(mon, q, mon->dqs, (size_t)mon->n_sms * sizeof *q) || sync_stream(mon, NULL)) return 0;
    if (all_even(q, mon->n_sms)) return 1;
    if (ms_now_ns() - t0 > SNAP_DRAIN_NS) return 0;
  }
}

/* The generation's maps other than ring buffers, copied while the kernel may
 * write them: into a buffer first, kept only when no SM wrote during the
 * copy (bpf_dev.cuh's DESIGN, snapshots), so readers of the memfds never see
 * a torn entry. 0, or -EAGAIN after SNAP_TRIES copies that each saw a write
 * (the memfds keep the last whole copy). */
static int snap_maps(struct ms_cuda_mon *mon, struct gen *g) {
  static const uint32_t one = 1, zero = 0;
  size_t total = 0;
  for (int i = 0; i < g->n_maps; i++)
    if (g->hdr[i].type != MS_BPF_MAP_RINGBUF) total += g->hdr[i].total_size;
  if (!total) return 0;
  uint8_t *buf = (uint8_t *)malloc(total);
  struct msd_qs *q1 = (struct msd_qs *)malloc(2 * (size_t)mon->n_sms * sizeof *q1), *q2 = q1 + mon->n_sms;
  int rc = buf && q1 ? -EAGAIN : -ENOMEM;
  for (int t = 0; rc == -EAGAIN && t < SNAP_TRIES; t++) {
    int err = h2d(mon, &mon->dev->hold, &one, sizeof one, NULL);
    int drained = !err && drained_words(mon, q1);
    size_t at = 0;
    for (int i = 0; drained && !err && i < g->n_maps; i++)
      if (g->hdr[i].type != MS_BPF_MAP_RINGBUF) {
        err = d2h(mon, buf + at, g->dimg[i], g->hdr[i].total_size);
        at += g->hdr[i].total_size;
      }
    if (drained && !err) err = d2h(mon, q2, mon->dqs, (size_t)mon->n_sms * sizeof *q2);
    if (!err) err = h2d(mon, &mon->dev->hold, &zero, sizeof zero, NULL);
    if (!err) err = sync_stream(mon, NULL);
    if (err)
      rc = err;
    else if (drained && same_words(q1, q2, mon->n_sms))
      rc = 0;
  }
  for (size_t i = 0, at = 0; !rc && i < (size_t)g->n_maps; i++)
    if (g->hdr[i].type != MS_BPF_MAP_RINGBUF) {
      memcpy(g->img[i], buf + at, g->hdr[i].total_size);
      at += g->hdr[i].total_size;
    }
  if (rc == -EAGAIN) mon->torn++;
  free(buf);
  free(q1);
  return rc;
}

/* Copies g's device maps into its host maps. consistent: while the kernel
 * may run g's programs (snap_maps); else g is unpublished and quiet (or the
 * kernel is gone), and a plain copy is exact. */
static int gen_sync_maps(struct ms_cuda_mon *mon, struct gen *g, int consistent) {
  int rc = 0;
  if (!g->on_device) return 0;
  if (consistent && mon_running(mon)) {
    rc = snap_maps(mon, g);
  } else {
    for (int i = 0; !rc && i < g->n_maps; i++)
      if (g->hdr[i].type != MS_BPF_MAP_RINGBUF) rc = d2h(mon, g->img[i], g->dimg[i], g->hdr[i].total_size);
  }
  for (int i = 0; !rc && i < g->n_maps; i++)
    if (g->hdr[i].type == MS_BPF_MAP_RINGBUF) rc = ring_sync(mon, g, i);
  if (!rc) rc = sync_stream(mon, NULL);
  return rc;
}

/* After g was unpublished and quiescence: final maps and coverage to the
 * host, then its device memory goes (or is kept when not quiet). */
static void gen_retire(struct ms_cuda_mon *mon, struct gen *g, int quiet) {
  g->t_end = ms_now_ns();
  gen_sync_maps(mon, g, !quiet);
  if (gen_coverage(mon, g, &g->final_cov) == 0) g->final_cov.t_end = g->t_end;
  gen_free_device(mon, g, quiet);
  sync_stream(mon, NULL);
}

/* A retired generation on borrowed maps: its final contents are in them, so
 * this side's mappings of them go (the owner may free the maps before us). */
static void gen_unmap_borrowed(struct gen *g) {
  for (int i = 0; g->borrowed && g->img && i < g->n_maps; i++)
    if (g->img[i]) {
      munmap(g->img[i], g->hdr[i].total_size);
      g->img[i] = NULL;
    }
}

/* ---- attachments --------------------------------------------------------- */

static struct att *find(struct ms_cuda_mon *mon, int id) {
  return id >= 1 && id <= mon->n_atts ? mon->atts[id - 1] : NULL;
}

static int attach(struct ms_cuda_mon *mon, struct ms_monitor *m, struct ms_bpf_map **shared, int n_shared,
                  const struct ms_attach_opts *o, struct ms_textbuf *log) {
  struct att *a = (struct att *)calloc(1, sizeof *a);
  if (!a) return -ENOMEM;
  if (o) memcpy(&a->opts, o, o->sz < sizeof a->opts ? o->sz : sizeof a->opts);
  a->opts.sz = sizeof a->opts;
  pthread_mutex_lock(&mon->mu);
  int rc = -ENOMEM, quiet;
  if (mon->n_atts == mon->cap_atts) {
    int cap = mon->cap_atts ? 2 * mon->cap_atts : 8;
    struct att **n = (struct att **)realloc(mon->atts, (size_t)cap * sizeof *n);
    if (!n) goto fail;
    mon->atts = n;
    mon->cap_atts = cap;
  }
  a->id = mon->n_atts + 1;
  a->cur = gen_new(mon, m, shared, n_shared, &a->opts, (uint32_t)a->id, 1, log, &rc);
  if (!a->cur) goto fail;
  if ((rc = publish(mon, NULL, a->cur, &quiet, log))) {
    gen_free(mon, a->cur, 1);
    sync_stream(mon, NULL);
    goto fail;
  }
  a->attached = 1;
  mon->atts[mon->n_atts++] = a;
  pthread_mutex_unlock(&mon->mu);
  return a->id;
fail:
  pthread_mutex_unlock(&mon->mu);
  free(a);
  return rc;
}

extern "C" int ms_cuda_mon_attach(struct ms_cuda_mon *mon, struct ms_monitor *m, const struct ms_attach_opts *o,
                                  struct ms_textbuf *log) {
  return attach(mon, m, NULL, 0, o, log);
}

extern "C" int ms_cuda_mon_attach_shared(struct ms_cuda_mon *mon, struct ms_monitor *m, struct ms_bpf_map **maps,
                                         int n_maps, const struct ms_attach_opts *o, struct ms_textbuf *log) {
  return attach(mon, m, maps, n_maps, o, log);
}

static int replace(struct ms_cuda_mon *mon, int id, struct ms_monitor *m, struct ms_bpf_map **shared, int n_shared,
                   const struct ms_attach_opts *o, struct ms_textbuf *log) {
  pthread_mutex_lock(&mon->mu);
  struct att *a = find(mon, id);
  int rc = -ENOENT, quiet;
  struct gen *g = NULL;
  if (!a || !a->attached) goto out;
  if (o) {
    memcpy(&a->opts, o, o->sz < sizeof a->opts ? o->sz : sizeof a->opts);
    a->opts.sz = sizeof a->opts;
  }
  if (!(g = gen_new(mon, m, shared, n_shared, &a->opts, (uint32_t)a->id, a->cur->generation + 1, log, &rc)))
    goto out;
  if ((rc = publish(mon, a->cur, g, &quiet, log))) {
    gen_free(mon, g, 1);
    sync_stream(mon, NULL);
    goto out;
  }
  gen_retire(mon, a->cur, quiet);
  gen_unmap_borrowed(a->cur);
  g->prev = a->cur;
  a->cur = g;
out:
  pthread_mutex_unlock(&mon->mu);
  return rc;
}

extern "C" int ms_cuda_mon_replace(struct ms_cuda_mon *mon, int id, struct ms_monitor *m, struct ms_textbuf *log) {
  return replace(mon, id, m, NULL, 0, NULL, log);
}

extern "C" int ms_cuda_mon_replace_shared(struct ms_cuda_mon *mon, int id, struct ms_monitor *m,
                                          struct ms_bpf_map **maps, int n_maps, const struct ms_attach_opts *o,
                                          struct ms_textbuf *log) {
  return replace(mon, id, m, maps, n_maps, o, log);
}

extern "C" int ms_cuda_mon_detach(struct ms_cuda_mon *mon, int id) {
  pthread_mutex_lock(&mon->mu);
  struct att *a = find(mon, id);
  int rc = -ENOENT, quiet;
  if (a && a->attached && !(rc = publish(mon, a->cur, NULL, &quiet, NULL))) {
    a->attached = 0;
    gen_retire(mon, a->cur, quiet);
    gen_unmap_borrowed(a->cur);
  }
  pthread_mutex_unlock(&mon->mu);
  return rc;
}

extern "C" int ms_cuda_mon_coverage(struct ms_cuda_mon *mon, int id, struct ms_coverage *out) {
  pthread_mutex_lock(&mon->mu);
  struct att *a = find(mon, id);
  int rc = a ? gen_coverage(mon, a->cur, out) : -ENOENT;
  pthread_mutex_unlock(&mon->mu);
  return rc;
}

extern "C" int ms_cuda_mon_coverage_of(struct ms_cuda_mon *mon, int id, uint32_t generation,
                                       struct ms_coverage *out) {
  pthread_mutex_lock(&mon->mu);
  struct att *a = find(mon, id);
  int rc = -ENOENT;
  for (struct gen *g = a ? a->cur : NULL; g; g = g->prev)
    if (g->generation == generation) {
      rc = gen_coverage(mon, g, out);
      break;
    }
  pthread_mutex_unlock(&mon->mu);
  return rc;
}

extern "C" int ms_cuda_mon_forget(struct ms_cuda_mon *mon, int id) {
  pthread_mutex_lock(&mon->mu);
  struct att *a = find(mon, id);
  int rc = !a ? -ENOENT : a->attached ? -MS_E_STATE : 0;
  if (!rc) {
    gen_free(mon, a->cur, 0);  /* borrowed monitors and maps stay the owner's */
    sync_stream(mon, NULL);
    free(a);
    mon->atts[id - 1] = NULL;
  }
  pthread_mutex_unlock(&mon->mu);
  return rc;
}

extern "C" int ms_cuda_mon_sync_maps(struct ms_cuda_mon *mon, int id) {
  pthread_mutex_lock(&mon->mu);
  struct att *a = find(mon, id);
  int rc = a ? gen_sync_maps(mon, a->cur, 1) : -ENOENT;
  pthread_mutex_unlock(&mon->mu);
  return rc;
}

extern "C" int ms_cuda_mon_sync_maps_try(struct ms_cuda_mon *mon, int id) {
  if (pthread_mutex_trylock(&mon->mu)) return -EBUSY;
  struct att *a = find(mon, id);
  int rc = a ? gen_sync_maps(mon, a->cur, 1) : -ENOENT;
  pthread_mutex_unlock(&mon->mu);
  return rc;
}

extern "C" uint64_t ms_cuda_mon_torn(struct ms_cuda_mon *mon) {
  pthread_mutex_lock(&mon->mu);
  uint64_t n = mon->torn;
  pthread_mutex_unlock(&mon->mu);
  return n;
}

extern "C" int ms_cuda_mon_maps(struct ms_cuda_mon *mon, int id, struct ms_bpf_map ***maps, int *n) {
  pthread_mutex_lock(&mon->mu);
  struct att *a = find(mon, id);
  if (a) {
    *maps = a->cur->maps;
    *n = a->cur->n_maps;
  }
  pthread_mutex_unlock(&mon->mu);
  return a ? 0 : -ENOENT;
}

extern "C" const char *ms_cuda_mon_name(struct ms_cuda_mon *mon, int id) {
  struct att *a = find(mon, id);
  return a ? ms_monitor_name(a->cur->mon) : NULL;
}

extern "C" void ms_cuda_mon_free(struct ms_cuda_mon *mon) {
  if (!mon) return;
  for (int i = 0; i < mon->n_atts; i++) {
    if (!mon->atts[i]) continue;  /* forgotten */
    gen_free(mon, mon->atts[i]->cur, 0);
    free(mon->atts[i]);
  }
  if (mon->s) {
    cudaStreamSynchronize(mon->s);
    cudaStreamDestroy(mon->s);
  }
  if (mon->ar.base) cudaFree(mon->ar.base);  /* the kernel is not running (monitors.h) */
  arena_release(&mon->ar);
  free(mon->atts);
  free(mon->hset);
  pthread_mutex_destroy(&mon->mu);
  free(mon);
}
