/* SPDX-License-Identifier: MIT */
/* The environment of one verification, as every verifier file uses it: the
 * log (the verbose trace, cut before it crowds out the last lines, and the
 * rejection that names its instruction), the current frame's registers and
 * fresh ids. The driver (verifier.c) and the memory checks (verifier_mem.c)
 * both call these; neither calls the other back. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "bpf/verifier_shared.h"

/* ---- the log ------------------------------------------------------------ */

/* Verbose lines stop before they could crowd out the last lines. */
void ms_bpf_vtrace(struct ms_bpf_venv *env, const char *fmt, ...) {
  struct ms_textbuf *tb = env->log;
  if (!env->o.verbose || !tb || !tb->buf || env->log_cut) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (tb->len + (size_t)n + env->log_reserve >= tb->size) {
    env->log_cut = 1;
    ms_textbuf_printf(tb, "... (verbose trace cut: the log buffer is full)\n");
    return;
  }
  ms_textbuf_printf(tb, "%s", line);
}

void ms_bpf_vinsn_text(const struct ms_bpf_venv *env, uint32_t pc, char *buf, size_t size) {
  if (ms_bpf_insn_linux(env->insns, env->n, pc, buf, size) < 0) snprintf(buf, size, "?");
}

void ms_bpf_vtrace_state(struct ms_bpf_venv *env, const char *prefix) {
  if (!env->o.verbose || env->log_cut || !env->cur) return;
  char *buf = malloc(8192);
  if (!buf) return;
  ms_bpf_vs_print(env->cur, env->prog, buf, 8192);
  ms_bpf_vtrace(env, "%s%s\n", prefix, buf);
  free(buf);
}

int ms_bpf_vreject(struct ms_bpf_venv *env, const char *fmt, ...) {
  if (env->rejected) return -MS_E_VERIFY;
  char reason[768], text[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  ms_bpf_vtrace_state(env, "");
  ms_bpf_vinsn_text(env, env->pc, text, sizeof text);
  ms_textbuf_printf(env->log, "insn %u: %s ; %s\n", env->pc, text, reason);
  env->err_insn = env->pc;
  env->rejected = 1;
  return -MS_E_VERIFY;
}

/* ---- small accessors ---------------------------------------------------- */

struct ms_bpf_vreg *ms_bpf_vregs(struct ms_bpf_venv *env) {
  return env->cur->frames[env->cur->curframe]->regs;
}

int ms_bpf_vcheck_read(struct ms_bpf_venv *env, unsigned r) {
  const struct ms_bpf_vreg *reg = &ms_bpf_vregs(env)[r];
  if (reg->type == MS_VT_NOT_INIT)
    return ms_bpf_vreject(env, "R%u is not initialised: read of an uninitialised register", r);
  if (reg->type == MS_VT_RELEASED)
    return ms_bpf_vreject(env, "R%u use of a ring buffer record after its release at insn %u", r, reg->size);
  return 0;
}

uint32_t ms_bpf_vnew_id(struct ms_bpf_venv *env) { return ++env->next_id; }
