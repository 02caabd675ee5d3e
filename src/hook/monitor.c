/* SPDX-License-Identifier: MIT */
/* Monitors: an eBPF object whose every program has been verified against the
 * hook its section names, with the helpers it will run with. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hook/hook_impl.h"
#include "megascope/verifier.h"

static int check_abi(const struct ms_bpf_object *obj, struct ms_textbuf *log) {
  size_t n = 0;
  const void *p = ms_bpf_object_section(obj, "megascope_abi", &n);
  if (!p) return 0;  /* undeclared: built for the first version */
  uint32_t v = 0;
  if (n < sizeof v) {
    ms_textbuf_printf(log, "section megascope_abi: %zu bytes, expected a u32 ABI version\n", n);
    return -EINVAL;
  }
  memcpy(&v, p, sizeof v);
  if (v > MS_HOOK_ABI_VERSION) {
    ms_textbuf_printf(log, "the object was built for hook ABI version %u; this engine implements version %d\n",
                      v, MS_HOOK_ABI_VERSION);
    return -EINVAL;
  }
  return 0;
}

/* An object's schema digests: none, or 16 bytes (ms_monitor_schema_digest). */
static int check_schema(const struct ms_bpf_object *obj, struct ms_textbuf *log) {
  size_t n = 0;
  if (ms_bpf_object_section(obj, "megascope_schema", &n) && n != 2 * sizeof(uint64_t)) {
    ms_textbuf_printf(log, "section megascope_schema: %zu bytes, expected two u64 schema digests\n", n);
    return -EINVAL;
  }
  return 0;
}

int ms_hook_verify_section(const struct ms_bpf_prog *prog, const struct ms_bpf_helpers *helpers,
                           uint32_t abi_version, int verbose, struct ms_textbuf *log, struct ms_verify_stats *st) {
  struct ms_verify_opts o = {.sz = sizeof o, .kind = MS_VERIFY_HOOK, .helpers = helpers, .verbose = verbose,
                             .abi_version = abi_version};
  char why[256];
  if (!prog) return -EINVAL;
  if (ms_hook_parse_section(ms_bpf_prog_section(prog), &o.prog_type, &o.hook, why, sizeof why)) {
    ms_textbuf_printf(log, "%s\n", why);
    ms_textbuf_printf(log, "processed 0 insns (limit %u) max_states_per_insn 0 total_states 0 peak_states 0 "
                      "time_us 0 max_run_insns 0 work 0\n", MS_VERIFY_INSN_LIMIT);
    if (st)
      *st = (struct ms_verify_stats){.insn_limit = MS_VERIFY_INSN_LIMIT, .err_insn = -1,
                                     .run_budget = MS_HOOK_RUN_BUDGET, .work_limit = MS_VERIFY_WORK_LIMIT};
    return -MS_E_VERIFY;
  }
  o.ctx = ms_hook_verify_ctx(o.prog_type, o.hook);
  return ms_bpf_verify(prog, &o, log, st);
}

static int verify_prog(struct ms_monitor *m, int i, struct ms_textbuf *log) {
  const struct ms_bpf_prog *p = m->progs[i];
  const char *sec = ms_bpf_prog_section(p);
  char why[256];
  if (ms_hook_parse_section(sec, &m->type[i], &m->hook[i], why, sizeof why)) {
    ms_textbuf_printf(log, "program '%s': %s\n", ms_bpf_prog_name(p), why);
    return -EINVAL;
  }
  struct ms_verify_opts vo = {.sz = sizeof vo, .kind = MS_VERIFY_HOOK, .prog_type = m->type[i],
                              .hook = m->hook[i], .helpers = ms_hook_helpers(),
                              .ctx = ms_hook_verify_ctx(m->type[i], m->hook[i])};
  struct ms_verify_stats st;
  ms_textbuf_printf(log, "program '%s' (section %s):\n", ms_bpf_prog_name(p), sec);
  int rc = ms_bpf_verify(p, &vo, log, &st);
  return rc ? -MS_E_VERIFY : 0;
}

static struct ms_monitor *from_object(struct ms_bpf_object *obj, const char *name, struct ms_textbuf *log) {
  struct ms_monitor *m = calloc(1, sizeof *m);
  int rc = -ENOMEM;
  if (!m) goto fail;
  m->obj = obj;
  const char *base = strrchr(name, '/');
  snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : name);
  m->n_progs = (int)ms_bpf_object_prog_count(obj);
  m->progs = calloc((size_t)m->n_progs + 1, sizeof *m->progs);
  m->hook = calloc((size_t)m->n_progs + 1, sizeof *m->hook);
  m->type = calloc((size_t)m->n_progs + 1, sizeof *m->type);
  if (!m->progs || !m->hook || !m->type) goto fail;
  if ((rc = check_abi(obj, log)) || (rc = check_schema(obj, log))) goto fail;
  if (m->n_progs == 0) {
    ms_textbuf_printf(log, "%s: no programs in megascope/<type>/<hook> sections\n", m->name);
    rc = -EINVAL;
    goto fail;
  }
  for (int i = 0; i < m->n_progs; i++) {
    m->progs[i] = ms_bpf_object_prog(obj, (size_t)i);
    if ((rc = verify_prog(m, i, log))) goto fail;
  }
  return m;
fail:
  if (m) m->obj = NULL;
  ms_monitor_free(m);
  ms_bpf_object_free(obj);
  errno = rc == -MS_E_VERIFY ? MS_E_VERIFY : -rc;
  return NULL;
}

struct ms_monitor *ms_monitor_open(const char *path, struct ms_textbuf *log) {
  struct ms_bpf_object *obj = ms_bpf_object_open_file(path, log);
  if (!obj) return NULL;
  return from_object(obj, path, log);
}

struct ms_monitor *ms_monitor_open_mem(const void *buf, size_t size, const char *name,
                                       struct ms_textbuf *log) {
  struct ms_bpf_object *obj = ms_bpf_object_open_mem(buf, size, name, log);
  if (!obj) return NULL;
  return from_object(obj, name ? name : "monitor", log);
}

void ms_monitor_free(struct ms_monitor *m) {
  if (!m) return;
  ms_bpf_object_free(m->obj);
  free(m->progs);
  free(m->hook);
  free(m->type);
  free(m);
}

const char *ms_monitor_name(const struct ms_monitor *m) { return m->name; }

void ms_monitor_schema_digest(const struct ms_monitor *m, uint64_t d[2]) {
  size_t n = 0;
  const uint8_t *p = ms_bpf_object_section(m->obj, "megascope_schema", &n);
  d[0] = d[1] = 0;
  for (size_t i = 0; p && n == 2 * sizeof *d && i < n; i++) d[i / 8] |= (uint64_t)p[i] << (8 * (i % 8));
}

/* A monitor compiled against a schema (a query's bundle says which) names
 * task and event classes by that schema's ids: against a plan that numbers
 * them otherwise (another backend's: the CPU's plans fuse the pre-norms) its
 * predicates and keys would read other classes, silently. */
int ms_monitor_check_schema(const struct ms_monitor *m, const uint64_t have[2], struct ms_textbuf *log) {
  static const char *const what[2] = {"task class", "event class"};
  uint64_t want[2];
  ms_monitor_schema_digest(m, want);
  if (!want[0] && !want[1]) return 0;
  for (int i = 0; i < 2; i++) {
    if (!want[i] || want[i] == have[i]) continue;
    ms_textbuf_printf(log, "%s was compiled against another plan's %s ids (schema digest %016llx; this engine's "
                      "%016llx): compile it against this engine's schema (megascope query --socket S --emit F, or "
                      "--schema from megascope compile --backend B --schema-out)\n",
                      m->name, what[i], (unsigned long long)want[i], (unsigned long long)have[i]);
    return -EINVAL;
  }
  return 0;
}

int ms_monitor_prog_count(const struct ms_monitor *m) { return m->n_progs; }

int ms_monitor_prog_hook(const struct ms_monitor *m, int i, int *type) {
  if (i < 0 || i >= m->n_progs) return -1;
  if (type) *type = m->type[i];
  return m->hook[i];
}

const struct ms_bpf_helpers *ms_monitor_helpers(void) { return ms_hook_helpers(); }
const struct ms_bpf_object *ms_monitor_object(const struct ms_monitor *m) { return m->obj; }
