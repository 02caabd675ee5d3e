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
# Each public header (include/megascope/) is the door of one part
# (MS_OWNS_<part>): its owner's library defines every function it declares
# (cmake/check_doors.cmake, ctest `doors`), and only its owner and the parts
# above it include it. Includes between parts never make a circle
# (cmake/check_layers.cmake).
#
# Each folder src/<part>/ keeps private headers. A file includes its own
# folder's ("runtime/runtime_impl.h"), the public ones ("megascope/engine.h"),
# and the private headers of the folders named in MS_SEES_<folder> — nothing
# else. The build gives each target a door per allowed folder (a directory
# holding one link <part> -> src/<part>), so any other private include is
# "file not found"; the check names the rule that was broken. Tests (tests/) are
# white-box and see every folder.

# The libraries, in link order (each after everything it links).
set(MS_TARGETS base model graph compile kernels bpf hook runtime dist export query control bench explain)

# What each library compiles: its folder's .c files unless said here
# (MS_SOURCES_<target>, MS_EXCLUDE_<target>); today every library is its folder.
#  - runtime: its backends too (src/runtime/backend/: cpu, sim, cuda behind
#    the one table, backend/backend.h).
set(MS_SOURCES_runtime src/runtime/*.c src/runtime/backend/*.c)

# Links: the libraries each one calls (the libraries of outside packages are
# linked in CMakeLists.txt, by the parts that use them alone).
set(MS_LINKS_base)
# dist: the transport between the ranks of one engine in several processes
# (MPI). It lies above the runtime: the runtime calls a transport through the
# table of its own door (megascope/transport.h), which dist implements and the
# CLI fills with ms_transport_mpi_new (megascope/mpi.h); so no MPI lies below
# the runtime.
set(MS_LINKS_dist runtime base)
set(MS_LINKS_model base)
# kernels: the task bodies of a compiled plan, which they read (megascope/plan_ir.h).
set(MS_LINKS_kernels compile model base)
set(MS_LINKS_graph model base)
set(MS_LINKS_compile graph model base)
set(MS_LINKS_bpf base)
# hook: the plan's class names its records are decoded with (megascope/plan_ir.h).
set(MS_LINKS_hook compile bpf base)
# runtime: also the CUDA backend's library (megascope_gpu, through megascope/cuda.h).
set(MS_LINKS_runtime compile kernels hook model base cuda)
set(MS_LINKS_export runtime base)
set(MS_LINKS_query hook bpf compile base)
set(MS_LINKS_control runtime export hook bpf compile model base)
set(MS_LINKS_bench runtime hook bpf compile model base)
# explain: the judgement of a window's tables (numbers in, culprits out); the
# CLI gathers the tables from a live engine.
set(MS_LINKS_explain base)

# cuda (megascope_gpu): with nvcc, the CUDA engine links what lies below the
# runtime (without nvcc it is src/cuda/without_cuda.c and links base alone).
set(MS_LINKS_cuda compile kernels hook bpf model base)
# tools: the CLI links every library.
set(MS_LINKS_tools ${MS_TARGETS} cuda)

# Owners: the part each public header is the door of. Every function a header
# declares is defined in its owner's library (cmake/check_doors.cmake proves it
# with nm, ctest `doors`), and a header is included by its owner and the parts
# above it only (cmake/check_layers.cmake).
set(MS_OWNS_base megascope/base.h megascope/json.h)
set(MS_OWNS_dist megascope/mpi.h)
set(MS_OWNS_model megascope/model.h megascope/gguf.h megascope/chat.h megascope/sample.h
                  megascope/textstream.h megascope/tokenizer.h)
set(MS_OWNS_kernels megascope/reference.h)
set(MS_OWNS_graph megascope/graph_ir.h)
set(MS_OWNS_compile megascope/plan.h megascope/plan_ir.h)
set(MS_OWNS_bpf megascope/bpf.h megascope/bpf_jit.h megascope/verifier.h)
set(MS_OWNS_hook megascope/hook.h megascope/monitor.h megascope/monitor_job.h megascope/bpf/megascope.h)
set(MS_OWNS_runtime megascope/engine.h megascope/attach.h megascope/telemetry.h megascope/fault.h
                    megascope/transport.h)
set(MS_OWNS_export megascope/export.h)
set(MS_OWNS_query megascope/query.h)
set(MS_OWNS_control megascope/control.h)
set(MS_OWNS_bench)
set(MS_OWNS_explain megascope/explain.h)
set(MS_OWNS_cuda megascope/cuda.h megascope/cuda_diag.h)
set(MS_OWNS_tools)

# Denies: public headers a folder's files may not include all the same, where
# what they declare lies above the folder in the flow. bpf proves programs
# against a context described as data (struct ms_verify_ctx, which the hook
# tables build) and knows no hook, engine or monitor.
set(MS_DENIES_bpf megascope/hook.h megascope/bpf/megascope.h megascope/monitor.h megascope/engine.h)

# core (src/core/): the code compiled for host and device alike, headers only
# and no library: the eBPF instruction loop, ALU and atomics, the maps' layout
# and operations, the device's interpreter, the hook context's plan fields,
# which firings run, the event and layer rules. It is the check's one
# exception: every part may include its headers (MS_SEEN_BY_ALL), so bpf,
# hook, runtime and cuda run the same lines. In return a core header includes
# nothing but core headers and the public headers MS_PUBLIC_core names, each of
# a part below every part that includes it, and the check refuses a core
# include that would bring a part a header its MS_DENIES names.
set(MS_SEEN_BY_ALL core)
set(MS_SEES_core)
set(MS_PUBLIC_core megascope/base.h megascope/bpf.h megascope/bpf/megascope.h megascope/model.h
                   megascope/plan_ir.h)

# Sees: the other folders whose private headers a folder's files may include.
# Every entry is an exception the design names; an empty list is the rule.
set(MS_SEES_base)
set(MS_SEES_dist)
set(MS_SEES_graph)
# kernels: the block formats its GEMV reads, below it (the model's dtype code:
# model/quant_k.h, and model/blocks.h for the packed layout).
set(MS_SEES_kernels model)
set(MS_SEES_bpf)
set(MS_SEES_hook)
set(MS_SEES_export)
set(MS_SEES_query)
set(MS_SEES_explain)
set(MS_SEES_model)
# compile: the graph it lowers (graph/graph.h) is the other half of the plan.
set(MS_SEES_compile graph)
# runtime: the task bodies it runs (kernels/ops.h, kernels/quant.h) and the
# attachment tables its hook sites fire (hook/hook_impl.h), both below it.
set(MS_SEES_runtime kernels hook)
# control: the engine through its public headers alone (an attachment's maps
# and records through ms_engine_attach_visit, megascope/attach.h).
set(MS_SEES_control)
# bench: the engine through its public headers alone (the trace's records,
# an attachment's maps, what the workers run: engine.h, telemetry.h, monitor.h).
set(MS_SEES_bench)
# cuda (megascope_gpu): the CPU task bodies it is checked against
# (kernels/ops.h); what it shares with the CPU engines is the core's.
set(MS_SEES_cuda kernels)
# tools: the benchmark's API (bench/bench.h), not yet a public header.
set(MS_SEES_tools bench)
