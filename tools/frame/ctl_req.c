/* SPDX-License-Identifier: MIT */
/* Control-socket requests, their fields checked against the protocol's table. */
#include "ctl_req.h"

#include <string.h>

#include "megascope/control.h"

int req_begin(struct req *r, const char *cmd) {
  memset(r, 0, sizeof *r);
  if (!(r->f = open_memstream(&r->buf, &r->len))) return -1;
  r->cmd = cmd;
  ms_json_init(&r->j, r->f, 0);
  ms_json_obj_begin(&r->j);
  ms_json_kstr(&r->j, "cmd", cmd);
  return 0;
}

static int req_key(struct req *r, const char *field) {
  if (ms_control_command_takes(r->cmd, field)) return 1;
  if (!r->bad) r->bad = field;
  return 0;
}

void req_int(struct req *r, const char *k, int64_t v) {
  if (req_key(r, k)) ms_json_kint(&r->j, k, v);
}
void req_uint(struct req *r, const char *k, uint64_t v) {
  if (req_key(r, k)) ms_json_kuint(&r->j, k, v);
}
void req_num(struct req *r, const char *k, double v) {
  if (req_key(r, k)) ms_json_knum(&r->j, k, v);
}
void req_bool(struct req *r, const char *k, int v) {
  if (req_key(r, k)) ms_json_kbool(&r->j, k, v);
}
void req_str(struct req *r, const char *k, const char *v) {
  if (req_key(r, k)) ms_json_kstr(&r->j, k, v);
}

int req_end(struct req *r) {
  ms_json_obj_end(&r->j);
  int rc = fclose(r->f) ? -1 : 0;
  r->f = NULL;
  if (r->bad) {
    fprintf(stderr, "megascope: internal error: command \"%s\" takes no field \"%s\" (megascope/control.h)\n",
            r->cmd, r->bad);
    rc = -1;
  }
  return rc;
}
