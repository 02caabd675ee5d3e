// SPDX-License-Identifier: MIT
// The query `task_end { @[class] = count() }` written by hand, doing what the
// query compiler's code does (a per-worker hash keyed by the class as a u64,
// a zero value inserted on the first sight of a key, an atomic add, a drop
// counter when the map is full), for scripts/query-bench.sh's code-size figure.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64);
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
  __u64 key = ctx->task_class, zero = 0;
  __u64 *v = bpf_map_lookup_elem(&counts, &key);
  if (!v) {
    bpf_map_update_elem(&counts, &key, &zero, BPF_NOEXIST);
    v = bpf_map_lookup_elem(&counts, &key);
  }
  if (v) {
    __sync_fetch_and_add(v, 1);
  } else {
    __u32 k0 = 0;
    __u64 *d = bpf_map_lookup_elem(&dropped, &k0);
    if (d) __sync_fetch_and_add(d, 1);
  }
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
