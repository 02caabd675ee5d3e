// SPDX-License-Identifier: MIT
// A scheduling hint: attention tasks of long contexts are dispatched first (the
// JIT queue honours priorities 0-7); everything else keeps priority 0.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#define KERNEL_PAGED_ATTENTION 5

MS_HOOK_ABI_DECLARE();

SEC("megascope/sched_hint/task_ready")
int prio(struct ms_hook_ctx *ctx) {
  if (ctx->op != KERNEL_PAGED_ATTENTION) return 0;
  __u32 len = ctx->ctx_len;
  if (len >= 1024) return 7;
  if (len >= 256) return 5;
  return 3;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
