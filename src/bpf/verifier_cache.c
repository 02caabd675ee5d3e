/* SPDX-License-Identifier: MIT */
/* Verdicts remembered: a program proven safe once need not be explored again
 * with the same options. Attaching a monitor verifies each program when the
 * object is loaded (possibly on a thread of its own) and again when the JIT
 * compiles it (ms_bpf_jit_new compiles nothing it has not seen proven); with
 * this cache the second proof is a lookup, so the work of attaching happens
 * once, where the loader chose to do it, and not under the hook table's lock.
 *
 * What a verdict depends on is written out as one key: the instructions, the
 * map definitions, the prototypes of the helpers the program calls (the
 * table's contents, never its address, which a later table may reuse), and
 * every option but the log's verbosity. A lookup compares keys byte for byte
 * (the hash only finds the slot), so a verdict is reused only for the very
 * same question. Only acceptances of programs of at most MAX_INSNS
 * instructions are kept, SLOTS of them, the least recently used replaced.
 * One mutex guards the table; verification itself runs outside it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bpf/verifier_shared.h"

#define SLOTS 32
#define MAX_INSNS 8192

struct key {
  uint8_t *b;
  size_t len, cap;
  int oom;
};

struct slot {
  uint64_t hash, used;
  uint8_t *key;
  size_t key_len;
  struct ms_verify_stats st;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct slot slots[SLOTS];
static uint64_t tick;

static void put(struct key *k, const void *p, size_t n) {
  if (k->oom) return;
  if (k->len + n > k->cap) {
    size_t cap = k->cap ? k->cap : 1024;
    while (cap < k->len + n) cap *= 2;
    uint8_t *b = realloc(k->b, cap);
    if (!b) {
      k->oom = 1;
      return;
    }
    k->b = b, k->cap = cap;
  }
  memcpy(k->b + k->len, p, n);
  k->len += n;
}

static void put_u64(struct key *k, uint64_t v) { put(k, &v, sizeof v); }

static void put_str(struct key *k, const char *s) {
  size_t n = s ? strlen(s) : 0;
  put_u64(k, n);
  put(k, s ? s : "", n);
}

static void put_proto(struct key *k, uint32_t id, const struct ms_bpf_helpers *h) {
  const struct ms_bpf_helper_proto *p = h ? ms_bpf_helpers_proto(h, id) : NULL;
  put_u64(k, (uint64_t)id << 1 | (p != NULL));
  if (!p) return;
  put_u64(k, (uint64_t)p->ret << 32 | p->map_types);
  for (int a = 0; a < 5; a++) put_u64(k, (uint64_t)p->args[a]);
  put_str(k, p->name);
}

/* The context description, by value: two descriptions that say the same are
 * the same question. */
static void put_ctx(struct key *k, const struct ms_verify_ctx *c) {
  put_u64(k, c != NULL);
  if (!c) return;
  put_str(k, c->hook);
  put_str(k, c->prog_type);
  put_u64(k, c->size);
  put_u64(k, (uint64_t)c->n_fields);
  for (int i = 0; i < c->n_fields && c->fields; i++) {
    put_str(k, c->fields[i].name);
    put_u64(k, (uint64_t)c->fields[i].offset << 32 | c->fields[i].size);
  }
  put_u64(k, c->defined);
  put_u64(k, c->abi_version);
  put_u64(k, c->run_budget);
  put_str(k, c->refused);
  put_u64(k, (uint64_t)c->n_helpers);
  for (int i = 0; i < c->n_helpers && c->helpers; i++) put_u64(k, c->helpers[i]);
  put_u64(k, (uint64_t)(c->refused != NULL) << 3 | (uint64_t)(c->helpers != NULL) << 2 |
                (uint64_t)c->no_map_writes << 1 | (uint64_t)c->ret_bounded);
  put_u64(k, c->ret_max);
  put_str(k, c->restricted_why);
}

/* The question, written out; 0 when it is too large to keep. */
static int key_of(const struct ms_bpf_prog *prog, const struct ms_verify_opts *o, struct key *k) {
  size_t n;
  const struct ms_bpf_insn *insns = ms_bpf_prog_insns(prog, &n);
  if (n > MAX_INSNS) return 0;
  struct ms_verify_opts f;
  memset(&f, 0, sizeof f); /* padding too: the key is compared as bytes */
  f.kind = o->kind, f.prog_type = o->prog_type, f.hook = o->hook, f.mem_size = o->mem_size;
  f.insn_limit = o->insn_limit, f.max_states_per_insn = o->max_states_per_insn;
  f.abi_version = o->abi_version, f.run_budget = o->run_budget, f.work_limit = o->work_limit;
  put(k, &f, sizeof f);
  put_ctx(k, o->kind == MS_VERIFY_HOOK ? o->ctx : NULL);
  put_u64(k, n);
  put(k, insns, n * sizeof *insns);
  size_t nm = ms_bpf_prog_map_count(prog);
  put_u64(k, nm);
  for (size_t i = 0; i < nm; i++) put(k, ms_bpf_prog_map(prog, i), sizeof(struct ms_bpf_map_def));
  for (size_t i = 0; i < n; i++) {
    const struct ms_bpf_insn *in = &insns[i];
    if (in->code == (MS_BPF_JMP | MS_BPF_CALL) && in->src_reg == 0) put_proto(k, (uint32_t)in->imm, o->helpers);
  }
  return !k->oom;
}

static uint64_t hash_of(const struct key *k) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (size_t i = 0; i < k->len; i++) h = (h ^ k->b[i]) * 0x100000001b3ull;
  return h | 1; /* 0 marks an empty slot */
}

int ms_bpf_vcache_lookup(const struct ms_bpf_prog *prog, const struct ms_verify_opts *o,
                         struct ms_verify_stats *st) {
  struct key k = {0};
  int hit = 0;
  if (key_of(prog, o, &k)) {
    uint64_t h = hash_of(&k);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < SLOTS && !hit; i++) {
      struct slot *s = &slots[i];
      if (s->hash != h || s->key_len != k.len || memcmp(s->key, k.b, k.len)) continue;
      s->used = ++tick;
      *st = s->st;
      hit = 1;
    }
    pthread_mutex_unlock(&mu);
  }
  free(k.b);
  return hit;
}

void ms_bpf_vcache_store(const struct ms_bpf_prog *prog, const struct ms_verify_opts *o,
                         const struct ms_verify_stats *st) {
  struct key k = {0};
  if (!key_of(prog, o, &k)) {
    free(k.b);
    return;
  }
  uint64_t h = hash_of(&k);
  pthread_mutex_lock(&mu);
  struct slot *victim = &slots[0];
  for (int i = 0; i < SLOTS; i++) {
    struct slot *s = &slots[i];
    if (s->hash == h && s->key_len == k.len && !memcmp(s->key, k.b, k.len)) { /* stored meanwhile */
      victim = NULL;
      break;
    }
    if (s->used < victim->used) victim = s;
  }
  if (victim) {
    free(victim->key);
    *victim = (struct slot){.hash = h, .used = ++tick, .key = k.b, .key_len = k.len, .st = *st};
    k.b = NULL;
  }
  pthread_mutex_unlock(&mu);
  free(k.b);
}
