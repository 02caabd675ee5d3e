// SPDX-License-Identifier: MIT
// Verifier test monitor: a per-class log2 histogram of task time on task_end,
// in a per-worker array keyed by class * 64 + bucket, with the bounds checks
// a careful author writes (class below the table, bucket clamped to 63).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#define CLASSES 256
#define BUCKETS 64

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, CLASSES * BUCKETS);
  __type(key, __u32);
  __type(value, __u64);
} hist SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_end")
int on_end(struct ms_hook_ctx *ctx) {
  __u32 cls = ctx->task_class;
  if (cls >= CLASSES) return 0;
  __u64 d = ctx->t_end > ctx->t_begin ? ctx->t_end - ctx->t_begin : 0;
  __u64 b = ms_log2(d);
  if (b > BUCKETS - 1) b = BUCKETS - 1;
  __u32 key = cls * BUCKETS + (__u32)b;
  __u64 *n = bpf_map_lookup_elem(&hist, &key);
  if (!n) return 0;
  *n += 1;
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
