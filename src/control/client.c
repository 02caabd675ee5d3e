/* SPDX-License-Identifier: MIT */
/* The control socket's client side: connect, send a request frame, wait for
 * the reply frame and the descriptors that come with it. Blocking; one request
 * at a time per client. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "megascope/control.h"

struct ms_control_client {
  int fd;
};

struct ms_control_client *ms_control_connect(const char *path, struct ms_textbuf *log) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (!path || !path[0] || strlen(path) >= sizeof sa.sun_path) {
    ms_textbuf_printf(log, "socket path '%s' is empty or longer than %zu bytes\n", path ? path : "",
                      sizeof sa.sun_path - 1);
    errno = ENAMETOOLONG;
    return NULL;
  }
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return NULL;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    int err = errno;
    ms_textbuf_printf(log, "cannot connect to %s: %s%s\n", path, strerror(err),
                      err == ENOENT || err == ECONNREFUSED ? " (is `megascope serve` running?)"
                      : err == EACCES                      ? " (the socket belongs to another user)"
                                                           : "");
    close(fd);
    errno = err;
    return NULL;
  }
  struct ms_control_client *c = calloc(1, sizeof *c);
  if (!c) {
    close(fd);
    return NULL;
  }
  c->fd = fd;
  return c;
}

void ms_control_client_free(struct ms_control_client *c) {
  if (!c) return;
  close(c->fd);
  free(c);
}

int ms_control_client_fd(const struct ms_control_client *c) { return c->fd; }

int ms_control_call(struct ms_control_client *c, const char *req, size_t len, char **reply, size_t *reply_len,
                    int *fds, int *n_fds, int max_fds, int timeout_ms) {
  int rc = ms_control_frame_send(c->fd, req, len, NULL, 0);
  /* a server that refuses us (uid, too many clients) has already written its
   * reason and closed: read it even when the send failed */
  int rrc = ms_control_frame_recv(c->fd, reply, reply_len, MS_CONTROL_MAX_REPLY, fds, n_fds, max_fds, timeout_ms);
  return rrc ? (rc && rrc == -ECONNRESET ? rc : rrc) : 0;
}
