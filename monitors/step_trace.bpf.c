// SPDX-License-Identifier: MIT
// Step trace: one ring-buffer record per step begin and end (step, rows, bucket,
// time); a record that does not fit is counted as lost in the coverage.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct step_event {
  __u64 step;
  __u64 now_ns;
  __u32 phase;
  __u32 rows;
  __u32 bucket;
  __u32 pad;
};

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 4096);
} step_events SEC(".maps");

/* The record type, named for the map (struct step_event for step_events), is
 * made part of the object's BTF by this global in a section nothing loads:
 * `megascope records` decodes the ring's records by it. */
const volatile struct step_event step_events_record SEC("megascope_types");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/step")
int on_step(struct ms_hook_ctx *ctx) {
  struct step_event *e = bpf_ringbuf_reserve(&step_events, sizeof *e, 0);
  if (!e) return 0;
  e->step = ctx->step;
  e->now_ns = ctx->now_ns;
  e->phase = ctx->phase;
  e->rows = ctx->batch_size;
  e->bucket = ctx->bucket;
  e->pad = 0;
  bpf_ringbuf_submit(e, 0);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
