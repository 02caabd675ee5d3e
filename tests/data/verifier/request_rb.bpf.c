// SPDX-License-Identifier: MIT
// Verifier test monitor: one ring buffer record per request event, reserved,
// filled from the context, submitted (or discarded for admissions).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct req_event {
  __u64 now_ns;
  __u32 slot, gen, phase, token;
  __u32 ctx_len, worker;
};

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 16);
} events SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/request")
int on_request(struct ms_hook_ctx *ctx) {
  struct req_event *e = bpf_ringbuf_reserve(&events, sizeof *e, 0);
  if (!e) return 0;
  e->now_ns = ctx->now_ns;
  e->slot = ctx->req_slot;
  e->gen = ctx->req_gen;
  e->phase = ctx->phase;
  e->token = ctx->token;
  e->ctx_len = ctx->ctx_len;
  e->worker = ctx->worker;
  if (ctx->phase == MS_REQ_ADMITTED) {
    bpf_ringbuf_discard(e, 0);
    return 0;
  }
  bpf_ringbuf_submit(e, 0);
  return 0;
}

/* The output form: a copy from the stack. */
SEC("megascope/observe/step")
int on_step(struct ms_hook_ctx *ctx) {
  struct { __u64 step; __u32 batch, phase; } rec = {ctx->step, ctx->batch_size, ctx->phase};
  bpf_ringbuf_output(&events, &rec, sizeof rec, 0);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
