/* SPDX-License-Identifier: MIT */
/* Ring-buffer readers for the "records" command: descriptors of an
 * attachment's ring-buffer maps that a reader in another process can consume
 * (ms_bpf_map_reader_new with MS_BPF_READER_CONSUME maps the consumer position
 * writable, so the memfd is reopened read-write, not read-only as for "maps"),
 * and the record layout each map's records have, from the object's BTF.
 *
 * A ring buffer's map carries no value type (Linux rejects one), so the record
 * type is found by name: a struct named after the map (`step_events`), or
 * after it without its final 's' (`step_event`), or with `_rec`, `_record` or
 * `_event` appended. Members become fields (name, byte offset, size, and a
 * type: u8..u64, s8..s64, char[N], or bytes for anything else); without such a
 * struct the layout is null and a reader shows a record as its u64 words. */
#include <bpf/btf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/control_impl.h"
#include "megascope/attach.h"
#include "megascope/bpf.h"
#include "megascope/json.h"

/* The type behind typedefs and qualifiers. */
static const struct btf_type *resolve(const struct btf *btf, uint32_t *id) {
  const struct btf_type *t = btf__type_by_id(btf, *id);
  for (int depth = 0; t && depth < 32; depth++) {
    int k = btf_kind(t);
    if (k != BTF_KIND_TYPEDEF && k != BTF_KIND_CONST && k != BTF_KIND_VOLATILE && k != BTF_KIND_RESTRICT &&
        k != BTF_KIND_TYPE_TAG)
      return t;
    *id = t->type;
    t = btf__type_by_id(btf, *id);
  }
  return NULL;
}

static void field_type(const struct btf *btf, uint32_t id, int64_t size, char *out, size_t n) {
  const struct btf_type *t = resolve(btf, &id);
  snprintf(out, n, "bytes");
  if (!t) return;
  if ((btf_is_int(t) || btf_is_enum(t)) && (size == 1 || size == 2 || size == 4 || size == 8)) {
    int is_signed = btf_is_int(t) ? (btf_int_encoding(t) & BTF_INT_SIGNED) != 0 : 0;
    snprintf(out, n, "%c%lld", is_signed ? 's' : 'u', (long long)size * 8);
  } else if (btf_is_ptr(t)) {
    snprintf(out, n, "u64");
  } else if (btf_is_array(t)) {
    uint32_t elem = btf_array(t)->type;
    const struct btf_type *e = resolve(btf, &elem);
    const char *en = e ? btf__name_by_offset(btf, e->name_off) : NULL;
    /* clang encodes char as a signed 1-byte int named "char" (BTF_INT_CHAR is rarely set) */
    if (e && btf_is_int(e) && e->size == 1 && ((btf_int_encoding(e) & BTF_INT_CHAR) || (en && strstr(en, "char"))))
      snprintf(out, n, "char[%u]", btf_array(t)->nelems);
  }
}

/* The struct named for map `name`, or -1. */
static int record_type(const struct btf *btf, const char *name, char *found, size_t n) {
  char cand[5][96];
  size_t len = strlen(name);
  if (len > 63) len = 63;  /* map names are at most 63 bytes */
  snprintf(cand[0], sizeof cand[0], "%.*s", (int)len, name);
  snprintf(cand[1], sizeof cand[1], "%.*s", (int)(len && name[len - 1] == 's' ? len - 1 : len), name);
  snprintf(cand[2], sizeof cand[2], "%.*s_rec", (int)len, name);
  snprintf(cand[3], sizeof cand[3], "%.*s_record", (int)len, name);
  snprintf(cand[4], sizeof cand[4], "%.*s_event", (int)len, name);
  for (int i = 0; i < 5; i++) {
    int id = btf__find_by_name_kind(btf, cand[i], BTF_KIND_STRUCT);
    if (id > 0) {
      snprintf(found, n, "%.80s", cand[i]);
      return id;
    }
  }
  return -1;
}

/* Writes map `name`'s record layout: "record", "size", "fields" or
 * "record": null when the BTF has no struct for it. */
static void write_layout(struct ms_json *j, const struct btf *btf, const char *name) {
  char tname[96];
  int id = btf ? record_type(btf, name, tname, sizeof tname) : -1;
  const struct btf_type *t = id > 0 ? btf__type_by_id(btf, (uint32_t)id) : NULL;
  if (!t) {
    ms_json_kstr(j, "decoded", "u64 words");
    ms_json_key(j, "record");
    ms_json_null(j);
    return;
  }
  ms_json_kstr(j, "decoded", "btf");
  ms_json_kstr(j, "record", tname);
  ms_json_kuint(j, "size", t->size);
  ms_json_key(j, "fields");
  ms_json_arr_begin(j);
  const struct btf_member *m = btf_members(t);
  for (uint32_t i = 0; i < btf_vlen(t); i++) {
    uint32_t bits = btf_member_bit_offset(t, i), bsize = btf_member_bitfield_size(t, i);
    int64_t size = btf__resolve_size(btf, m[i].type);
    const char *fname = btf__name_by_offset(btf, m[i].name_off);
    if (bsize || bits % 8 || size <= 0 || !fname || !fname[0]) continue;  /* bitfields, anonymous members */
    char ty[32];
    field_type(btf, m[i].type, size, ty, sizeof ty);
    ms_json_obj_begin(j);
    ms_json_kstr(j, "name", fname);
    ms_json_kuint(j, "offset", bits / 8);
    ms_json_kuint(j, "size", (uint64_t)size);
    ms_json_kstr(j, "type", ty);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
}

struct ring_fds {
  struct ms_json *j;
  int *fds;
  char (*names)[64];
  int max;
  uint32_t *generation;
  int rank;                  /* across ranks: whose rings (0: this engine's own) */
  void *btf_raw;             /* another rank's: rank 0's object's BTF, copied first */
  size_t btf_size;
};

/* Under the lock of the engine's attachments: a copy of the object's BTF. */
static int copy_btf(const struct ms_attach_view *v, void *arg) {
  struct ring_fds *o = arg;
  size_t size = 0;
  const void *raw = ms_bpf_object_section(ms_monitor_object(v->mon), ".BTF", &size);
  if (raw && size && (o->btf_raw = malloc(size))) memcpy(o->btf_raw, raw, size), o->btf_size = size;
  return 0;
}

/* Under the lock of the engine's attachments (ms_engine_attach_visit), or of
 * its copies of another rank's maps (ms_engine_ranks_visit: the BTF copied
 * before): the generation's ring buffers reopened read-write, and their
 * layouts. */
static int reopen_rings(const struct ms_attach_view *v, void *arg) {
  struct ring_fds *o = arg;
  struct ms_json *j = o->j;
  int n = 0, rc = 0;
  *o->generation = v->generation;
  size_t btf_size = o->btf_size;
  const void *raw = o->btf_raw;
  if (v->mon) raw = ms_bpf_object_section(ms_monitor_object(v->mon), ".BTF", &btf_size);
  struct btf *btf = raw && btf_size ? btf__new(raw, (uint32_t)btf_size) : NULL;  /* NULL + errno on failure */
  int n_rings = 0;  /* each ring's wake-up eventfd goes after all the memfds, while descriptors remain */
  for (int i = 0; i < v->n_maps; i++) n_rings += ms_bpf_map_info(v->maps[i])->type == MS_BPF_MAP_RINGBUF;
  if (n_rings > o->max) n_rings = o->max;
  int n_wake = 0, wake_at[MS_CONTROL_MAX_FDS], wake_ring[MS_CONTROL_MAX_FDS];
  ms_json_key(j, "maps");
  ms_json_arr_begin(j);
  for (int i = 0; i < v->n_maps && n < o->max; i++) {
    const struct ms_bpf_map_def *def = ms_bpf_map_info(v->maps[i]);
    if (def->type != MS_BPF_MAP_RINGBUF) continue;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", ms_bpf_map_fd(v->maps[i]));
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      rc = -errno;
      break;
    }
    o->fds[n] = fd;
    snprintf(o->names[n], 64, "%s", def->name);
    n++;
    ms_json_obj_begin(j);
    if (o->rank) {  /* another rank's ring: its records moved here at rank 0's reads */
      char nm[96];
      snprintf(nm, sizeof nm, "%s@rank%d", def->name, o->rank);
      ms_json_kstr(j, "name", nm);
      ms_json_kint(j, "rank", o->rank);
    } else {
      ms_json_kstr(j, "name", def->name);
    }
    ms_json_kuint(j, "ring_bytes", def->max_entries);
    int wfd = ms_bpf_map_wake_fd(v->maps[i]), wake = -1;
    if (wfd >= 0 && n_rings + n_wake < o->max && (wake_at[n_wake] = fcntl(wfd, F_DUPFD_CLOEXEC, 0)) >= 0) {
      wake_ring[n_wake] = n - 1;
      wake = n_rings + n_wake++;
    }
    ms_json_kint(j, "wake", wake);  /* the index of its wake-up eventfd among the descriptors, -1: poll it */
    write_layout(j, btf, def->name);
    ms_json_obj_end(j);
  }
  ms_json_arr_end(j);
  btf__free(btf);
  for (int k = 0; k < n_wake; k++) {  /* without an error every ring was handed over: n == n_rings */
    if (rc) {
      close(wake_at[k]);
      continue;
    }
    o->fds[n_rings + k] = wake_at[k];
    char ring[64];
    memcpy(ring, o->names[wake_ring[k]], sizeof ring);
    snprintf(o->names[n_rings + k], 64, "%.58s.wake", ring);
  }
  if (rc) {
    while (n) close(o->fds[--n]);
    return rc;
  }
  return n + n_wake;
}

int ms_control_ring_fds(struct ms_engine *e, int id, int rank, struct ms_json *j, int *fds, char (*names)[64],
                        int max, uint32_t *generation) {
  struct ring_fds o = {j, fds, names, max, generation, rank, NULL, 0};
  if (!rank) return ms_engine_attach_visit(e, id, reopen_rings, &o);
  /* the copies' lock is taken alone, never inside the attachments' */
  int rc = ms_engine_attach_visit(e, id, copy_btf, &o);
  if (rc >= 0) rc = ms_engine_ranks_visit(e, id, rank, reopen_rings, &o);
  free(o.btf_raw);
  return rc;
}
