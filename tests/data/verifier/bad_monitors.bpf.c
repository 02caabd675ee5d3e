// SPDX-License-Identifier: MIT
// Verifier test monitors that must be rejected, one mistake each, written the
// way a monitor author might make it. The test verifies each program by name
// and checks the reason the verifier gives.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct pair {
  __u64 v[4];
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 8);
  __type(key, __u32);
  __type(value, struct pair);
} vals SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 4096);
} rb SEC(".maps");

MS_HOOK_ABI_DECLARE();

/* t_end is defined on task_end only. */
SEC("megascope/observe/task_begin")
int end_on_begin(struct ms_hook_ctx *ctx) {
  return ctx->t_end - ctx->t_begin > 1000;
}

/* The lookup may fail. */
SEC("megascope/observe/task_end")
int no_null_check(struct ms_hook_ctx *ctx) {
  __u32 k = ctx->worker & 7;
  struct pair *p = bpf_map_lookup_elem(&vals, &k);
  p->v[0] += 1;
  return 0;
}

/* Off by one: v[4] is past the value. */
SEC("megascope/observe/task_end")
int off_by_one(struct ms_hook_ctx *ctx) {
  __u32 k = 0, i = ctx->tile_x;
  struct pair *p = bpf_map_lookup_elem(&vals, &k);
  if (!p || i > 4) return 0;
  p->v[i] += 1;
  return 0;
}

/* A reservation kept on one path. */
SEC("megascope/observe/request")
int leaks_record(struct ms_hook_ctx *ctx) {
  __u64 *e = bpf_ringbuf_reserve(&rb, 8, 0);
  if (!e) return 0;
  *e = ctx->token;
  if (ctx->phase == MS_REQ_TOKEN) bpf_ringbuf_submit(e, 0);
  return 0;
}

/* Priorities are 0..7. */
SEC("megascope/sched_hint/task_ready")
int prio_too_big(struct ms_hook_ctx *ctx) {
  return ctx->tile_y & 15;
}

/* An address into a map a reader in another process sees. */
SEC("megascope/observe/task_end")
int stores_pointer(struct ms_hook_ctx *ctx) {
  __u32 k = 1;
  struct pair *p = bpf_map_lookup_elem(&vals, &k);
  if (p) p->v[1] = (__u64)ctx;
  return 0;
}

/* A sched_hint program returns a priority and nothing else: no map updates... */
SEC("megascope/sched_hint/task_ready")
int hint_updates(struct ms_hook_ctx *ctx) {
  __u32 k = 0;
  struct pair v = {{ctx->task_index}};
  bpf_map_update_elem(&vals, &k, &v, BPF_ANY);
  return 1;
}

/* ... no ring buffer output ... */
SEC("megascope/sched_hint/task_ready")
int hint_output(struct ms_hook_ctx *ctx) {
  __u64 t = ctx->task_index;
  bpf_ringbuf_output(&rb, &t, sizeof t, 0);
  return 1;
}

/* ... and no writes into a map value it looked up. */
SEC("megascope/sched_hint/task_ready")
int hint_writes(struct ms_hook_ctx *ctx) {
  __u32 k = 0;
  struct pair *p = bpf_map_lookup_elem(&vals, &k);
  if (!p) return 0;
  p->v[0]++;
  return p->v[1] & 7;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
