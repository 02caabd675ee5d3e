# SPDX-License-Identifier: MIT
# The parts of the core and the one direction of flow between them: the table
# CMakeLists.txt builds the libraries from and cmake/check_layers.cmake checks
# every '#include "..."' line against. docs/design.md ("The direction of flow")
# says it in words.
#
# The data flows model -> plan (graph, compile) -> runtime and its task bodies
# (kernels) -> hook -> bpf, with base under all and control, export, query and
# bench on top; tools/ (the CLI) sits on everything. A part links only parts
# below it (MS_LINKS_<target>): the libraries form no cycle, so any link order
# CMake derives from them is a right one.
#
# Each folder src/<part>/ keeps private headers. A file includes its own
# folder's ("runtime/runtime_impl.h"), the public ones ("megascope/engine.h"),
# and the private headers of the folders named in MS_SEES_<folder> — nothing
# else. The build gives each target a door per allowed folder (a directory
# holding one link <part> -> src/<part>), so any other private include is
# "file not found"; the check names the rule that was broken. Tests (tests/) are
# white-box and see every folder.

# The libraries, in link order (each after everything it links).
set(MS_TARGETS base dist model kernels graph compile bpf hook runtime export query control bench explain)

# What each library compiles: its folder's .c files unless said here.
#  - model: the block formats (src/kernels/quant.c, quant_k.c: how weights are
#    encoded) are compiled into the model's library. The model reads and writes
#    weights through them and they use the model's dtype table, so as two
#    libraries they would be a cycle. Their files stay in src/kernels/ for now.
set(MS_SOURCES_model src/model/*.c src/kernels/quant.c src/kernels/quant_k.c)
set(MS_EXCLUDE_kernels src/kernels/quant.c src/kernels/quant_k.c)

# Links: the libraries each one calls (the libraries of outside packages are
# linked in CMakeLists.txt, by the parts that use them alone).
set(MS_LINKS_base)
# dist: the transport between the ranks of one engine in several processes
# (MPI). The runtime does not link it: it calls a transport through the table
# of its public header (megascope/transport.h), which the CLI fills with
# ms_transport_mpi_new; so the data flows runtime -> transport with no MPI
# below the runtime.
set(MS_LINKS_dist base)
set(MS_LINKS_model base)
set(MS_LINKS_kernels model base)
set(MS_LINKS_graph model base)
set(MS_LINKS_compile graph model base)
set(MS_LINKS_bpf base)
set(MS_LINKS_hook bpf base)
set(MS_LINKS_runtime compile kernels hook model base)
set(MS_LINKS_export runtime base)
set(MS_LINKS_query hook bpf compile base)
set(MS_LINKS_control runtime export hook bpf compile model base)
set(MS_LINKS_bench runtime hook bpf compile model base)
# explain: the judgement of a window's tables (numbers in, culprits out); the
# CLI gathers the tables from a live engine.
set(MS_LINKS_explain base)

# Denies: public headers a folder's files may not include all the same, where
# what they declare lies above the folder in the flow. bpf proves programs
# against a context described as data (struct ms_verify_ctx, which the hook
# tables build) and knows no hook, engine or monitor.
set(MS_DENIES_bpf megascope/hook.h megascope/bpf/megascope.h megascope/monitor.h megascope/engine.h)

# Sees: the other folders whose private headers a folder's files may include.
# Every entry is an exception the design names; an empty list is the rule.
set(MS_SEES_base)
set(MS_SEES_dist)
set(MS_SEES_graph)
set(MS_SEES_kernels)
set(MS_SEES_bpf)
set(MS_SEES_hook)
set(MS_SEES_export)
set(MS_SEES_query)
set(MS_SEES_explain)
# model: the block formats it is built with (kernels/quant.h, kernels/quant_k.h).
set(MS_SEES_model kernels)
# compile: the graph it lowers (graph/graph.h) is the other half of the plan.
set(MS_SEES_compile graph)
# runtime: the task bodies it runs (kernels/ops.h, kernels/quant.h) and the
# attachment tables its hook sites fire (hook/hook_impl.h), both below it.
set(MS_SEES_runtime kernels hook)
# control: the attachment behind an id, for map fds and record decoding
# (runtime/runtime_impl.h, which brings hook/hook_impl.h and kernels/ops.h).
set(MS_SEES_control runtime hook kernels)
# bench: the engine through its public headers alone (the trace's records,
# an attachment's maps, what the workers run: engine.h, telemetry.h, monitor.h).
set(MS_SEES_bench)
# cuda (megascope_gpu): the CPU task bodies it is checked against
# (kernels/ops.h), the eBPF loop, ALU, atomics and maps it shares with the
# interpreter (bpf/vm_core.h, alu.h, atomics.h, map_core.h) and the hook
# sites' sampling and budget rule (hook/admit.h).
set(MS_SEES_cuda kernels bpf hook)
# tools: the benchmark's API (bench/bench.h), not yet a public header.
set(MS_SEES_tools bench)
