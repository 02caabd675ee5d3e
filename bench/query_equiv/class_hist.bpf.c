// SPDX-License-Identifier: MIT
// The query `task_end { @[class] = hist(t_end - t_begin) }` written by hand,
// as the query compiler's code does it: a per-worker array indexed by the
// class whose value is 65 power-of-two buckets, an atomic add into the bucket,
// a drop counter for a class past the array's end. For scripts/query-bench.sh.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#define MAX_CLASSES 512

struct hist {
  __u64 b[65];
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, MAX_CLASSES);
  __type(key, __u32);
  __type(value, struct hist);
} hists SEC(".maps");

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
  __u64 d = ctx->t_end - ctx->t_begin;
  struct hist *h = bpf_map_lookup_elem(&hists, &key);
  if (!h) {
    __u64 *n = bpf_map_lookup_elem(&dropped, &k0);
    if (n) __sync_fetch_and_add(n, 1);
    return 0;
  }
  __u64 b = d ? ms_log2(d) + 1 : 0;
  if (b > 64) b = 64;
  __sync_fetch_and_add(&h->b[b], 1);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
