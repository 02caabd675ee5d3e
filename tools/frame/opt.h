/* SPDX-License-Identifier: MIT */
/* Command-line options declared once: each option's name, what it takes, its
 * range, its help and where its value goes, in one table per command. One
 * parser (cli_parse) builds getopt's table from it, checks every value and
 * names the option in any error; one printer (cli_usage) writes the table as
 * help. Options several commands share are groups (the model, activations,
 * the engine, monitor budgets, text and sampling), tables of their own that a
 * command's table includes with CLI_GROUP at the offset of the group's struct.
 *
 * A table is an array ended by {0}. Offsets are into the struct the command
 * parses into (offsetof); a group's offsets are into its own struct. */
#ifndef MS_TOOLS_OPT_H
#define MS_TOOLS_OPT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum cli_kind {
  CLI_END = 0,
  CLI_FLAG,    /* no argument: the int at off becomes .set */
  CLI_INT,     /* a long in lo..hi */
  CLI_I32,     /* an int in lo..hi */
  CLI_U64,     /* a uint64_t (decimal or 0x...) */
  CLI_FLOAT,   /* a float in dlo..dhi */
  CLI_DOUBLE,  /* a double in dlo..dhi */
  CLI_STR,     /* a const char * (argv's string) */
  CLI_LIST,    /* repeatable: const char *[max] at off, the count (int) at count_off */
  CLI_CHOICE,  /* an int: the index of the argument in choices (NULL-ended) */
  CLI_FN,      /* fn(the table's struct, arg): 0, or -1 with the error printed; no
                * argument (arg NULL) when .arg is NULL */
  CLI_GROUP,   /* the options of .group, their offsets from off */
  CLI_TEXT,    /* no option: a line of help (.help) */
  CLI_ALIAS,   /* another spelling of option .target (llama-server's, vLLM's): a
                * long name, a one-letter form, or both; a name that starts with
                * '-' is a single-dash word ("-np") matched as a whole argument.
                * --help lists it under its target */
};

struct cli_opt {
  enum cli_kind kind;
  const char *name;    /* the long name, without "--" */
  const char *arg;     /* its argument in the help ("N", "PRESET"); NULL: none */
  const char *help;    /* lines after the first indented under it */
  size_t off;
  long lo, hi;
  double dlo, dhi;
  int set;             /* CLI_FLAG: the value stored */
  int max;             /* CLI_LIST: capacity */
  size_t count_off;    /* CLI_LIST: the count */
  const char *const *choices;
  int (*fn)(void *dst, const char *arg);
  const struct cli_opt *group;
  char shrt;           /* a one-letter form too ('v' for -v), 0: none */
  const char *target;  /* CLI_ALIAS: the long name of the option it spells */
};

#define CLI_O(S, f) offsetof(S, f)
#define CLI_OPT_FLAG(S, f, nm, hp) {.kind = CLI_FLAG, .name = nm, .off = CLI_O(S, f), .set = 1, .help = hp}
#define CLI_OPT_INT(S, f, nm, a, l, h, hp) \
  {.kind = CLI_INT, .name = nm, .arg = a, .off = CLI_O(S, f), .lo = l, .hi = h, .help = hp}
#define CLI_OPT_I32(S, f, nm, a, l, h, hp) \
  {.kind = CLI_I32, .name = nm, .arg = a, .off = CLI_O(S, f), .lo = l, .hi = h, .help = hp}
#define CLI_OPT_U64(S, f, nm, a, hp) {.kind = CLI_U64, .name = nm, .arg = a, .off = CLI_O(S, f), .help = hp}
#define CLI_OPT_FLOAT(S, f, nm, a, l, h, hp) \
  {.kind = CLI_FLOAT, .name = nm, .arg = a, .off = CLI_O(S, f), .dlo = l, .dhi = h, .help = hp}
#define CLI_OPT_DOUBLE(S, f, nm, a, l, h, hp) \
  {.kind = CLI_DOUBLE, .name = nm, .arg = a, .off = CLI_O(S, f), .dlo = l, .dhi = h, .help = hp}
#define CLI_OPT_STR(S, f, nm, a, hp) {.kind = CLI_STR, .name = nm, .arg = a, .off = CLI_O(S, f), .help = hp}
#define CLI_OPT_LIST(S, f, n, nm, a, hp)                                                               \
  {.kind = CLI_LIST, .name = nm, .arg = a, .off = CLI_O(S, f), .max = (int)(sizeof((S *)0)->f / sizeof(char *)), \
   .count_off = CLI_O(S, n), .help = hp}
#define CLI_OPT_CHOICE(S, f, nm, a, ch, hp) \
  {.kind = CLI_CHOICE, .name = nm, .arg = a, .off = CLI_O(S, f), .choices = ch, .help = hp}
#define CLI_OPT_FN(nm, a, f, hp) {.kind = CLI_FN, .name = nm, .arg = a, .fn = f, .help = hp}
#define CLI_OPT_GROUP(S, f, g) {.kind = CLI_GROUP, .off = CLI_O(S, f), .group = g}
#define CLI_OPT_TEXT(hp) {.kind = CLI_TEXT, .help = hp}
#define CLI_OPT_ALIAS(nm, sh, tg) {.kind = CLI_ALIAS, .name = nm, .shrt = sh, .target = tg}

/* Parses argv[1..] into dst by the table (getopt_long; --help and -h are
 * always there). 0: parsed, positional arguments from *first; 1: --help was
 * given (the usage is printed on stdout); -1: an error, printed as
 * "megascope CMD: ..." on stderr. cmd names the command in errors ("run",
 * "bench decode"); head is the usage's text before the options. */
int cli_parse(const char *cmd, const char *head, const struct cli_opt *opts, void *dst, int argc, char **argv,
              int *first);

/* 1 when the table (groups included) declares option name[0..len). */
int cli_has_opt(const struct cli_opt *opts, const char *name, size_t len);

/* The usage: head, then every option of the table, groups included, then
 * "-h, --help". */
void cli_usage(FILE *f, const char *head, const struct cli_opt *opts);

/* The shared groups (opt_groups.c). */
extern const struct cli_opt cli_model_opts[];   /* struct cli_model (common.h) */
extern const struct cli_opt cli_act_opts[];     /* an int: 1 for 8-bit activations */
extern const struct cli_opt run_text_opts[];    /* struct run_text (run_text.h) */
extern const struct cli_opt cli_socket_opts[];  /* a const char *: --socket */
/* --socket given once or more: several engines (replicas of one service)
 * that query and stats ask one question and merge the answers of. */
#define CLI_SOCKETS_MAX 16
struct cli_sockets {
  const char *path[CLI_SOCKETS_MAX];
  int n;
};
extern const struct cli_opt cli_sockets_opts[]; /* struct cli_sockets */
/* A monitor's budget, as attach, replace, run and query take it. */
struct cli_budget {
  long max_per_step, sample;  /* 0 (max_per_step): no limit */
  uint64_t ringbuf_bytes;     /* 0: no limit */
  int interp;
};
extern const struct cli_opt cli_budget_opts[];  /* struct cli_budget */
extern const struct cli_opt cli_workers_opts[]; /* a long: --workers */
/* --backend and what the CUDA one takes. */
struct cli_backend {
  int backend;  /* enum ms_backend */
  long sms;     /* cuda: CTAs of the persistent kernel; 0: every SM */
};
extern const struct cli_opt cli_backend_opts[];  /* struct cli_backend */

#endif
