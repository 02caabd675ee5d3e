// SPDX-License-Identifier: MIT
// Dependency wait per event class: how long workers waited for each kind of event
// before the task behind it could begin (log2 histogram of wait_ns), and how many
// waits began on each event class (dep_wait).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#define MAX_EVCLASSES 64

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, MAX_EVCLASSES * MS_HIST_BUCKETS);
  __type(key, __u32);
  __type(value, __u64);
} hist_evclass_wait_ns SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, MAX_EVCLASSES);
  __type(key, __u32);
  __type(value, __u64);
} waits_by_evclass SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_begin")
int on_begin(struct ms_hook_ctx *ctx) {
  __u32 ec = ctx->event_class;
  __u64 w = ctx->wait_ns;
  if (!w || ec >= MAX_EVCLASSES) return 0;
  __u32 key = ec * MS_HIST_BUCKETS + (__u32)ms_log2(w);
  __u64 *n = bpf_map_lookup_elem(&hist_evclass_wait_ns, &key);
  if (n) *n += 1;
  return 0;
}

SEC("megascope/observe/dep_wait")
int on_wait(struct ms_hook_ctx *ctx) {
  __u32 ec = ctx->event_class;
  __u64 one = 1, *n = bpf_map_lookup_elem(&waits_by_evclass, &ec);
  if (n)
    __sync_fetch_and_add(n, 1);
  else
    bpf_map_update_elem(&waits_by_evclass, &ec, &one, BPF_NOEXIST);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
