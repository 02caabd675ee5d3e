/* SPDX-License-Identifier: MIT */
/* An object with a map type megascope does not run (LRU hash, 9): the loader
 * must refuse it and name the map. */
#include "test_types.h"

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 16);
  __type(key, __u32);
  __type(value, __u64);
} lru SEC(".maps");

SEC("megascope/observe/task_end")
int prog(void *ctx) {
  __u32 k = 0;
  __u64 *v = bpf_map_lookup_elem(&lru, &k);
  return v ? 1 : 0;
}

char LICENSE[] SEC("license") = "GPL";
