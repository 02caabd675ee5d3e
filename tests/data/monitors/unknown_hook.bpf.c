// SPDX-License-Identifier: MIT
// A monitor whose program names a hook that does not exist; attaching it must
// fail with the loader's reason. Used by tests/cli_control.sh.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

MS_HOOK_ABI_DECLARE();

SEC("megascope/observe/task_teleport")
int on_teleport(struct ms_hook_ctx *ctx) { return 0; }

char LICENSE[] SEC("license") = "Dual MIT/GPL";
