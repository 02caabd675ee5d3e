/* SPDX-License-Identifier: MIT */
/* The hash map's state machine and the ring buffer's producer side over a
 * map's shared-memory layout, and the lookup, update and delete of Linux's
 * helpers over it, written once for the reference maps (maps.c,
 * ringbuf.c) and the device's (src/core/bpf_core.h), and the decoding of
 * that layout;
 * C11 and CUDA. maps.c's DESIGN says the protocol: a slot goes EMPTY ->
 * CLAIMING (its key being written) -> LIVE, LIVE -> KEYED on a delete (the key
 * keeps its slot), KEYED -> WRITING -> LIVE on a new insert; keys hash with
 * FNV-1a and an avalanche, probing is linear over a power-of-two slot count;
 * the live count is reserved before a slot turns LIVE; an insert zeroes the
 * other workers' value slots of a per-worker map. The includer defines:
 *
 *   MS_MAPC_FN            qualifiers of the functions defined here
 *   MS_MAPC_VIEW          its decoded view: hdr (struct ms_bpf_map_shm *, for
 *                         count and lost), base, type, key_size, value_size, max_entries,
 *                         n_workers, key_stride, value_stride (a multiple of 8),
 *                         n_slots, state, keys, values; for a ring buffer
 *                         cons_pos, prod_pos, prod_lock, data, ring_size
 *   MS_MAPC_RELAX(spins)  what a waiter does on its spins-th spin
 *   MS_MAPC_HD            qualifiers of the layout's decoding where host code
 *                         calls it too (default MS_MAPC_FN)
 *   MS_MAPC_RING_SPARE    1 when a ring's data has ring_size spare bytes after
 *                         it instead of a second mapping (the device)
 *
 * and has included core/atomics.h. */
#ifndef MS_CORE_MAP_CORE_H
#define MS_CORE_MAP_CORE_H

#ifndef MS_MAPC_HD /* what the host side of a device build calls too (the layout's decoding) */
#define MS_MAPC_HD MS_MAPC_FN
#endif

/* Decodes the layout of header h (already checked: it comes from map_layout)
 * for the image at base into m's common fields; the others are the
 * includer's. The image need not be readable from the caller (a device
 * mirror): only h is read. */
MS_MAPC_HD void ms_mapc_view_init(MS_MAPC_VIEW *m, const struct ms_bpf_map_shm *h, uint8_t *base) {
  m->hdr = (struct ms_bpf_map_shm *)base;
  m->base = base;
  m->type = h->type;
  m->key_size = h->key_size;
  m->value_size = h->value_size;
  m->max_entries = h->max_entries;
  m->n_workers = h->n_workers;
  m->key_stride = h->key_stride;
  m->value_stride = h->value_stride;
  m->n_slots = h->n_slots;
  if (h->type == MS_BPF_MAP_RINGBUF) {
    m->cons_pos = (uint64_t *)(base + h->ring_cons_off);
    m->prod_pos = (uint64_t *)(base + h->ring_prod_off);
    m->prod_lock = (uint32_t *)(base + h->ring_prod_off + 8);
    m->data = base + h->ring_data_off;
    m->ring_size = h->ring_size;
    return;
  }
  if (h->type == MS_BPF_MAP_HASH || h->type == MS_BPF_MAP_PERCPU_HASH) {
    m->state = (uint32_t *)(base + h->state_off);
    m->keys = base + h->key_off;
  }
  m->values = base + h->value_off;
}

MS_MAPC_FN uint8_t *ms_mapc_value_at(const MS_MAPC_VIEW *m, uint32_t slot, uint32_t worker) {
  return m->values + ((uint64_t)worker * m->n_slots + slot) * m->value_stride;
}

/* FNV-1a 64 with a final avalanche; readers in other languages use the same. */
MS_MAPC_FN uint64_t ms_mapc_key_hash(const void *key, uint32_t size) {
  const uint8_t *p = (const uint8_t *)key;
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t i = 0; i < size; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

/* Waits while a slot is CLAIMING (its key is being written): the new state,
 * or CLAIMING when bounded and it gave up (a reader in another process must
 * not wait on a writer that died). */
MS_MAPC_FN uint32_t ms_mapc_wait_claimed(uint32_t *st, int bounded) {
  uint32_t s;
  for (uint64_t spins = 0; (s = ms_at_ld_acq32(st)) == MS_BPF_SLOT_CLAIMING; spins++) {
    if (bounded && spins > (1u << 22)) break;
    MS_MAPC_RELAX(spins);
  }
  return s;
}

MS_MAPC_FN int ms_mapc_key_equals(const MS_MAPC_VIEW *m, uint32_t b, const void *key) {
  const uint8_t *k = m->keys + (uint64_t)b * m->key_stride, *q = (const uint8_t *)key;
  for (uint32_t i = 0; i < m->key_size; i++)
    if (k[i] != q[i]) return 0;
  return 1;
}

/* The slot of key, or -1 (see ms_mapc_wait_claimed for bounded). */
MS_MAPC_FN int64_t ms_mapc_hash_find(const MS_MAPC_VIEW *m, const void *key, int bounded) {
  uint64_t h = ms_mapc_key_hash(key, m->key_size);
  uint32_t mask = m->n_slots - 1;
  for (uint32_t i = 0; i < m->n_slots; i++) {
    uint32_t b = (uint32_t)(h + i) & mask;
    uint32_t s = ms_at_ld_acq32(&m->state[b]);
    if (s == MS_BPF_SLOT_EMPTY) return -1;
    if (s == MS_BPF_SLOT_CLAIMING && ms_mapc_wait_claimed(&m->state[b], bounded) == MS_BPF_SLOT_CLAIMING)
      continue;
    if (ms_mapc_key_equals(m, b, key)) return b;
  }
  return -1;
}

/* Finds key's slot or claims an empty one for it (*claimed = 1, state left
 * CLAIMING with the key written). -1 when every slot holds another key. The
 * CAS is acq_rel: on success the key's writes follow the claim; on failure
 * the winner's state is seen (and, once it leaves CLAIMING, its key). */
MS_MAPC_FN int64_t ms_mapc_find_or_claim(const MS_MAPC_VIEW *m, const void *key, int *claimed) {
  uint64_t h = ms_mapc_key_hash(key, m->key_size);
  uint32_t mask = m->n_slots - 1;
  *claimed = 0;
  for (uint32_t i = 0; i < m->n_slots; i++) {
    uint32_t b = (uint32_t)(h + i) & mask;
    uint32_t s = ms_at_ld_acq32(&m->state[b]);
    if (s == MS_BPF_SLOT_EMPTY && ms_at_cas32(&m->state[b], &s, MS_BPF_SLOT_CLAIMING)) {
      ms_at_copy_in(m->keys + (uint64_t)b * m->key_stride, key, m->key_size);
      *claimed = 1;
      return b;
    }
    if (s == MS_BPF_SLOT_CLAIMING) ms_mapc_wait_claimed(&m->state[b], 0);
    if (ms_mapc_key_equals(m, b, key)) return b;
  }
  return -1;
}

/* Reserves one of max_entries live entries (relaxed: the count bounds, it
 * orders nothing). */
MS_MAPC_FN int ms_mapc_count_reserve(const MS_MAPC_VIEW *m) {
  if (ms_at_fetch_add64(&m->hdr->count, 1) < m->max_entries) return 0;
  ms_at_fetch_add64(&m->hdr->count, (uint64_t)-1);
  return -E2BIG;
}

/* Writes the value of a slot that is not yet LIVE, then publishes it. */
MS_MAPC_FN void ms_mapc_publish(const MS_MAPC_VIEW *m, uint32_t b, const void *value, uint32_t worker) {
  for (uint32_t w = 0; w < m->n_workers; w++) {
    if (w == worker) continue;
    uint8_t *v = ms_mapc_value_at(m, b, w);
    for (uint32_t i = 0; i < m->value_stride; i += 8) ms_at_st_rlx64((uint64_t *)(v + i), 0);
  }
  ms_at_copy_in(ms_mapc_value_at(m, b, worker), value, m->value_size);
  ms_at_st_rel32(&m->state[b], MS_BPF_SLOT_LIVE);
}

/* Linux's map_update_elem on a hash: flags MS_BPF_ANY, NOEXIST or EXIST. */
MS_MAPC_FN int ms_mapc_hash_update(const MS_MAPC_VIEW *m, const void *key, const void *value, uint64_t flags,
                                   uint32_t worker) {
  int claimed = 0;
  int64_t b = flags == MS_BPF_EXIST ? ms_mapc_hash_find(m, key, 0) : ms_mapc_find_or_claim(m, key, &claimed);
  if (b < 0) return flags == MS_BPF_EXIST ? -ENOENT : -E2BIG;
  uint32_t *st = &m->state[b];
  if (flags != MS_BPF_EXIST && claimed) {
    if (ms_mapc_count_reserve(m)) {
      ms_at_st_rel32(st, MS_BPF_SLOT_KEYED); /* the key keeps its slot */
      return -E2BIG;
    }
    ms_mapc_publish(m, (uint32_t)b, value, worker);
    return 0;
  }
  for (uint64_t spins = 0;; spins++) {
    uint32_t s = ms_at_ld_acq32(st);
    if (s == MS_BPF_SLOT_LIVE) {
      if (flags == MS_BPF_NOEXIST) return -EEXIST;
      ms_at_copy_in(ms_mapc_value_at(m, (uint32_t)b, worker), value, m->value_size);
      return 0;
    }
    if (s == MS_BPF_SLOT_KEYED) {
      if (flags == MS_BPF_EXIST) return -ENOENT;
      if (!ms_at_cas32(st, &s, MS_BPF_SLOT_WRITING)) continue;
      if (ms_mapc_count_reserve(m)) {
        ms_at_st_rel32(st, MS_BPF_SLOT_KEYED);
        return -E2BIG;
      }
      ms_mapc_publish(m, (uint32_t)b, value, worker);
      return 0;
    }
    MS_MAPC_RELAX(spins); /* WRITING: another insert of this key is publishing it */
  }
}

MS_MAPC_FN int ms_mapc_hash_delete(const MS_MAPC_VIEW *m, const void *key) {
  int64_t b = ms_mapc_hash_find(m, key, 0);
  if (b < 0) return -ENOENT;
  for (uint64_t spins = 0;; spins++) {
    uint32_t s = ms_at_ld_acq32(&m->state[b]);
    if (s == MS_BPF_SLOT_KEYED) return -ENOENT;
    if (s == MS_BPF_SLOT_LIVE) {
      if (ms_at_cas32(&m->state[b], &s, MS_BPF_SLOT_KEYED)) {
        ms_at_fetch_add64(&m->hdr->count, (uint64_t)-1);
        return 0;
      }
      continue;
    }
    MS_MAPC_RELAX(spins);
  }
}

/* ---- the map operations, as Linux's helpers see them ---- */

MS_MAPC_FN int ms_mapc_is_hash(uint32_t t) { return t == MS_BPF_MAP_HASH || t == MS_BPF_MAP_PERCPU_HASH; }
MS_MAPC_FN int ms_mapc_is_percpu(uint32_t t) { return t == MS_BPF_MAP_PERCPU_HASH || t == MS_BPF_MAP_PERCPU_ARRAY; }

/* The value of key for worker (its own slot of a per-worker map), or NULL. */
MS_MAPC_FN void *ms_mapc_lookup(const MS_MAPC_VIEW *m, const void *key, uint32_t worker) {
  uint32_t w = ms_mapc_is_percpu(m->type) ? worker : 0;
  if (w >= m->n_workers) return 0;
  if (ms_mapc_is_hash(m->type)) {
    int64_t b = ms_mapc_hash_find(m, key, 0);
    if (b < 0 || ms_at_ld_acq32(&m->state[b]) != MS_BPF_SLOT_LIVE) return 0;
    return ms_mapc_value_at(m, (uint32_t)b, w);
  }
  uint32_t idx = (uint32_t)ms_at_load(key, 4);
  if (m->type == MS_BPF_MAP_RINGBUF || idx >= m->max_entries) return 0;
  return ms_mapc_value_at(m, idx, w);
}

/* Linux's map_update_elem: its flags and its errors. */
MS_MAPC_FN int ms_mapc_update(const MS_MAPC_VIEW *m, const void *key, const void *value, uint64_t flags,
                              uint32_t worker) {
  uint32_t w = ms_mapc_is_percpu(m->type) ? worker : 0;
  if (flags > MS_BPF_EXIST || w >= m->n_workers) return -EINVAL;
  if (ms_mapc_is_hash(m->type)) return ms_mapc_hash_update(m, key, value, flags, w);
  if (m->type == MS_BPF_MAP_RINGBUF) return -EINVAL;
  uint32_t idx = (uint32_t)ms_at_load(key, 4);
  if (idx >= m->max_entries) return -E2BIG;
  if (flags == MS_BPF_NOEXIST) return -EEXIST; /* array elements always exist */
  ms_at_copy_in(ms_mapc_value_at(m, idx, w), value, m->value_size);
  return 0;
}

MS_MAPC_FN int ms_mapc_delete(const MS_MAPC_VIEW *m, const void *key) {
  if (!ms_mapc_is_hash(m->type)) return -EINVAL;
  return ms_mapc_hash_delete(m, key);
}

/* ---- the ring buffer (ringbuf.c's DESIGN) ---- */

/* A short spinlock among producers: test, then test-and-set. */
MS_MAPC_FN void ms_mapc_ring_lock(uint32_t *l) {
  for (uint64_t spins = 0; ms_at_xchg32_acq(l, 1); spins++)
    while (ms_at_ld_rlx32(l)) MS_MAPC_RELAX(spins);
}

/* A record of `size` bytes, its header written BUSY; NULL when it does not fit
 * (counted in the header's lost: producers never wait for the consumer). */
MS_MAPC_FN void *ms_mapc_ring_reserve(const MS_MAPC_VIEW *m, uint64_t size) {
  if (size == 0 || size > m->ring_size - MS_BPF_RINGBUF_HDR_SIZE || size >= MS_BPF_RINGBUF_DISCARD_BIT)
    return 0;
  uint64_t len = (size + MS_BPF_RINGBUF_HDR_SIZE + 7) & ~7ull;
  ms_mapc_ring_lock(m->prod_lock);
  uint64_t cons = ms_at_ld_acq64(m->cons_pos);
  uint64_t prod = ms_at_ld_rlx64(m->prod_pos); /* only producers, under the lock */
  if (prod + len - cons > m->ring_size) {
    ms_at_st_rel32(m->prod_lock, 0);
    ms_at_fetch_add64(&m->hdr->lost, 1);
    return 0;
  }
  uint64_t at = prod & (m->ring_size - 1);
  uint32_t *hdr = (uint32_t *)(m->data + at);
  ms_at_st_rlx32(&hdr[0], (uint32_t)size | MS_BPF_RINGBUF_BUSY_BIT);
  hdr[1] = (uint32_t)at;
  ms_at_st_rel64(m->prod_pos, prod + len);
  ms_at_st_rel32(m->prod_lock, 0);
  return m->data + at + MS_BPF_RINGBUF_HDR_SIZE;
}

/* Submit or discard: the header's release store makes the record's bytes
 * visible before the consumer sees it done. Where the data is not mapped twice
 * (MS_MAPC_RING_SPARE: ring_size spare bytes after it, the device's), a record
 * that wrapped was written past the end: its wrapped part moves to the start
 * first. */
MS_MAPC_FN void ms_mapc_ring_release(const MS_MAPC_VIEW *m, void *rec, int discard) {
  uint32_t *hdr = (uint32_t *)((uint8_t *)rec - MS_BPF_RINGBUF_HDR_SIZE);
  uint32_t len = ms_at_ld_rlx32(hdr) & ~(MS_BPF_RINGBUF_BUSY_BIT | MS_BPF_RINGBUF_DISCARD_BIT);
#if MS_MAPC_RING_SPARE
  uint64_t end = (uint64_t)hdr[1] + MS_BPF_RINGBUF_HDR_SIZE + len;
  if (!discard && end > m->ring_size) ms_at_bytes_copy(m->data, m->data + m->ring_size, end - m->ring_size);
#else
  (void)m;
#endif
  ms_at_st_rel32(hdr, len | (discard ? MS_BPF_RINGBUF_DISCARD_BIT : 0));
}

#endif
