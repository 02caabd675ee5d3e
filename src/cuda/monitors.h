/* SPDX-License-Identifier: MIT */
/* The host side of monitors on the device (private to src/cuda): a device hook
 * table for n_sms SM indices, attachments of verified monitors with host maps
 * (the CPU engine's memfd maps, so readers and decoders work unchanged) and
 * device mirrors of them, replace and detach with quiescence, coverage and
 * map read-back. See bpf_dev.cuh's DESIGN for the device side.
 *
 * Nothing here waits for the resident kernel. Device memory comes from one
 * arena allocated by ms_cuda_mon_new, before the launch (allocations, frees and
 * memsets may synchronise with the device, or need an SM the kernel holds);
 * attach, replace and detach take spans of it and only copy, host to device
 * and back, on one non-blocking stream of their own (cudaMemcpyAsync, then
 * cudaStreamSynchronize on that stream), never the legacy default stream nor a
 * device-wide synchronisation. One call at a time (a mutex, held across the
 * call's own copies and a replace's or detach's quiescence wait); the engine's
 * driver only tries it (ms_cuda_mon_sync_maps_try), so a control call never
 * holds up the step feed.
 *
 * Errors: 0 / a positive id, or a negative errno / -MS_E_*, with the reason in
 * log where there is one. */
#ifndef MS_CUDA_MONITORS_H
#define MS_CUDA_MONITORS_H

#include "megascope/base.h"
#include "megascope/bpf.h"
#include "megascope/monitor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ms_cuda_mon;
struct msd_hooks;

/* A device hook table for SM indices 0..n_sms-1 (the sm argument of the
 * device calls; per-worker maps get n_sms worker slots), with an arena of
 * arena_bytes for everything attachments put on the device (0:
 * ms_cuda_mon_arena_default). NULL + errno. */
struct ms_cuda_mon *ms_cuda_mon_new(int n_sms, size_t arena_bytes, struct ms_textbuf *log);
/* 40 MiB + 2 MiB an SM: room for the shipped monitors' largest (diag_sample's
 * 16 MiB ring takes 32 MiB on the device, its mirror included; class_time's
 * per-worker maps take 34 MiB for 133 SMs) while a replace holds two
 * generations. */
size_t ms_cuda_mon_arena_default(int n_sms);
/* The arena's size, the bytes in use and those kept for good (memory an SM
 * did not let go of in time). */
void ms_cuda_mon_arena(struct ms_cuda_mon *mon, size_t *size, size_t *used, size_t *kept);
/* Frees everything; the kernel must not be running. NULL: nothing. */
void ms_cuda_mon_free(struct ms_cuda_mon *mon);
/* The device address of the table, for the kernel (struct msd_hooks *). */
struct msd_hooks *ms_cuda_mon_device(struct ms_cuda_mon *mon);
/* Whether the persistent kernel runs: replace and detach wait for every SM's
 * quiescent word only while it does. Call with 1 right after the launch and
 * with 0 once its stream has completed. */
void ms_cuda_mon_set_running(struct ms_cuda_mon *mon, int running);
/* The persistent kernel's stream (a cudaStream_t; NULL: none). While running,
 * replace and detach also stop waiting once that stream has completed: CTAs
 * that returned hold nothing, though they did not pass a quiescent point. */
void ms_cuda_mon_set_stream(struct ms_cuda_mon *mon, void *kernel_stream);

/* Attaches m (taken over on success; the caller keeps it on failure). Returns
 * the id (> 0). Refuses, naming the program and what, a program that calls a
 * helper the device lacks or a map of a type it lacks; -MS_E_LIMIT when a hook
 * would hold more than MSD_SET_MAX programs. */
int ms_cuda_mon_attach(struct ms_cuda_mon *mon, struct ms_monitor *m, const struct ms_attach_opts *o,
                       struct ms_textbuf *log);
/* A new generation for id with m's programs and fresh maps (m taken over on
 * success); the old one's maps are read back, its coverage kept final. */
int ms_cuda_mon_replace(struct ms_cuda_mon *mon, int id, struct ms_monitor *m, struct ms_textbuf *log);
/* As attach and replace, for the engine's CUDA backend: m runs with the
 * given host maps (n_maps, in object order, made for n_sms workers: the
 * engine's attachment's) as the host side its device maps sync into. Neither
 * m nor the maps are taken over; they must stay until the attachment is
 * detached and ms_cuda_mon_free. replace_shared's o: the generation's budget
 * (NULL: the attachment's). */
int ms_cuda_mon_attach_shared(struct ms_cuda_mon *mon, struct ms_monitor *m, struct ms_bpf_map **maps, int n_maps,
                              const struct ms_attach_opts *o, struct ms_textbuf *log);
int ms_cuda_mon_replace_shared(struct ms_cuda_mon *mon, int id, struct ms_monitor *m, struct ms_bpf_map **maps,
                               int n_maps, const struct ms_attach_opts *o, struct ms_textbuf *log);
/* Unpublishes id; its maps and coverage stay readable. -ENOENT unknown or detached. */
int ms_cuda_mon_detach(struct ms_cuda_mon *mon, int id);
/* Coverage of id's current (or last) generation, summed over SMs. */
int ms_cuda_mon_coverage(struct ms_cuda_mon *mon, int id, struct ms_coverage *out);
/* Coverage of generation `generation` of id (current or retired). */
int ms_cuda_mon_coverage_of(struct ms_cuda_mon *mon, int id, uint32_t generation, struct ms_coverage *out);
/* Frees what is left of detached attachment id (its id is not reused);
 * -MS_E_STATE while attached, -ENOENT unknown. */
int ms_cuda_mon_forget(struct ms_cuda_mon *mon, int id);
/* Copies id's device maps into its host maps (ring buffers: the host's
 * consumer position goes to the device first, then the records come back).
 * While the kernel runs, a copy is kept only if no SM wrote during it
 * (bpf_dev.cuh's DESIGN, snapshots); -EAGAIN when every try saw a write (the
 * host maps keep the last whole copy). */
int ms_cuda_mon_sync_maps(struct ms_cuda_mon *mon, int id);
/* The same, or -EBUSY at once when another call holds the table (the
 * driver's periodic copy: it must not wait behind an attach). */
int ms_cuda_mon_sync_maps_try(struct ms_cuda_mon *mon, int id);
/* Read-outs that gave up with -EAGAIN so far. */
uint64_t ms_cuda_mon_torn(struct ms_cuda_mon *mon);
/* id's host maps (object order), owned by mon; valid until the next replace. */
int ms_cuda_mon_maps(struct ms_cuda_mon *mon, int id, struct ms_bpf_map ***maps, int *n);
/* The monitor's name, or NULL for an unknown id. */
const char *ms_cuda_mon_name(struct ms_cuda_mon *mon, int id);

#ifdef __cplusplus
}
#endif
#endif
