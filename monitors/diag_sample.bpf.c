// SPDX-License-Identifier: MIT
// Fixed-rate sampling of task events, the generic baseline of the counterexample
// benchmark (docs/benchmark.md): every task end it is run for becomes one
// fixed-format record in a ring buffer. The rate is the attachment's 1-in-N
// sampling (keyed on the task generation) and the byte budget its ring-buffer
// budget; the record does not depend on the question asked.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

/* 32 bytes, the same record the task trace is charged for: the task (step and
 * index: its class, kernel, tile and event follow from the plan of its bucket),
 * when it ended, how long it ran and queued, where, and for which request. */
struct task_record {
  __u64 task_gen;
  __u64 t_end;
  __u32 ns;         /* t_end - t_begin */
  __u32 queue_ns;   /* t_begin - t_ready */
  __u16 worker;
  __u16 req_slot;   /* 0xffff: none */
  __u16 bucket;
  __u16 pad;
};

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 16 << 20);
} task_samples SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_end")
int on_end(struct ms_hook_ctx *ctx) {
  struct task_record *r = bpf_ringbuf_reserve(&task_samples, sizeof *r, 0);
  if (!r) return 0;
  __u64 b = ctx->t_begin, q = b > ctx->t_ready ? b - ctx->t_ready : 0;
  r->task_gen = ctx->task_gen;
  r->t_end = ctx->t_end;
  r->ns = (__u32)(ctx->t_end - b);
  r->queue_ns = (__u32)q;
  r->worker = (__u16)ctx->worker;
  r->req_slot = ctx->req_slot == MS_HOOK_NONE32 ? 0xffff : (__u16)ctx->req_slot;
  r->bucket = (__u16)ctx->bucket;
  r->pad = 0;
  bpf_ringbuf_submit(r, 0);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
