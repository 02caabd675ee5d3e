/* SPDX-License-Identifier: MIT */
/* The helper table and the standard helpers, with Linux's ids and meaning:
 * 1-3 map lookup/update/delete, 5 ktime_get_ns (the engine clock or the
 * run's own), 8 get_smp_processor_id (the worker), 130-133 ring buffer
 * output/reserve/submit/discard. Their prototypes are what a verifier reads.
 *
 * Every pointer a program hands a helper is checked against the run's regions
 * (ms_bpf_exec_mem) and every map handle against the maps bound to the run
 * (ms_bpf_exec_map): a bad one aborts the run, so an unverified program cannot
 * make a helper touch memory it could not touch itself. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bpf/bpf_internal.h"

#define MAP_KV_TYPES                                                            \
  (1u << MS_BPF_MAP_HASH | 1u << MS_BPF_MAP_ARRAY | 1u << MS_BPF_MAP_PERCPU_HASH | \
   1u << MS_BPF_MAP_PERCPU_ARRAY)
#define MAP_HASH_TYPES (1u << MS_BPF_MAP_HASH | 1u << MS_BPF_MAP_PERCPU_HASH)
#define MAP_RING_TYPES (1u << MS_BPF_MAP_RINGBUF)

static const struct ms_bpf_helper_proto std_protos[] = {
    {MS_BPF_FN_MAP_LOOKUP_ELEM, "map_lookup_elem", MS_BPF_RET_MAP_VALUE_OR_NULL,
     {MS_BPF_ARG_MAP, MS_BPF_ARG_MAP_KEY}, MAP_KV_TYPES},
    {MS_BPF_FN_MAP_UPDATE_ELEM, "map_update_elem", MS_BPF_RET_INTEGER,
     {MS_BPF_ARG_MAP, MS_BPF_ARG_MAP_KEY, MS_BPF_ARG_MAP_VALUE, MS_BPF_ARG_FLAGS}, MAP_KV_TYPES},
    {MS_BPF_FN_MAP_DELETE_ELEM, "map_delete_elem", MS_BPF_RET_INTEGER,
     {MS_BPF_ARG_MAP, MS_BPF_ARG_MAP_KEY}, MAP_HASH_TYPES},
    {MS_BPF_FN_KTIME_GET_NS, "ktime_get_ns", MS_BPF_RET_INTEGER, {0}, 0},
    {MS_BPF_FN_GET_SMP_PROCESSOR_ID, "get_smp_processor_id", MS_BPF_RET_INTEGER, {0}, 0},
    {MS_BPF_FN_RINGBUF_OUTPUT, "ringbuf_output", MS_BPF_RET_INTEGER,
     {MS_BPF_ARG_MAP, MS_BPF_ARG_MEM, MS_BPF_ARG_SIZE, MS_BPF_ARG_FLAGS}, MAP_RING_TYPES},
    {MS_BPF_FN_RINGBUF_RESERVE, "ringbuf_reserve", MS_BPF_RET_RINGBUF_REC_OR_NULL,
     {MS_BPF_ARG_MAP, MS_BPF_ARG_CONST_SIZE, MS_BPF_ARG_FLAGS}, MAP_RING_TYPES},
    {MS_BPF_FN_RINGBUF_SUBMIT, "ringbuf_submit", MS_BPF_RET_VOID,
     {MS_BPF_ARG_RINGBUF_REC, MS_BPF_ARG_FLAGS}, 0},
    {MS_BPF_FN_RINGBUF_DISCARD, "ringbuf_discard", MS_BPF_RET_VOID,
     {MS_BPF_ARG_RINGBUF_REC, MS_BPF_ARG_FLAGS}, 0},
};
#define N_STD (sizeof std_protos / sizeof std_protos[0])

const struct ms_bpf_helper_proto *ms_bpf_helper_proto_std(uint32_t id) {
  for (size_t i = 0; i < N_STD; i++)
    if (std_protos[i].id == id) return &std_protos[i];
  return NULL;
}

/* ---- the table ---------------------------------------------------------- */

struct ms_bpf_helpers *ms_bpf_helpers_new(void) { return calloc(1, sizeof(struct ms_bpf_helpers)); }

void ms_bpf_helpers_free(struct ms_bpf_helpers *h) { free(h); }

int ms_bpf_helpers_set(struct ms_bpf_helpers *h, const struct ms_bpf_helper_proto *proto,
                       ms_bpf_helper_fn fn) {
  if (!h || !proto || !fn) return -EINVAL;
  struct ms_bpf_helper_slot *s = (struct ms_bpf_helper_slot *)ms_bpf_helpers_slot(h, proto->id);
  if (!s) return -ERANGE;
  s->proto = *proto;
  s->fn = fn;
  return 0;
}

const struct ms_bpf_helper_proto *ms_bpf_helpers_proto(const struct ms_bpf_helpers *h, uint32_t id) {
  const struct ms_bpf_helper_slot *s = ms_bpf_helpers_slot(h, id);
  return s && s->fn ? &s->proto : NULL;
}

ms_bpf_helper_fn ms_bpf_helpers_fn(const struct ms_bpf_helpers *h, uint32_t id) {
  const struct ms_bpf_helper_slot *s = ms_bpf_helpers_slot(h, id);
  return s ? s->fn : NULL;
}

/* ---- argument checks ---------------------------------------------------- */

static struct ms_bpf_map *arg_map(struct ms_bpf_exec *x, uint64_t handle, uint32_t types) {
  struct ms_bpf_map *m = ms_bpf_exec_map(x, handle);
  if (!m) {
    ms_bpf_exec_abort(x, -EINVAL, "argument 1 (0x%llx) is not a map bound to this run",
                      (unsigned long long)handle);
    return NULL;
  }
  if (!(types & (1u << ms_bpf_map_info(m)->type))) {
    ms_bpf_exec_abort(x, -EINVAL, "map %s of type %u is not accepted here", ms_bpf_map_info(m)->name,
                      ms_bpf_map_info(m)->type);
    return NULL;
  }
  return m;
}

static void *arg_mem(struct ms_bpf_exec *x, int argno, uint64_t addr, uint64_t size) {
  void *p = ms_bpf_exec_mem(x, addr, size, 0);
  if (!p)
    ms_bpf_exec_abort(x, -EFAULT, "argument %d: %llu bytes at 0x%llx are outside allowed memory",
                      argno, (unsigned long long)size, (unsigned long long)addr);
  return p;
}

/* ---- map helpers -------------------------------------------------------- */

static uint64_t h_map_lookup(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                             uint64_t a4, uint64_t a5) {
  struct ms_bpf_map *m = arg_map(x, a1, MAP_KV_TYPES);
  const void *key = m ? arg_mem(x, 2, a2, ms_bpf_map_info(m)->key_size) : NULL;
  if (!key) return 0;
  return (uint64_t)(uintptr_t)ms_bpf_map_lookup(m, key, ms_bpf_exec_env(x)->worker);
}

int ms_bpf_helper_is_std_lookup(ms_bpf_helper_fn fn) { return fn == h_map_lookup; }

static uint64_t h_map_update(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                             uint64_t a4, uint64_t a5) {
  struct ms_bpf_map *m = arg_map(x, a1, MAP_KV_TYPES);
  const void *key = m ? arg_mem(x, 2, a2, ms_bpf_map_info(m)->key_size) : NULL;
  const void *value = key ? arg_mem(x, 3, a3, ms_bpf_map_info(m)->value_size) : NULL;
  if (!value) return 0;
  if (ms_bpf_map_info(m)->flags & MS_BPF_MAP_F_RDONLY_PROG) return (uint64_t)(int64_t)-EPERM;
  return (uint64_t)(int64_t)ms_bpf_map_update(m, key, value, a4, ms_bpf_exec_env(x)->worker);
}

static uint64_t h_map_delete(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                             uint64_t a4, uint64_t a5) {
  struct ms_bpf_map *m = arg_map(x, a1, MAP_HASH_TYPES);
  const void *key = m ? arg_mem(x, 2, a2, ms_bpf_map_info(m)->key_size) : NULL;
  if (!key) return 0;
  return (uint64_t)(int64_t)ms_bpf_map_delete(m, key);
}

/* ---- clock and worker --------------------------------------------------- */

static uint64_t h_ktime_get_ns(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                               uint64_t a4, uint64_t a5) {
  const struct ms_bpf_env *env = ms_bpf_exec_env(x);
  return env->clock ? env->clock(env->clock_user) : ms_now_ns();
}

static uint64_t h_worker(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3, uint64_t a4,
                         uint64_t a5) {
  return ms_bpf_exec_env(x)->worker;
}

/* ---- ring buffer -------------------------------------------------------- */

#define RB_FLAGS (MS_BPF_RB_NO_WAKEUP | MS_BPF_RB_FORCE_WAKEUP)

static uint64_t h_ringbuf_output(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                                 uint64_t a4, uint64_t a5) {
  struct ms_bpf_map *m = arg_map(x, a1, MAP_RING_TYPES);
  if (!m) return 0;
  if (a4 & ~(uint64_t)RB_FLAGS) return (uint64_t)(int64_t)-EINVAL;
  const void *data = arg_mem(x, 2, a2, a3);
  if (!data) return 0;
  return (uint64_t)(int64_t)ms_bpf_ringbuf_output_flags(m, data, a3, a4);
}

static uint64_t h_ringbuf_reserve(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                                  uint64_t a4, uint64_t a5) {
  struct ms_bpf_map *m = arg_map(x, a1, MAP_RING_TYPES);
  if (!m || a3) return 0; /* Linux: reserve takes no flags */
  void *rec = ms_bpf_ringbuf_reserve(m, a2);
  if (rec && ms_bpf_exec_record_add(x, m, rec)) {
    ms_bpf_ringbuf_discard(m, rec); /* more records open than a run may hold */
    rec = NULL;
  }
  return (uint64_t)(uintptr_t)rec;
}

static uint64_t release(struct ms_bpf_exec *x, uint64_t rec, int discard, uint64_t flags) {
  struct ms_bpf_map *m = ms_bpf_exec_record_take(x, (void *)(uintptr_t)rec);
  if (!m) {
    ms_bpf_exec_abort(x, -EINVAL, "0x%llx is not a ring buffer record this run reserved",
                      (unsigned long long)rec);
    return 0;
  }
  if (discard)
    ms_bpf_ringbuf_discard(m, (void *)(uintptr_t)rec);
  else
    ms_bpf_ringbuf_submit_flags(m, (void *)(uintptr_t)rec, flags);
  return 0;
}

static uint64_t h_ringbuf_submit(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                                 uint64_t a4, uint64_t a5) {
  return release(x, a1, 0, a2);  /* Linux: bpf_ringbuf_submit(data, flags) */
}

static uint64_t h_ringbuf_discard(struct ms_bpf_exec *x, uint64_t a1, uint64_t a2, uint64_t a3,
                                  uint64_t a4, uint64_t a5) {
  return release(x, a1, 1, 0);
}

int ms_bpf_helpers_add_std(struct ms_bpf_helpers *h) {
  static const ms_bpf_helper_fn fns[N_STD] = {
      h_map_lookup,     h_map_update,      h_map_delete,     h_ktime_get_ns,   h_worker,
      h_ringbuf_output, h_ringbuf_reserve, h_ringbuf_submit, h_ringbuf_discard,
  };
  for (size_t i = 0; i < N_STD; i++) {
    int err = ms_bpf_helpers_set(h, &std_protos[i], fns[i]);
    if (err) return err;
  }
  return 0;
}
