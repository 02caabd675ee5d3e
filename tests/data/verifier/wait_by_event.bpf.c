// SPDX-License-Identifier: MIT
// Verifier test monitor: a hash keyed by event_class summing wait_ns on
// task_begin (lookup, add in place, or insert when absent), and a count of
// firings in a one-entry array.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32);
  __type(value, __u64);
} wait_ns SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} firings SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_begin")
int on_begin(struct ms_hook_ctx *ctx) {
  __u32 ev = ctx->event_class, zero = 0;
  __u64 w = ctx->wait_ns;
  __u64 *sum = bpf_map_lookup_elem(&wait_ns, &ev);
  if (sum)
    __sync_fetch_and_add(sum, w);
  else
    bpf_map_update_elem(&wait_ns, &ev, &w, BPF_NOEXIST);
  __u64 *n = bpf_map_lookup_elem(&firings, &zero);
  if (n) __sync_fetch_and_add(n, 1);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
