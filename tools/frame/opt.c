/* SPDX-License-Identifier: MIT */
/* The option parser and the usage printer of opt.h. */
#include "opt.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define MAX_OPTS 128
#define HELP_COL 23  /* where help text starts: "  --name ARG" is padded to it */

/* An option of the flattened table: the declaration and the base its offsets
 * are from. */
struct flat {
  const struct cli_opt *o;
  size_t base;
};

static int flatten(const struct cli_opt *t, size_t base, struct flat *out, int n) {
  for (; t->kind != CLI_END; t++) {
    if (t->kind == CLI_GROUP) {
      if ((n = flatten(t->group, base + t->off, out, n)) < 0) return -1;
    } else if (t->kind != CLI_TEXT) {
      if (n == MAX_OPTS) return -1;
      out[n++] = (struct flat){t, base};
    }
  }
  return n;
}

/* Flags, and functions declared without an argument, take none. */
static int takes_arg(const struct cli_opt *o) { return o->kind != CLI_FLAG && !(o->kind == CLI_FN && !o->arg); }

/* The option an alias spells (its index in flat), or -1. */
static int alias_target(const struct flat *flat, int n, const struct cli_opt *a) {
  for (int i = 0; i < n; i++)
    if (flat[i].o->kind != CLI_ALIAS && flat[i].o->name && !strcmp(flat[i].o->name, a->target)) return i;
  return -1;
}

/* Single-dash words ("-np"): the argument is replaced, in place, by the long
 * form of the option it spells, so getopt reads one table. */
static void single_dash_words(const struct flat *flat, int n, int argc, char **argv) {
  static char spelled[MAX_OPTS][72];
  for (int i = 0; i < n; i++) {
    const struct cli_opt *a = flat[i].o;
    int t;
    if (a->kind != CLI_ALIAS || !a->name || a->name[0] != '-' || (t = alias_target(flat, n, a)) < 0) continue;
    snprintf(spelled[i], sizeof spelled[i], "--%s", flat[t].o->name);
    for (int k = 1; k < argc && strcmp(argv[k], "--"); k++)
      if (!strcmp(argv[k], a->name)) argv[k] = spelled[i];
  }
}

static int parse_double(const char *cmd, const struct cli_opt *o, const char *s, double *v) {
  char *end;
  errno = 0;
  *v = strtod(s, &end);
  if (errno || end == s || *end || !(*v >= o->dlo && *v <= o->dhi)) {
    if (isinf(o->dhi) && o->dlo == 0)
      fprintf(stderr, "megascope %s: --%s '%s': expected a non-negative number\n", cmd, o->name, s);
    else
      fprintf(stderr, "megascope %s: --%s '%s': expected a number in [%g, %g]\n", cmd, o->name, s, o->dlo, o->dhi);
    return -1;
  }
  return 0;
}

static int store(const char *cmd, const struct flat *f, char *dst, const char *arg) {
  const struct cli_opt *o = f->o;
  char *p = dst + f->base + o->off, flag[80];
  snprintf(flag, sizeof flag, "--%s", o->name);
  switch (o->kind) {
  case CLI_FLAG:
    *(int *)p = o->set;
    return 0;
  case CLI_INT:
    return cli_int(flag, arg, o->lo, o->hi, (long *)p);
  case CLI_I32: {
    long v;
    if (cli_int(flag, arg, o->lo, o->hi, &v)) return -1;
    *(int *)p = (int)v;
    return 0;
  }
  case CLI_U64:
    return cli_u64(flag, arg, (uint64_t *)p);
  case CLI_FLOAT: {
    double v;
    if (parse_double(cmd, o, arg, &v)) return -1;
    *(float *)p = (float)v;
    return 0;
  }
  case CLI_DOUBLE:
    return parse_double(cmd, o, arg, (double *)p);
  case CLI_STR:
    *(const char **)p = arg;
    return 0;
  case CLI_LIST: {
    int *n = (int *)(dst + f->base + o->count_off);
    if (*n >= o->max) {
      fprintf(stderr, "megascope %s: at most %d --%s\n", cmd, o->max, o->name);
      return -1;
    }
    ((const char **)p)[(*n)++] = arg;
    return 0;
  }
  case CLI_CHOICE:
    for (int i = 0; o->choices[i]; i++)
      if (!strcmp(arg, o->choices[i])) {
        *(int *)p = i;
        return 0;
      }
    fprintf(stderr, "megascope %s: --%s '%s': expected", cmd, o->name, arg);
    for (int i = 0; o->choices[i]; i++) fprintf(stderr, "%s %s", i ? (o->choices[i + 1] ? "," : " or") : "", o->choices[i]);
    fprintf(stderr, "\n");
    return -1;
  case CLI_FN:
    return o->fn(dst + f->base, arg);
  default:
    return -1;
  }
}

int cli_parse(const char *cmd, const char *head, const struct cli_opt *opts, void *dst, int argc, char **argv,
              int *first) {
  struct flat flat[MAX_OPTS];
  struct option lo[MAX_OPTS + 2];
  char shorts[2 * MAX_OPTS + 4] = "h";
  int n = flatten(opts, 0, flat, 0), ns = 1;
  if (n < 0) {
    fprintf(stderr, "megascope %s: more than %d options declared\n", cmd, MAX_OPTS);
    return -1;
  }
  int m = 0, map[MAX_OPTS];  /* getopt's long options, each the flat index it stores through */
  for (int i = 0; i < n; i++) {
    const struct cli_opt *o = flat[i].o;
    int t = i;
    if (o->kind == CLI_ALIAS && (t = alias_target(flat, n, o)) < 0) {
      fprintf(stderr, "megascope %s: alias --%s of an undeclared option --%s\n", cmd, o->name, o->target);
      return -1;
    }
    int arg = takes_arg(flat[t].o);
    if (o->name && o->name[0] != '-') {
      map[m] = t;
      lo[m++] = (struct option){o->name, arg ? required_argument : no_argument, 0, 0};
    }
    if (o->shrt) {
      shorts[ns++] = o->shrt;
      if (arg) shorts[ns++] = ':';
    }
  }
  shorts[ns] = 0;
  lo[m] = (struct option){"help", no_argument, 0, 'h'};
  lo[m + 1] = (struct option){0, 0, 0, 0};
  single_dash_words(flat, n, argc, argv);
  int c, idx;
  optind = 1;
  opterr = 1;  /* getopt names the option: "run: unrecognized option '--x'" */
  while ((c = getopt_long(argc, argv, shorts, lo, &idx)) != -1) {
    if (c == 'h') {
      cli_usage(stdout, head, opts);
      return 1;
    }
    if (c == '?' || c == ':') {
      fprintf(stderr, "(try 'megascope %s --help')\n", cmd);
      return -1;
    }
    if (c != 0) {
      for (idx = 0; idx < n && flat[idx].o->shrt != c; idx++) {
      }
      if (idx < n && flat[idx].o->kind == CLI_ALIAS) idx = alias_target(flat, n, flat[idx].o);
    } else {
      idx = idx < m ? map[idx] : n;
    }
    if (idx < 0 || idx >= n || store(cmd, &flat[idx], dst, optarg)) return -1;
  }
  if (first) {
    *first = optind;
  } else if (optind < argc) {
    fprintf(stderr, "megascope %s: unexpected argument '%s'\n", cmd, argv[optind]);
    return -1;
  }
  return 0;
}

int cli_has_opt(const struct cli_opt *opts, const char *name, size_t len) {
  struct flat flat[MAX_OPTS];
  int n = flatten(opts, 0, flat, 0);
  for (int i = 0; i < n; i++)
    if (flat[i].o->name && strlen(flat[i].o->name) == len && !strncmp(flat[i].o->name, name, len)) return 1;
  return 0;
}

/* "  --name ARG" and the help under it, then the other spellings the table
 * (all of it, root) declares for it. */
static void usage_one(FILE *f, const struct cli_opt *o, const struct cli_opt *root) {
  char left[96];
  int n = o->shrt ? snprintf(left, sizeof left, "  -%c, --%s", o->shrt, o->name)
                  : snprintf(left, sizeof left, "  --%s", o->name);
  if (o->arg) n += snprintf(left + n, sizeof left - (size_t)n, " %s", o->arg);
  fprintf(f, "%s%*s", left, n < HELP_COL ? HELP_COL - n : 2, "");
  for (const char *h = o->help ? o->help : ""; *h;) {
    const char *nl = strchr(h, '\n');
    int len = nl ? (int)(nl - h) : (int)strlen(h);
    fprintf(f, "%.*s\n", len, h);
    h += len + (nl != NULL);
    if (*h) fprintf(f, "%*s", HELP_COL, "");
  }
  if (!o->help || !o->help[0]) fprintf(f, "\n");
  struct flat flat[MAX_OPTS];
  int nf = flatten(root, 0, flat, 0), any = 0;
  for (int i = 0; i < nf; i++) {
    const struct cli_opt *a = flat[i].o;
    if (a->kind != CLI_ALIAS || strcmp(a->target, o->name)) continue;
    if (any++)
      fputs(", ", f);
    else
      fprintf(f, "%*salso ", HELP_COL, "");
    if (a->shrt) fprintf(f, "-%c%s", a->shrt, a->name ? ", " : "");
    if (a->name) fprintf(f, "%s%s", a->name[0] == '-' ? "" : "--", a->name);
  }
  if (any) fprintf(f, "\n");
}

static void usage_table(FILE *f, const struct cli_opt *t, const struct cli_opt *root) {
  for (; t->kind != CLI_END; t++) {
    if (t->kind == CLI_GROUP) usage_table(f, t->group, root);
    else if (t->kind == CLI_TEXT) fprintf(f, "%s\n", t->help);
    else if (t->kind != CLI_ALIAS) usage_one(f, t, root);
  }
}

void cli_usage(FILE *f, const char *head, const struct cli_opt *opts) {
  fputs(head, f);
  usage_table(f, opts, opts);
  fprintf(f, "  -h, --help           this text\n");
}
