// SPDX-License-Identifier: MIT
// A monitor the verifier must reject: it writes through the result of a map
// lookup without checking it for NULL. Used by tests/cli_control.sh.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 4);
  __type(key, __u32);
  __type(value, __u64);
} counts SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_end")
int on_end(struct ms_hook_ctx *ctx) {
  __u32 key = ctx->worker & 3;
  __u64 *n = bpf_map_lookup_elem(&counts, &key);
  *n += 1;
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
