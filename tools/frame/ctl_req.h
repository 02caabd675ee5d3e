/* SPDX-License-Identifier: MIT */
/* A request to an engine's control socket, built in memory with the
 * project's JSON writer, every field checked against the protocol's one
 * table of commands and fields (megascope/control.h, which the server checks
 * requests against too): a field the table does not give the command fails
 * the request as an internal error instead of reaching the engine. */
#ifndef MS_TOOLS_CTL_REQ_H
#define MS_TOOLS_CTL_REQ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megascope/json.h"

struct req {
  char *buf;           /* the request, after req_end (free it) */
  size_t len;
  FILE *f;
  struct ms_json j;
  const char *cmd;
  const char *bad;     /* a field the table does not give the command */
};

/* 0, or -1 out of memory. */
int req_begin(struct req *r, const char *cmd);
void req_int(struct req *r, const char *k, int64_t v);
void req_uint(struct req *r, const char *k, uint64_t v);
void req_num(struct req *r, const char *k, double v);
void req_bool(struct req *r, const char *k, int v);
void req_str(struct req *r, const char *k, const char *v);
/* Closes the object: 0, or -1 (a bad field, printed; or a write error). */
int req_end(struct req *r);

#endif
