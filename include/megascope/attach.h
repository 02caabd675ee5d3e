/* SPDX-License-Identifier: MIT */
/* The engine's attach API: monitors (megascope/monitor.h, the hook's objects)
 * attached to, replaced in and detached from a running engine, and the
 * read-outs of its attachments. The runtime's door, defined in
 * src/runtime/monitor_api.c and attach_maps.c over the engine's hook table. */
#ifndef MEGASCOPE_ATTACH_H
#define MEGASCOPE_ATTACH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megascope/base.h"
#include "megascope/engine.h"
#include "megascope/monitor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Attaches `m` (the engine takes it over on success). Returns the attachment id
 * (> 0) or a negative error: -EINVAL, with the reason in log, for a monitor
 * compiled against another plan's class ids (its ms_monitor_schema_digest
 * neither 0 nor this engine's plan's ms_plan_schema_digest); replacing alike. */
int ms_engine_attach(struct ms_engine *e, struct ms_monitor *m, const struct ms_attach_opts *o,
                     struct ms_textbuf *log);
/* Replaces the programs and maps of attachment `id` by `m` (taken over on success). */
int ms_engine_replace(struct ms_engine *e, int id, struct ms_monitor *m, struct ms_textbuf *log);
/* The same with a new budget for the new generation (o NULL: keep the current one). */
int ms_engine_replace_opts(struct ms_engine *e, int id, struct ms_monitor *m, const struct ms_attach_opts *o,
                           struct ms_textbuf *log);
/* Detaches; the attachment's final maps and coverage stay readable until the
 * retention has passed and ms_engine_attach_reap runs, or until
 * ms_engine_attach_release (or the engine is freed). -ENOENT for an unknown or
 * already detached id. */
int ms_engine_detach(struct ms_engine *e, int id);

/* Closed generations (a detached attachment, a replaced generation) stay
 * readable for the retention (default 60 s; 0: until the next reap), then
 * ms_engine_attach_reap frees their programs, maps and memfds. Nothing is freed
 * without a reap: a process that operates the engine calls it now and then (the
 * control server does, at least once a second). Returns the generations freed. */
void ms_engine_set_detached_retention(struct ms_engine *e, uint64_t ns);
int ms_engine_attach_reap(struct ms_engine *e);

/* Sets the bounds of struct ms_attach_budget (megascope/monitor.h). */
int ms_engine_set_attach_budget(struct ms_engine *e, const struct ms_attach_budget *b);

/* What attachments hold now, against those bounds. */
void ms_engine_attach_usage(struct ms_engine *e, struct ms_attach_usage *out);
/* Frees detached attachment id at once (its last read-out is done). -ENOENT when
 * unknown (or freed already), -MS_E_STATE while attached. */
int ms_engine_attach_release(struct ms_engine *e, int id);

/* Copies up to max attachments (attached, and detached ones not yet freed), in
 * id order; returns the count copied. Ids are never reused and not capped. */
int ms_engine_attach_list(struct ms_engine *e, struct ms_attach_info *out, int max);
/* Attachments held now (for sizing the array ms_engine_attach_list fills). */
int ms_engine_attach_count(struct ms_engine *e);
/* Every attachment held, in one snapshot: a malloc'd array of *n (free it);
 * NULL + errno ENOMEM. */
struct ms_attach_info *ms_engine_attach_list_all(struct ms_engine *e, int *n);
/* Coverage of one generation of attachment id (generation 0: the current). */
int ms_engine_attach_coverage(struct ms_engine *e, int id, uint32_t generation, struct ms_coverage *out);

/* The maps of attachment id's current generation, in its object's map order
 * (up to max; returns the count, or -ENOENT). They stay valid while the
 * attachment's maps are kept (see ms_engine_detach). */
struct ms_bpf_map;
int ms_engine_attach_maps(struct ms_engine *e, int id, struct ms_bpf_map **out, int max);
/* Attachment id's current generation as fn sees it: its number, its monitor
 * (for its object: ms_monitor_object) and its maps in the object's map order. */
struct ms_attach_view {
  uint32_t generation;
  const struct ms_monitor *mon;
  struct ms_bpf_map *const *maps;
  int n_maps;
};
/* Calls fn(view, arg) with attachment id's current generation under the lock
 * of the engine's attachments, so that no detach, replace or reap frees any of
 * it meanwhile (fn must not call this API back); the maps are brought up to
 * date first (ms_engine_attach_sync). Returns fn's result, or -ENOENT for an
 * unknown id. For readers that reopen or decode the maps themselves (the
 * control server's "maps" and "records" descriptors). */
int ms_engine_attach_visit(struct ms_engine *e, int id, int (*fn)(const struct ms_attach_view *v, void *arg),
                           void *arg);
/* Brings attachment id's maps up to date where the engine's programs run
 * away from them (the CUDA backend: the device's copies into these maps; it
 * also does so every 100 ms on its own); 0 at once elsewhere. Every read-out
 * here calls it; a reader of the maps' memfds calls it before reading. */
int ms_engine_attach_sync(struct ms_engine *e, int id);
/* The same with the generation's own monitor name (name_size bytes, NUL-terminated). */
int ms_engine_attach_generation(struct ms_engine *e, int id, uint32_t generation, char *name, size_t name_size,
                                struct ms_coverage *out);

/* Writes attachment id: coverage of every generation and every map of the
 * current one, decoded (histograms as histograms, with task- and event-class
 * names from the engine's plans), as JSON (pretty or not) or as text. */
int ms_engine_attach_write(struct ms_engine *e, int id, FILE *f, int as_json);
/* The same, as one JSON value inside a document being written. */
struct ms_json;
int ms_engine_attach_write_json(struct ms_engine *e, int id, struct ms_json *j);

/* ---- across ranks ----
 * An engine served across ranks (ms_engine_opts.tp_lead) is watched as one
 * from rank 0: an attachment made there is carried to every other rank, which
 * verifies and attaches the same object, and the other ranks' maps and
 * coverage are read back into rank 0 (docs/design.md, "Watching the ranks as
 * one engine"). The work is done at step boundaries, over the engine's
 * transport; these calls wait for it (up to a step and the transport's
 * timeout). Elsewhere the engine is its one rank and they do nothing. */

/* (ms_engine_ranks, the ranks an attachment reaches, is in megascope/engine.h.) */
/* Carries attachment id, just attached here from object obj (size bytes,
 * named name, attached with o), to every other rank. 0; or a negative error
 * with the refusing rank named in log ("rank 1: ..." and its verifier's log),
 * every other rank's copy detached again (the caller detaches its own). */
int ms_engine_ranks_attach(struct ms_engine *e, int id, const void *obj, size_t size, const char *name,
                           const struct ms_attach_opts *o, struct ms_textbuf *log);
/* Replaces every other rank's copy of attachment id (carried by
 * ms_engine_ranks_attach) with obj, verified there, after rank 0's own replace
 * succeeded. A rank that refuses is named in log, and the attachment is then
 * detached on every other rank, so no two ranks run different programs (the
 * caller detaches its own). -ENOENT: id was never carried. */
int ms_engine_ranks_replace(struct ms_engine *e, int id, const void *obj, size_t size, const char *name,
                            const struct ms_attach_opts *o, struct ms_textbuf *log);
/* Detaches attachment id on every other rank, after a last read of its maps
 * and coverage there (kept for ms_engine_ranks_coverage and _visit as long
 * as rank 0's attachment is: its release or reap forgets them). 0, also for
 * an attachment never carried. */
int ms_engine_ranks_detach(struct ms_engine *e, int id);
/* Reads every carried attachment's maps and coverage on every other rank now. */
int ms_engine_ranks_sync(struct ms_engine *e);
/* The attachments rank r holds: rank 0's now, another rank's as last read
 * (-ENOENT before the first read). */
int ms_engine_ranks_held(struct ms_engine *e, int rank);
/* Rank r's coverage of attachment id: rank 0's own (live), another rank's as
 * last read. -ENOENT: unknown, or not carried to rank r. */
int ms_engine_ranks_coverage(struct ms_engine *e, int id, int rank, struct ms_coverage *out);
/* ms_engine_attach_visit for rank r: rank 0's own maps, or another rank's as
 * last read (copies in this process, whose memfds a reader maps like the
 * engine's own; a ring buffer's copy holds the records the rank's reads moved
 * here). fn runs under the lock of those copies and must not call this API
 * back (its view has no monitor). */
int ms_engine_ranks_visit(struct ms_engine *e, int id, int rank,
                          int (*fn)(const struct ms_attach_view *v, void *arg), void *arg);

/* Hook sites: hooks_off turns the hook checks off entirely (the baseline of
 * `bench hooks`); otherwise a site with nothing attached costs one relaxed load
 * and a branch. Set before requests are submitted. */
void ms_engine_set_hooks_enabled(struct ms_engine *e, int on);

#ifdef __cplusplus
}
#endif
#endif
