// SPDX-License-Identifier: MIT
// Verifier test monitor: a sched_hint program on task_ready returning the
// task's batch row modulo 8 as its priority.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

MS_HOOK_ABI_DECLARE();

SEC("megascope/sched_hint/task_ready")
int prio(struct ms_hook_ctx *ctx) {
  return ctx->tile_y & 7;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
