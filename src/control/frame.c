/* SPDX-License-Identifier: MIT */
/* The control protocol's framing (u32 little-endian length + JSON, descriptors
 * with SCM_RIGHTS), base64 for object bytes, and the default socket path.
 * Blocking helpers for clients; the server does its own non-blocking I/O. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "control/control_impl.h"
#include "megascope/control.h"

void ms_control_put_u32le(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

uint32_t ms_control_get_u32le(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int ms_control_frame_send(int sock, const void *buf, size_t len, const int *fds, int n_fds) {
  if (len > UINT32_MAX || n_fds < 0 || n_fds > MS_CONTROL_MAX_FDS) return -EINVAL;
  uint8_t hdr[4];
  ms_control_put_u32le(hdr, (uint32_t)len);
  size_t total = 4 + len, sent = 0;
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * MS_CONTROL_MAX_FDS)];
  } ctl;
  while (sent < total) {
    struct iovec iov[2];
    int niov = 0;
    if (sent < 4) iov[niov++] = (struct iovec){hdr + sent, 4 - sent};
    size_t boff = sent < 4 ? 0 : sent - 4;
    if (len > boff) iov[niov++] = (struct iovec){(char *)buf + boff, len - boff};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    if (sent == 0 && n_fds > 0) {
      memset(&ctl, 0, sizeof ctl);
      mh.msg_control = ctl.buf;
      mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_fds);
      struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_fds);
      memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n_fds);
    }
    ssize_t k = sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        struct pollfd p = {sock, POLLOUT, 0};
        poll(&p, 1, 1000);
        continue;
      }
      return -errno;
    }
    sent += (size_t)k;
  }
  return 0;
}

/* Keeps the descriptors a message carried (up to max), closes the rest. */
static void take_fds(struct msghdr *mh, int *fds, int *n_fds, int max_fds) {
  for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (fds && *n_fds < max_fds)
        fds[(*n_fds)++] = fd;
      else
        close(fd);
    }
  }
}

/* Reads exactly n bytes (collecting descriptors) before the deadline. */
static int read_full(int sock, uint8_t *p, size_t n, int *fds, int *n_fds, int max_fds, uint64_t deadline) {
  size_t got = 0;
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int) * MS_CONTROL_MAX_FDS)];
  } ctl;
  while (got < n) {
    int wait_ms = -1;
    if (deadline) {
      uint64_t now = ms_now_ns();
      if (now >= deadline) return -ETIMEDOUT;
      wait_ms = (int)((deadline - now) / 1000000 + 1);
    }
    struct pollfd pf = {sock, POLLIN, 0};
    int pr = poll(&pf, 1, wait_ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr < 0) return -errno;
    if (pr == 0) return -ETIMEDOUT;
    struct iovec iov = {p + got, n - got};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                        .msg_controllen = sizeof ctl.buf};
    ssize_t k = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -errno;
    }
    if (mh.msg_controllen) take_fds(&mh, fds, n_fds, max_fds);
    if (k == 0) return -ECONNRESET;
    got += (size_t)k;
  }
  return 0;
}

int ms_control_frame_recv(int sock, char **out, size_t *len, size_t max, int *fds, int *n_fds, int max_fds,
                          int timeout_ms) {
  uint64_t deadline = timeout_ms >= 0 ? ms_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
  uint8_t hdr[4];
  int dummy = 0;
  if (!n_fds) n_fds = &dummy;
  *n_fds = 0;
  *out = NULL;
  *len = 0;
  int rc = read_full(sock, hdr, 4, fds, n_fds, max_fds, deadline);
  if (rc) return rc;
  uint32_t n = ms_control_get_u32le(hdr);
  if (n > max) return -EMSGSIZE;
  char *buf = malloc((size_t)n + 1);
  if (!buf) return -ENOMEM;
  rc = read_full(sock, (uint8_t *)buf, n, fds, n_fds, max_fds, deadline);
  if (rc) {
    free(buf);
    return rc;
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return 0;
}

/* ---- base64 ---- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t ms_base64_encoded_len(size_t n) { return (n + 2) / 3 * 4; }

void ms_base64_encode(const void *in, size_t n, char *out) {
  const uint8_t *p = in;
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
    out[o++] = b64[v >> 18 & 63];
    out[o++] = b64[v >> 12 & 63];
    out[o++] = i + 1 < n ? b64[v >> 6 & 63] : '=';
    out[o++] = i + 2 < n ? b64[v & 63] : '=';
  }
  out[o] = '\0';
}

static int b64_val(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

long ms_base64_decode(const char *in, size_t n, void *out, size_t out_size) {
  uint8_t *o = out;
  size_t k = 0;
  if (n % 4) return -EINVAL;
  for (size_t i = 0; i < n; i += 4) {
    int last = i + 4 == n;
    int pad = (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=');
    if (pad && !last) return -EINVAL;
    int v[4];
    for (int j = 0; j < 4; j++) {
      v[j] = j >= 4 - pad ? 0 : b64_val((unsigned char)in[i + (size_t)j]);
      if (v[j] < 0) return -EINVAL;
    }
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
    int bytes = 3 - pad;
    if (k + (size_t)bytes > out_size) return -E2BIG;
    o[k++] = (uint8_t)(w >> 16);
    if (bytes > 1) o[k++] = (uint8_t)(w >> 8);
    if (bytes > 2) o[k++] = (uint8_t)w;
  }
  return (long)k;
}

/* ---- text that goes into JSON ---- */

size_t ms_control_utf8_clean(char *s) {
  unsigned char *p = (unsigned char *)s;
  size_t fixed = 0;
  while (*p) {
    unsigned c = *p;
    int k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
    int ok = k >= 0;
    unsigned cp = k == 0 ? c : k == 1 ? c & 0x1f : k == 2 ? c & 0x0f : c & 0x07;
    for (int i = 1; ok && i <= k; i++) {
      ok = (p[i] & 0xc0) == 0x80;  /* stops at the NUL too */
      cp = cp << 6 | (p[i] & 0x3f);
    }
    if (ok && k > 0) {
      static const unsigned min[] = {0, 0x80, 0x800, 0x10000};
      ok = cp >= min[k] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (!ok) {
      *p++ = '?';
      fixed++;
      continue;
    }
    p += k + 1;
  }
  return fixed;
}

/* ---- paths ---- */

int ms_control_default_path(char *buf, size_t size, long pid) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");
  int n;
  if (xdg && xdg[0] == '/')
    n = snprintf(buf, size, "%s/megascope/engine-%ld.sock", xdg, pid);
  else
    n = snprintf(buf, size, "/run/megascope/engine-%ld.sock", pid);
  return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}
