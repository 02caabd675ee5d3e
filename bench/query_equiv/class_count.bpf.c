// SPDX-License-Identifier: MIT
// The query `task_end { @[class] = count() }` written by hand, as a monitor
// author would and as the query compiler's code does it: a per-worker array
// indexed by the class, an atomic add, a drop counter for a class past the
// array's end. For scripts/query-bench.sh's code-size figure.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#define MAX_CLASSES 512

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, MAX_CLASSES);
  __type(key, __u32);
  __type(value, __u64);
} counts SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} dropped SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_end")
int on_end(struct ms_hook_ctx *ctx) {
  __u32 key = ctx->task_class, k0 = 0;
  __u64 *v = bpf_map_lookup_elem(&counts, &key);
  if (v) {
    __sync_fetch_and_add(v, 1);
    return 0;
  }
  __u64 *d = bpf_map_lookup_elem(&dropped, &k0);
  if (d) __sync_fetch_and_add(d, 1);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
