// SPDX-License-Identifier: MIT
// Time per request generation: task time spent on each request's rows, keyed by
// (req_slot << 32 | req_gen), and the tokens each request emitted.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64);
  __type(value, __u64);
} task_ns_by_req SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64);
  __type(value, __u64);
} tokens_by_req SEC(".maps");

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_end")
int on_end(struct ms_hook_ctx *ctx) {
  if (ctx->req_slot == MS_HOOK_NONE32) return 0;
  __u64 key = (__u64)ctx->req_slot << 32 | ctx->req_gen;
  __u64 dt = ctx->t_end - ctx->t_begin;
  __u64 *v = bpf_map_lookup_elem(&task_ns_by_req, &key);
  if (v)
    *v += dt;
  else
    bpf_map_update_elem(&task_ns_by_req, &key, &dt, BPF_NOEXIST);
  return 0;
}

SEC("megascope/observe/request")
int on_request(struct ms_hook_ctx *ctx) {
  if (ctx->phase != MS_REQ_FIRST_TOKEN && ctx->phase != MS_REQ_TOKEN) return 0;
  __u64 key = (__u64)ctx->req_slot << 32 | ctx->req_gen, one = 1;
  __u64 *v = bpf_map_lookup_elem(&tokens_by_req, &key);
  if (v)
    __sync_fetch_and_add(v, 1);
  else
    bpf_map_update_elem(&tokens_by_req, &key, &one, BPF_NOEXIST);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
