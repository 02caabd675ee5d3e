// SPDX-License-Identifier: MIT
// Verifier test monitor, adversarial (543 instructions): eight frames of
// bpf-to-bpf calls, each writing 32 stack slots, and in the deepest a loop
// whose counter lives only in a stack slot (volatile), so that at the loop head
// every iteration's registers are the same and one stack slot tells the states
// apart. The loop runs LOOP_N times (default 200000: longer than a hook run may
// be, so it must be refused, and quickly: the verifier once spent minutes on
// it before saying "program too complex"). -DLOOP_N=1000 verifies.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#ifndef LOOP_N
#define LOOP_N 200000
#endif

MS_HOOK_ABI_DECLARE();

#define FILL(buf)                                   \
  _Pragma("clang loop unroll(full)")                \
  for (int k = 0; k < 32; k++) buf[k] = k + 1;

static __attribute__((noinline)) __u64 f7(__u64 x) {
  volatile __u64 buf[32];
  FILL(buf)
  volatile __u64 i;
#pragma clang loop unroll(disable)
  for (i = 0; i < LOOP_N; i++) {
  }
  return buf[x & 31] + i;
}

#define FRAME(name, next)                           \
  static __attribute__((noinline)) __u64 name(__u64 x) { \
    volatile __u64 buf[32];                         \
    FILL(buf)                                       \
    return next(x + 1) + buf[x & 15];               \
  }
FRAME(f6, f7)
FRAME(f5, f6)
FRAME(f4, f5)
FRAME(f3, f4)
FRAME(f2, f3)
FRAME(f1, f2)

SEC("megascope/observe/step")
int deep_loop(struct ms_hook_ctx *ctx) {
  return f1(ctx->step) & 1;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
