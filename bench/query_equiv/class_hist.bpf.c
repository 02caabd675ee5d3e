// SPDX-License-Identifier: MIT
// The query `task_end { @[class] = hist(t_end - t_begin) }` written by hand,
// doing what the query compiler's code does (a per-worker hash keyed by the
// class as a u64 whose value is 65 power-of-two buckets, inserted zero from a
// read-only zero map on the first sight of a key, an atomic add into the
// bucket, a drop counter when the map is full), for scripts/query-bench.sh.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct hist {
  __u64 b[65];
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
  __uint(max_entries, 1024);
  __type(key, __u64);
  __type(value, struct hist);
} hists SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __uint(map_flags, BPF_F_RDONLY_PROG);
  __type(key, __u32);
  __type(value, struct hist);
} zero SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} dropped SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_end")
int on_end(struct ms_hook_ctx *ctx) {
  __u64 key = ctx->task_class, d = ctx->t_end - ctx->t_begin;
  __u32 k0 = 0;
  struct hist *h = bpf_map_lookup_elem(&hists, &key);
  if (!h) {
    struct hist *z = bpf_map_lookup_elem(&zero, &k0);
    if (z) {
      bpf_map_update_elem(&hists, &key, z, BPF_NOEXIST);
      h = bpf_map_lookup_elem(&hists, &key);
    }
  }
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
