// SPDX-License-Identifier: MIT
// Queue pressure: how often each queue (JIT dispatch, request mailbox) crossed its
// declared threshold, and the deepest it was seen.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct pressure {
  __u64 crossings;
  __u64 max_depth;
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 2);
  __type(key, __u32);
  __type(value, struct pressure);
} pressure_by_queue SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 4096);
} pressure_events SEC(".maps");

struct pressure_event {
  __u64 step;
  __u32 queue;
  __u32 depth;
};

/* in the BTF for `megascope records` (see step_trace.bpf.c) */
const volatile struct pressure_event pressure_events_record SEC("megascope_types");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/queue_pressure")
int on_pressure(struct ms_hook_ctx *ctx) {
  __u32 q = ctx->queue_kind;
  struct pressure *p = bpf_map_lookup_elem(&pressure_by_queue, &q);
  if (!p) return 0;
  p->crossings += 1;
  if (ctx->queue_depth > p->max_depth) p->max_depth = ctx->queue_depth;
  struct pressure_event ev = {.step = ctx->step, .queue = q, .depth = ctx->queue_depth};
  bpf_ringbuf_output(&pressure_events, &ev, sizeof ev, 0);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
