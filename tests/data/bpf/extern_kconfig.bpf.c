/* SPDX-License-Identifier: MIT */
/* An object that reads a kernel config extern: there is no kernel to resolve
 * it from, so the loader must refuse it with a message. */
#include "test_types.h"

extern __u32 LINUX_KERNEL_VERSION __kconfig;

SEC("megascope/observe/task_end")
int prog(void *ctx) { return LINUX_KERNEL_VERSION > 5; }

char LICENSE[] SEC("license") = "GPL";
