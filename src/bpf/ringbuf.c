/* SPDX-License-Identifier: MIT */
/* The ring buffer map's records, with Linux's semantics (kernel/bpf/ringbuf.c):
 * the consumer here, the producers' side in core/map_core.h.
 *
 * DESIGN. Producers are engine workers (any number, from helpers 130-133);
 * the consumer is one thread, in this process or another (it maps the
 * consumer position page writable). Data bytes are a power of two, mapped
 * twice back to back so a record that wraps is contiguous.
 *   - reserve: under a short spinlock among producers, read the consumer
 *     position (acquire), and if the record fits, write its header with the
 *     BUSY bit and publish the new producer position (release). Producers
 *     never wait for the consumer: a record that does not fit is dropped and
 *     counted in `lost` (relaxed; a statistic).
 *   - submit / discard: clear BUSY (setting DISCARD for a discard) with a
 *     release store of the header word, so the record's bytes are visible
 *     before the consumer sees it done. Records may complete out of order.
 *   - consume: read the producer position (acquire), then each header word
 *     (acquire); stop at the first BUSY record; skip DISCARD ones; after a
 *     record is handled, publish the new consumer position (release) so
 *     producers may reuse the space.
 * Shutdown: nothing to stop; a record left BUSY blocks the consumer, which is
 * why the interpreter discards any record a run leaves behind. */
#include <errno.h>
#include <string.h>

#include "bpf/map_view.h"

static uint64_t round8(uint64_t x) { return (x + 7) & ~7ull; }

/* reserve and release: ms_mapc_ring_reserve and ms_mapc_ring_release
 * (core/map_core.h, the device's too), called from maps.c. */

int ringbuf_consume(struct map_view *v, ms_bpf_ringbuf_fn fn, void *user) {
  uint64_t cons = __atomic_load_n(v->cons_pos, __ATOMIC_RELAXED); /* only we write it */
  uint64_t prod = __atomic_load_n(v->prod_pos, __ATOMIC_ACQUIRE);
  int n = 0;
  while (cons < prod) {
    const uint32_t *hdr = (const uint32_t *)(v->data + (cons & (v->ring_size - 1)));
    uint32_t word = __atomic_load_n(hdr, __ATOMIC_ACQUIRE);
    if (word & MS_BPF_RINGBUF_BUSY_BIT) break;
    uint32_t len = word & ~MS_BPF_RINGBUF_DISCARD_BIT;
    if (len > v->ring_size - MS_BPF_RINGBUF_HDR_SIZE || round8(len + MS_BPF_RINGBUF_HDR_SIZE) > prod - cons)
      return -EIO; /* not a record a producer wrote: the memory is corrupt */
    if (!(word & MS_BPF_RINGBUF_DISCARD_BIT)) {
      int r = fn(user, hdr + 2, len);
      if (r < 0) return r;
      n++;
    }
    cons += round8(len + MS_BPF_RINGBUF_HDR_SIZE);
    __atomic_store_n(v->cons_pos, cons, __ATOMIC_RELEASE);
  }
  return n;
}
