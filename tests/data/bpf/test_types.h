/* SPDX-License-Identifier: MIT */
/* The few kernel types and constants libbpf's bpf_helpers.h needs, so the test
 * objects build with plain `clang -target bpf` and no kernel headers. */
#ifndef MS_TEST_BPF_TYPES_H
#define MS_TEST_BPF_TYPES_H
typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
enum {
  BPF_MAP_TYPE_HASH = 1,
  BPF_MAP_TYPE_ARRAY = 2,
  BPF_MAP_TYPE_PERCPU_HASH = 5,
  BPF_MAP_TYPE_PERCPU_ARRAY = 6,
  BPF_MAP_TYPE_LRU_HASH = 9,
  BPF_MAP_TYPE_RINGBUF = 27,
};
enum { BPF_ANY = 0, BPF_NOEXIST = 1, BPF_EXIST = 2 };
#include <bpf/bpf_helpers.h>
#endif
