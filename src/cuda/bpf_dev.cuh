/* SPDX-License-Identifier: MIT */
/* Monitors on the device: the attach table the persistent kernel reads, the
 * programs and maps it runs (bpf_core.h), per-SM coverage and the quiescent
 * words that let the host free what it unpublished. Private to src/cuda; the
 * host side that builds all of this is monitors.cu.
 *
 * DESIGN
 * Who runs what. One thread (thread 0) of each CTA of the persistent kernel
 * fires hooks (msd_hook_fire, msd_hook_sched_hint) for its SM index `sm`
 * (0..n_sms-1, one writer per index) and calls msd_hooks_quiescent between
 * tasks and while idle. The host (monitors.cu, one control thread) attaches,
 * replaces and detaches with copies on its own non-blocking stream while the
 * kernel runs.
 * Publication. Each hook has an immutable set of entries (program slot +
 * generation) in device memory, built and copied before its pointer is
 * published; the host then copies the new set pointers into set[] (aligned
 * 8-byte words) and afterwards bumps `flip`. A site costs one relaxed gpu-scope
 * load of set[hook] and a branch when nothing is attached; a firing loads the
 * pointer with acquire and uses that one set to its end.
 * Reclamation (QSBR). msd_hooks_quiescent stores, in the SM's own word, the
 * `flip` it loads (acquire), with release when it changed: an SM that stored F
 * holds no set older than flip F, and its accesses to older ones came first.
 * The host frees an unpublished set, its programs and maps only when every
 * SM's word has reached the flip that unpublished them (or the kernel is not
 * running).
 * Coverage. Each generation has per-SM counters written only by that SM's
 * firing thread (plain volatile stores) and summed by the host after a
 * device-to-host copy; a firing is counted by the generation of the set it
 * loaded, so old + new add up to what was eligible across a replace.
 * Snapshots. The host copies maps while programs write them; each SM's word
 * `wseq` (beside its quiescent word) is odd while that SM runs programs, so a
 * copy made between two reads of every SM's word, all even and unchanged, saw
 * no write (a seqlock with one writer per SM). While the host copies it sets
 * `hold`; a firing that finds it set waits for it to clear, at most
 * MSD_HOLD_NS, so a busy hook does not keep every copy torn (a firing that
 * starts anyway only makes that copy be retried). */
#ifndef MS_CUDA_BPF_DEV_CUH
#define MS_CUDA_BPF_DEV_CUH

#include <stdint.h>

#include "core/bpf_core.h"
#include "core/admit.h"
#include "megascope/hook.h"

#define MSD_SET_MAX 64          /* programs attached at one hook, all attachments together */
#define MSD_RUN_BUDGET MS_HOOK_RUN_BUDGET /* instructions per run, counted as the CPU engines count */
#define MSD_HOLD_NS 200000ull   /* a firing waits at most this long for the host's snapshot */

/* One SM's counters for one generation: 128 bytes so SMs never share a line. */
struct msd_cov {
  uint64_t eligible, executed, throttled, lost, failed;
  uint64_t first_step, last_step;   /* first_step starts at UINT64_MAX */
  uint64_t step_key, step_execs;    /* the per-step budget: step + 1 and runs in it */
  uint64_t pad[7];
};

/* A generation of an attachment: its options and coverage. */
struct msd_gen {
  uint32_t att_id, generation;
  uint32_t max_per_step, sample_every;
  uint64_t ring_budget;   /* ring buffer bytes per epoch, 0: no limit */
  uint64_t ring_bytes;    /* used so far (atomic) */
  struct msd_cov *cov;    /* [n_sms] */
};

/* A verified program in device memory. maps[i] is the object's map i (the lddw
 * imm the loader wrote); handles a program sees are &maps[i]. */
struct msd_prog {
  const struct ms_bpf_insn *insns;
  uint32_t n_insns, n_maps;
  const struct msd_map *maps;
  int32_t type, hook;     /* enum ms_prog_type, enum ms_hook_id */
};

struct msd_entry {
  const struct msd_prog *prog;
  struct msd_gen *gen;
  int32_t type, pad;      /* prog->type, read without following prog */
};

struct msd_set {
  uint32_t n, n_hint;     /* entries; of which sched_hint */
  struct msd_entry e[MSD_SET_MAX];
};

struct msd_qs {
  uint64_t v;             /* the flip this SM last saw between tasks */
  uint64_t wseq;          /* odd while this SM runs programs (the snapshots' seqlock) */
  uint64_t pad[14];
};

/* The attach table, in device memory; the kernel gets its address. */
struct msd_hooks {
  const struct msd_set *set[MS_HOOK_COUNT]; /* NULL: nothing attached */
  uint64_t flip;                            /* publications so far */
  uint32_t n_sms;
  uint32_t hold;                            /* host: a snapshot is being copied (see DESIGN) */
  struct msd_qs *qs;                        /* [n_sms] */
};

/* ---- the kernel's side -------------------------------------------------- */

static __device__ __forceinline__ const struct msd_set *msd_set_load(const struct msd_hooks *h, int hook,
                                                                     int acquire) {
#ifdef MSD_HOST_EMU /* the CPU run (cuda/host_emu.h): the same orders as C11 atomics */
  return __atomic_load_n(&h->set[hook], acquire ? __ATOMIC_ACQUIRE : __ATOMIC_RELAXED);
#else
  uint64_t v;
  if (acquire)
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(&h->set[hook]) : "memory");
  else
    asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(&h->set[hook]) : "memory");
  return (const struct msd_set *)(uintptr_t)v;
#endif
}

/* One load and a branch: whether anything is attached at hook. */
static __device__ __forceinline__ int msd_hook_armed(const struct msd_hooks *h, int hook) {
  return __builtin_expect(msd_set_load(h, hook, 0) != 0, 0);
}

/* Between tasks and while idle: this SM holds no set older than the current flip.
 * The store of a new flip is a release: this SM's reads of the sets it no longer
 * holds and its writes to their coverage and maps come before it, so the host,
 * once it sees the flip, reads final numbers and frees memory nobody touches.
 * The SM alone writes its word: unchanged, it is not stored again. */
static __device__ __forceinline__ void msd_hooks_quiescent(struct msd_hooks *h, int sm) {
#ifdef MSD_HOST_EMU
  uint64_t f = __atomic_load_n(&h->flip, __ATOMIC_ACQUIRE);
  if ((unsigned)sm < h->n_sms && __atomic_load_n(&h->qs[sm].v, __ATOMIC_RELAXED) != f)
    __atomic_store_n(&h->qs[sm].v, f, __ATOMIC_RELEASE);
#else
  uint64_t f, old;
  asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(f) : "l"(&h->flip) : "memory");
  if ((unsigned)sm >= h->n_sms) return;
  asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(old) : "l"(&h->qs[sm].v) : "memory");
  if (old != f) asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(&h->qs[sm].v), "l"(f) : "memory");
#endif
}

/* A firing's map writes happen between these two (the SM's seqlock, see
 * DESIGN): the odd word is ordered before the writes, the writes before the
 * even word. Waits first while the host holds the maps for a snapshot. */
static __device__ __forceinline__ uint64_t msd_hold_clock(void) {
#ifdef MSD_HOST_EMU
  return ms_now_ns();
#else
  return ms_at_clock_now();
#endif
}

static __device__ __forceinline__ void msd_wseq_enter(struct msd_hooks *h, int sm) {
  if (ms_at_ld_rlx32(&h->hold)) {  /* relaxed: a hint; the seqlock is what makes a copy trustworthy */
    uint64_t t0 = msd_hold_clock();
    while (ms_at_ld_rlx32(&h->hold) && msd_hold_clock() - t0 < MSD_HOLD_NS) ms_at_relax();
  }
  uint64_t *w = &h->qs[sm].wseq;
  ms_at_st_rlx64(w, ms_at_ld_rlx64(w) + 1);  /* this SM alone writes its word */
  ms_at_fence_acq_rel();
}

static __device__ __forceinline__ void msd_wseq_leave(struct msd_hooks *h, int sm) {
  uint64_t *w = &h->qs[sm].wseq;
  ms_at_st_rel64(w, ms_at_ld_rlx64(w) + 1);
}

/* Sampling keys and the per-step budget: core/admit.h, the CPU engines' own. */

static __device__ __forceinline__ void msd_count(uint64_t *c, uint64_t n) {
#ifdef MSD_HOST_EMU /* relaxed: the host's copy reads whole words */
  __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + n, __ATOMIC_RELAXED);
#else
  *(volatile uint64_t *)c = *(volatile uint64_t *)c + n; /* one writer: this SM's firing thread */
#endif
}

/* fire.c's run_entry: coverage, sampling, the per-step budget, the run.
 * Returns the sched_hint priority (r0 & 7) or -1. */
static __device__ __noinline__ int msd_run_entry(const struct msd_entry *e, const struct ms_hook_ctx *ctx,
                                                 int sm, uint64_t key) {
  struct msd_gen *g = e->gen;
  struct msd_cov *c = &g->cov[sm];
  volatile uint64_t *vc = (volatile uint64_t *)c;
  msd_count(&c->eligible, 1);
  if (vc[5] == UINT64_MAX) vc[5] = ctx->step; /* first_step */
  vc[6] = ctx->step;                          /* last_step */
  int admitted = ms_hook_sampled(key, g->att_id, g->sample_every) &&
                 ms_hook_step_admit(&c->step_key, &c->step_execs, ctx->step, g->max_per_step);
  if (!admitted) {
    msd_count(&c->throttled, 1);
    return -1;
  }
  const struct msd_prog *p = e->prog;
  struct msd_run in;
  msd_run_init(&in);
  in.insns = p->insns;
  in.n_insns = p->n_insns;
  in.maps = p->maps;
  in.n_maps = p->n_maps;
  in.ctx = ctx;
  in.ctx_size = sizeof *ctx;
  in.budget = MSD_RUN_BUDGET;
  in.worker = (uint32_t)sm;
  in.ring_bytes = &g->ring_bytes;
  in.ring_budget = g->ring_budget;
  struct msd_result res;
  int rc = msd_bpf_run(&in, &res);
  msd_count(&c->executed, 1);
  if (res.lost) msd_count(&c->lost, res.lost);
  if (rc) {
    msd_count(&c->failed, 1);
    return -1;
  }
  return p->type == MS_PROG_SCHED_HINT ? (int)(res.r0 & 7) : -1;
}

static __device__ __forceinline__ int msd_hook_run(struct msd_hooks *h, const struct ms_hook_ctx *ctx, int sm,
                                                   int type) {
  if (ctx->hook >= MS_HOOK_COUNT || (unsigned)sm >= h->n_sms) return -1;
  const struct msd_set *s = msd_set_load(h, (int)ctx->hook, 1);
  if (!s || (type == MS_PROG_SCHED_HINT && !s->n_hint)) return -1;
  uint64_t key = ms_hook_sample_key(ctx);
  int prio = -1;
  msd_wseq_enter(h, sm);
  for (uint32_t i = 0; i < s->n; i++) {
    if (s->e[i].type != type) continue;
    int p = msd_run_entry(&s->e[i], ctx, sm, key);
    if (p > prio) prio = p;
  }
  msd_wseq_leave(h, sm);
  return prio;
}

/* Runs the observe programs attached at ctx->hook for SM sm, counting coverage. */
static __device__ __forceinline__ void msd_hook_fire(struct msd_hooks *h, struct ms_hook_ctx *ctx, int sm) {
  msd_hook_run(h, ctx, sm, MS_PROG_OBSERVE);
}

/* task_ready: the sched_hint programs' largest priority 0..7, -1 when none ran. */
static __device__ __forceinline__ int msd_hook_sched_hint(struct msd_hooks *h, struct ms_hook_ctx *ctx, int sm) {
  return msd_hook_run(h, ctx, sm, MS_PROG_SCHED_HINT);
}

#endif
