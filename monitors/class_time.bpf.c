// SPDX-License-Identifier: MIT
// Per-class task time: a log2 histogram of (t_end - t_begin) in ns for every task
// class, and how many tasks of each class began. Attaches to task_begin and task_end.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#define MAX_CLASSES 512

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, MAX_CLASSES * MS_HIST_BUCKETS);
  __type(key, __u32);
  __type(value, __u64);
} hist_class_task_ns SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, MAX_CLASSES);
  __type(key, __u32);
  __type(value, __u64);
} began_by_class SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_begin")
int on_begin(struct ms_hook_ctx *ctx) {
  __u32 cls = ctx->task_class;
  if (cls >= MAX_CLASSES) return 0;
  __u64 *n = bpf_map_lookup_elem(&began_by_class, &cls);
  if (n) *n += 1;
  return 0;
}

SEC("megascope/observe/task_end")
int on_end(struct ms_hook_ctx *ctx) {
  __u32 cls = ctx->task_class;
  if (cls >= MAX_CLASSES) return 0;
  __u32 key = cls * MS_HIST_BUCKETS + (__u32)ms_log2(ctx->t_end - ctx->t_begin);
  __u64 *n = bpf_map_lookup_elem(&hist_class_task_ns, &key);
  if (n) *n += 1;
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
