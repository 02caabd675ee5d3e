/* SPDX-License-Identifier: MIT */
/* The query compiler against what an operator (or a fuzzer) may type: deeply
 * nested parentheses, long chains of unary operators and of binary operators
 * are refused with the depth and the column named, never a crash (the parser,
 * the code generator and the tree's free all recurse); expressions up to the
 * limit still compile. */
#include <stdlib.h>
#include <string.h>

#include "megascope/model.h"
#include "megascope/plan.h"
#include "megascope/query.h"
#include "test.h"

static struct ms_query_schema *schema(void) {
  struct ms_model_config c;
  ms_preset_config("tiny", MS_DTYPE_F32, &c);
  struct ms_model *m = ms_model_synth(&c, 5);
  struct ms_compile_opts co = {.sz = sizeof co, .batch = 4};
  struct ms_plan *p = m ? ms_plan_compile(m, &co, NULL) : NULL;
  struct ms_query_schema *s = p ? ms_query_schema_of_plan(p, NULL) : NULL;
  ms_plan_free(p);
  ms_model_free(m);
  return s;
}

/* "task_end /PRED/ { @n = count() }" with PRED = open x n, core, close x n. */
static char *predicate(const char *open, int n, const char *core, const char *close) {
  size_t lo = strlen(open), lc = strlen(close), len = 64 + strlen(core) + (size_t)n * (lo + lc);
  char *s = malloc(len), *w = s;
  if (!s) return NULL;
  w += sprintf(w, "task_end /");
  for (int i = 0; i < n; i++) w += sprintf(w, "%s", open);
  w += sprintf(w, "%s", core);
  for (int i = 0; i < n; i++) w += sprintf(w, "%s", close);
  sprintf(w, "/ { @n = count() }");
  return s;
}

/* Compiles src: 1 when it compiled, 0 when refused (the log in msg). */
static int compiles(const struct ms_query_schema *s, const char *src, char *msg, size_t n) {
  char buf[4096] = "";
  struct ms_textbuf log = {buf, sizeof buf, 0, 0};
  struct ms_query_opts o = {.sz = sizeof o};
  struct ms_query *q = ms_query_compile(src, s, &o, &log);
  snprintf(msg, n, "%s", buf);
  ms_query_free(q);
  return q != NULL;
}

static void refused_deep(const struct ms_query_schema *s, const char *what, char *src) {
  char msg[4096];
  CHECKF(src && !compiles(s, src, msg, sizeof msg), "%s compiled", what);
  CHECKF(strstr(msg, "nested too deeply") && strstr(msg, "256 levels") && strstr(msg, "column "),
         "%s: the refusal names the depth and the column: %s", what, msg);
  free(src);
}

static void accepted(const struct ms_query_schema *s, const char *what, char *src) {
  char msg[4096];
  CHECKF(src && compiles(s, src, msg, sizeof msg), "%s refused: %s", what, msg);
  free(src);
}

int main(void) {
  struct ms_query_schema *s = schema();
  CHECK(s != NULL);
  if (!s) TEST_MAIN_END();
  /* parentheses: 12,000 deep is refused, at the limit compiles */
  refused_deep(s, "12000 parentheses", predicate("(", 12000, "t_end > t_begin", ")"));
  refused_deep(s, "257 parentheses", predicate("(", 257, "t_end > t_begin", ")"));
  accepted(s, "256 parentheses", predicate("(", 256, "t_end > t_begin", ")"));
  /* the refusal's column is where the 257th level opens */
  char msg[4096];
  char *src = predicate("(", 300, "1", ")");
  CHECK(src && !compiles(s, src, msg, sizeof msg));
  CHECKF(strstr(msg, "column 267:") != NULL, "column of the 257th '(' (10 + 257): %s", msg);
  free(src);
  /* unary chains */
  refused_deep(s, "12000 '!'", predicate("!", 12000, "(t_end > t_begin)", ""));
  refused_deep(s, "12000 '-'", predicate("- ", 12000, "t_end", ""));
  refused_deep(s, "12000 '~'", predicate("~", 12000, "t_end", ""));
  accepted(s, "200 '!'", predicate("!", 200, "(t_end > t_begin)", ""));
  /* binary chains: left-deep trees as tall as they are long */
  {
    size_t n = 12000;
    char *core = malloc(n * 6 + 16), *w = core;
    w += sprintf(w, "t_end");
    for (size_t i = 0; i < n; i++) w += sprintf(w, " + 1");
    char *p = predicate("", 0, core, "");
    refused_deep(s, "12000 additions", p);
    w = core;
    w += sprintf(w, "t_end");
    for (size_t i = 0; i < n; i++) w += sprintf(w, " || 1");
    refused_deep(s, "12000 '||'", predicate("", 0, core, ""));
    w = core;
    w += sprintf(w, "t_end");
    for (size_t i = 0; i < 200; i++) w += sprintf(w, " + 1");
    accepted(s, "200 additions", predicate("", 0, core, ""));
    /* right-nested through parentheses: 1 + (1 + (1 + ...)) */
    refused_deep(s, "12000 right-nested additions", predicate("1 + (", 12000, "t_end", ")"));
    free(core);
  }
  /* a pattern match chain and deep keys and aggregation arguments */
  {
    char *q = malloc(200000), *w = q;
    w += sprintf(w, "task_end { @n[");
    for (int i = 0; i < 5000; i++) w += sprintf(w, "(");
    w += sprintf(w, "worker");
    for (int i = 0; i < 5000; i++) w += sprintf(w, ")");
    sprintf(w, "] = sum(t_end - t_begin) }");
    refused_deep(s, "5000 parentheses in a key", q);
    q = malloc(200000), w = q;
    w += sprintf(w, "task_end { @n = sum(");
    for (int i = 0; i < 5000; i++) w += sprintf(w, "-");
    sprintf(w, "t_end) }");
    refused_deep(s, "5000 '-' in an aggregation's argument", q);
  }
  ms_query_schema_free(s);
  TEST_MAIN_END();
}
