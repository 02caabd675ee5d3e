/* SPDX-License-Identifier: MIT */
/* Private to src/bpf: a decoded view of one map's shared memory. The engine's
 * struct ms_bpf_map and a reader in another process (struct
 * ms_bpf_map_reader) both hold one, so lookups, iteration and ring buffer
 * consumption are the same code on both sides. */
#ifndef MS_BPF_MAP_VIEW_H
#define MS_BPF_MAP_VIEW_H

#include <stdint.h>

#include "megascope/bpf.h"

struct map_view {
  struct ms_bpf_map_shm *hdr; /* read-only mapping on the reader's side */
  uint8_t *base;
  uint32_t type, key_size, value_size, max_entries, n_workers;
  uint32_t key_stride, value_stride, n_slots;
  uint32_t *state;   /* hash: one per slot */
  uint8_t *keys;     /* hash: key_stride per slot */
  uint8_t *values;   /* [n_workers][n_slots] value_stride each */
  uint64_t *cons_pos; /* ring buffer */
  uint64_t *prod_pos;
  uint32_t *prod_lock;
  uint8_t *data;     /* ring data, mapped twice back to back */
  uint64_t ring_size;
};

/* Fills hdr's layout for def (validating def); page is the page size. */
int map_layout(const struct ms_bpf_map_def *def, uint32_t n_workers, uint64_t page,
               struct ms_bpf_map_shm *hdr, struct ms_textbuf *log);
/* Points v's fields into the mapping at base, as the (checked) layout says;
 * v->hdr is the live header at base. */
void map_view_init(struct map_view *v, const struct ms_bpf_map_shm *layout, uint8_t *base);

/* Word-wise copy out: 8-byte words move with relaxed atomics so that a reader
 * in another process never sees a torn counter (the copy in is core/atomics.h's
 * ms_at_copy_in). */
void map_copy_out(void *dst, const void *src, size_t n);

/* The value slot of (slot, worker). */
static inline uint8_t *map_value_at(const struct map_view *v, uint32_t slot, uint32_t worker) {
  return v->values + ((uint64_t)worker * v->n_slots + slot) * v->value_stride;
}

/* Hash slot of key, or -1: waits for a slot being claimed (in-process writers
 * must) unless bounded, when it gives up on it after a while (readers). */
int64_t map_hash_find(const struct map_view *v, const void *key, int bounded);
int map_view_foreach(const struct map_view *v, ms_bpf_map_entry_fn fn, void *user);
int map_view_lookup_copy(const struct map_view *v, const void *key, void *out);

/* Ring buffer: the producers (maps.c, through core/map_core.h), the consumer (ringbuf.c). */
void *ringbuf_reserve(struct map_view *v, uint64_t size);
void ringbuf_release(struct map_view *v, void *rec, int discard);
int ringbuf_consume(struct map_view *v, ms_bpf_ringbuf_fn fn, void *user);

#endif
