/* SPDX-License-Identifier: MIT */
/* A monitor-shaped object for the loader test: BTF-defined maps of every
 * supported type, global data (.rodata, .bss), a custom section, two programs
 * in megascope sections sharing subprograms (one calling another), helpers
 * 1, 2, 8 and 130. Build: clang -O2 -g -target bpf -c loader_test.bpf.c */
#include "test_types.h"

struct task_ctx {
  __u64 duration_ns;
  __u32 worker;
  __u32 task_class;
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 64);
  __type(key, __u32);
  __type(value, __u64);
} hist SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 128);
  __type(key, __u32);
  __type(value, __u64);
} per_class SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} runs SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 4096);
} slow SEC(".maps");

const volatile __u64 slow_ns = 1000;
__u64 total;
const __u32 megascope_abi_version SEC("megascope_abi") __attribute__((used)) = 1;

static __attribute__((noinline)) __u32 clamp63(__u32 b) { return b > 63 ? 63 : b; }

static __attribute__((noinline)) __u32 log2_bucket(__u64 v) {
  __u32 b = 0;
  for (int i = 0; i < 64 && v > 1; i++) {
    v >>= 1;
    b++;
  }
  return clamp63(b);
}

SEC("megascope/observe/task_end")
int on_task_end(struct task_ctx *ctx) {
  __u64 d = ctx->duration_ns;
  __u32 k = log2_bucket(d), cls = ctx->task_class, zero = 0;
  __u64 one = 1, *v = bpf_map_lookup_elem(&hist, &k);
  if (v) __sync_fetch_and_add(v, 1);
  v = bpf_map_lookup_elem(&per_class, &cls);
  if (v)
    __sync_fetch_and_add(v, d);
  else
    bpf_map_update_elem(&per_class, &cls, &d, BPF_NOEXIST);
  v = bpf_map_lookup_elem(&runs, &zero);
  if (v) *v += one;
  __sync_fetch_and_add(&total, 1);
  if (d > slow_ns) bpf_ringbuf_output(&slow, &d, sizeof d, 0);
  return 0;
}

SEC("megascope/sched_hint/task_ready")
int hint_ready(struct task_ctx *ctx) {
  return log2_bucket(ctx->duration_ns) & 7;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
