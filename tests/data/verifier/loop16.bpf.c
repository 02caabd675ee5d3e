// SPDX-License-Identifier: MIT
// Verifier test monitor: bounded loops, kept as loops (unrolling disabled):
// a sum over 16 array entries, a sum over a stack array indexed by the loop
// counter, and a log2 by shifting (a loop whose trip count depends on data).
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 32);
  __type(key, __u32);
  __type(value, __u64);
} slots SEC(".maps");

MS_HOOK_ABI_DECLARE();

static __attribute__((noinline)) __u32 slow_log2(__u64 v) {
  __u32 b = 0;
#pragma clang loop unroll(disable)
  for (int i = 0; i < 64 && v > 1; i++) {
    v >>= 1;
    b++;
  }
  return b;
}

SEC("megascope/observe/step")
int on_step(struct ms_hook_ctx *ctx) {
  __u64 acc = 0;
#pragma clang loop unroll(disable)
  for (__u32 i = 0; i < 16; i++) {
    __u32 k = i;
    __u64 *v = bpf_map_lookup_elem(&slots, &k);
    if (v) acc += *v;
  }
  __u64 buf[16];
#pragma clang loop unroll(disable)
  for (int i = 0; i < 16; i++) buf[i] = ctx->step + i;
  __u32 idx = ctx->batch_size;
  if (idx < 16) acc += buf[idx];
  __u32 k = 16 + slow_log2(acc) % 16;
  __u64 *out = bpf_map_lookup_elem(&slots, &k);
  if (out) *out = acc;
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
