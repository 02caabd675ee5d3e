// SPDX-License-Identifier: MIT
// Ready-to-begin queueing per task class: a log2 histogram of (t_begin - t_ready)
// in ns, the time a task could have run but had not started.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#define MAX_CLASSES 512

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, MAX_CLASSES * MS_HIST_BUCKETS);
  __type(key, __u32);
  __type(value, __u64);
} hist_class_queue_ns SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_begin")
int on_begin(struct ms_hook_ctx *ctx) {
  __u32 cls = ctx->task_class;
  __u64 ready = ctx->t_ready, begin = ctx->t_begin;
  if (cls >= MAX_CLASSES) return 0;
  __u32 key = cls * MS_HIST_BUCKETS + (__u32)ms_log2(begin > ready ? begin - ready : 0);
  __u64 *n = bpf_map_lookup_elem(&hist_class_queue_ns, &key);
  if (n) *n += 1;
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
