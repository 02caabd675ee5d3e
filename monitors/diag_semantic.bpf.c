// SPDX-License-Identifier: MIT
// The semantic monitor of the counterexample benchmark (docs/benchmark.md): it
// aggregates in place, per question, the evidence that names a scheduler fault,
// so a diagnosis reads a few hundred rows instead of a trace.
//   class_stat, op_stat  per task class and per kernel: tasks, task ns, queue ns
//                        (ready -> begin), the longest queue (a starved task),
//                        the longest task (dropped on real clocks: one preemption);
//   evclass_lag          per event class: the release lag, from the completing
//                        producer's end to the event's release (a held notification);
//   worker_queue/_top    per worker: queue ns and task time against the class,
//                        and the two workers queueing most (a saturated queue);
//   worker_slow_top      the two workers whose tasks ran longest against their
//                        classes' running means (a throttled worker);
//   worker_op            per worker (the first 64) and kernel: tasks and task ns,
//                        so a CPU server's few workers are compared kernel by kernel;
//   req_attn             per request: its attention tasks' time (a long context)
//                        and when the last ended (a request that joined late);
//   expert_stat          per MoE expert: its tasks' time and the rows they
//                        processed (ABI v2 work_rows: routing skew by counts);
//   device_comm          per device: the communication time of its shares (comm hook);
//   device_busy          per device: its tasks' times against their classes' running
//                        means (per mille; communication aside), so the device's
//                        mix of classes cancels.
// Besides the questions about the seven faults the benchmark was built on, the
// tables answer "where" for any slowness: by class, kernel, layer (the class
// names carry it), worker, device, request and expert.
// scratch_* maps are the monitor's working memory and are never read out.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <megascope/bpf/megascope.h>

#define MAX_CLASSES 1024
#define MAX_OPS 32
#define MAX_EVCLASSES 128
#define MAX_WORKERS 1024
#define MAX_EXPERTS 256
#define MAX_DEVICES 64
#define MAX_TASKS 65536
#define MAX_WOP_WORKERS 64  /* worker_op: the workers a per-kernel row is kept for */
#define OP_ATTN 5
#define OP_EXPERT_UP 10
#define OP_EXPERT_DOWN 11
#define OP_COMM 16

/* per task class and kernel: tasks, their time (sum, sum of squares) and queueing */
struct task_stat {
  __u64 n, ns, ns_sq, queue_ns, queue_max, ns_max;
};

/* a time per row: count, sum, sum of squares, largest */
struct time_stat {
  __u64 n, ns, ns_sq, max;
};

/* a device's tasks, and their times against their classes' running means (per mille) */
struct dbusy {
  __u64 n, ratio_pm;
};

/* per worker: tasks, their queueing, and the sum of their times against their
 * classes' running means (per mille) over ratio_n tasks (communication aside:
 * its time is the link's, not the worker's) */
struct wstat {
  __u64 n, queue_ns, ratio_pm, ratio_n;
};

/* per (worker, kernel): tasks and their time, so that a worker is compared
 * with the others kernel by kernel (one kernel's memory-bound tiles do not
 * speak for all of a worker's tasks) */
struct wop {
  __u64 n, ns;
};

/* an expert's tasks' time and the rows they processed (ABI v2 work_rows) */
struct expert {
  struct time_stat t;
  __u64 rows;
};

/* a request's attention time and when its last attention task ended */
struct req {
  struct time_stat t;
  __u64 last;
};

struct top {
  __u64 worker, queue_ns;
};

struct ended {
  __u64 task_gen, t_end;
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_CLASSES);
  __type(key, __u32);
  __type(value, struct task_stat);
} class_stat SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_OPS);
  __type(key, __u32);
  __type(value, struct task_stat);
} op_stat SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_EVCLASSES);
  __type(key, __u32);
  __type(value, struct time_stat);
} evclass_lag SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_WORKERS);
  __type(key, __u32);
  __type(value, struct wstat);
} worker_queue SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_WOP_WORKERS * MAX_OPS);
  __type(key, __u32);
  __type(value, struct wop);
} worker_op SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 2);
  __type(key, __u32);
  __type(value, struct top);
} worker_top SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 2);
  __type(key, __u32);
  __type(value, struct top);
} worker_slow_top SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 256);
  __type(key, __u64);
  __type(value, struct req);
} req_attn SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_EXPERTS);
  __type(key, __u32);
  __type(value, struct expert);
} expert_stat SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_DEVICES);
  __type(key, __u32);
  __type(value, struct time_stat);
} device_comm SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_DEVICES);
  __type(key, __u32);
  __type(value, struct dbusy);
} device_busy SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_TASKS);
  __type(key, __u32);
  __type(value, struct ended);
} scratch_end SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, MAX_DEVICES);
  __type(key, __u32);
  __type(value, __u64);
} scratch_issue SEC(".maps");

MS_HOOK_ABI_DECLARE();

static __always_inline void add_task(struct task_stat *s, __u64 ns, __u64 q) {
  __sync_fetch_and_add(&s->n, 1);
  __sync_fetch_and_add(&s->ns, ns);
  __sync_fetch_and_add(&s->ns_sq, ns * ns);
  __sync_fetch_and_add(&s->queue_ns, q);
  if (q > s->queue_max) s->queue_max = q;  /* racy max: a lost update only when workers race */
  if (ns > s->ns_max) s->ns_max = ns;      /* the longest task: a real clock's outlier, dropped by the reader */
}

static __always_inline void add_time(struct time_stat *s, __u64 ns) {
  __sync_fetch_and_add(&s->n, 1);
  __sync_fetch_and_add(&s->ns, ns);
  __sync_fetch_and_add(&s->ns_sq, ns * ns);
  if (ns > s->max) s->max = ns;
}

/* Keeps the two workers with the largest running sums in a top map. */
static __always_inline void top_update(void *map, __u32 w, __u64 sum) {
  __u32 k0 = 0, k1 = 1;
  struct top *a = bpf_map_lookup_elem(map, &k0);
  struct top *b = bpf_map_lookup_elem(map, &k1);
  if (!a || !b) return;
  if (a->worker == w) {
    a->queue_ns = sum;
  } else if (sum > a->queue_ns) {
    b->worker = a->worker;
    b->queue_ns = a->queue_ns;
    a->worker = w;
    a->queue_ns = sum;
  } else if (b->worker == w || sum > b->queue_ns) {
    b->worker = w;
    b->queue_ns = sum;
  }
}

SEC("megascope/observe/task_end")
int on_end(struct ms_hook_ctx *ctx) {
  __u32 cls = ctx->task_class, op = ctx->op, w = ctx->worker, t = ctx->task_index;
  __u64 ns = ctx->t_end - ctx->t_begin;
  __u64 q = ctx->t_begin > ctx->t_ready ? ctx->t_begin - ctx->t_ready : 0;
  struct task_stat *s = bpf_map_lookup_elem(&class_stat, &cls);
  __u64 pm = 1000;  /* this task against its class's mean so far */
  if (s) {
    add_task(s, ns, q);
    if (s->ns > 0) pm = ns * s->n * 1000 / s->ns;
  }
  s = bpf_map_lookup_elem(&op_stat, &op);
  if (s) add_task(s, ns, q);
  struct wstat *wq = bpf_map_lookup_elem(&worker_queue, &w);
  if (wq) {
    __sync_fetch_and_add(&wq->n, 1);
    __sync_fetch_and_add(&wq->queue_ns, q);
    if (op != OP_COMM) {
      __sync_fetch_and_add(&wq->ratio_pm, pm);
      __sync_fetch_and_add(&wq->ratio_n, 1);
    }
    top_update(&worker_top, w, wq->queue_ns);
    /* the excess over "as fast as the class", in per mille task units */
    __u64 fair = wq->ratio_n * 1000;
    top_update(&worker_slow_top, w, wq->ratio_pm > fair ? wq->ratio_pm - fair : 0);
  }
  if (w < MAX_WOP_WORKERS && op < MAX_OPS) {
    __u32 k = w * MAX_OPS + op;
    struct wop *x = bpf_map_lookup_elem(&worker_op, &k);
    if (x) {
      __sync_fetch_and_add(&x->n, 1);
      __sync_fetch_and_add(&x->ns, ns);
    }
  }
  __u32 d = ctx->device;
  struct dbusy *db = op == OP_COMM ? 0 : bpf_map_lookup_elem(&device_busy, &d);
  if (db) {
    __sync_fetch_and_add(&db->n, 1);
    __sync_fetch_and_add(&db->ratio_pm, pm);
  }
  if (op == OP_ATTN && ctx->req_slot != MS_HOOK_NONE32) {
    __u64 key = (__u64)ctx->req_slot << 32 | ctx->req_gen;
    struct req *r = bpf_map_lookup_elem(&req_attn, &key);
    if (r) {
      add_time(&r->t, ns);
      if (ctx->t_end > r->last) r->last = ctx->t_end;  /* racy max, as the others */
    } else {
      struct req first = {{1, ns, ns * ns, ns}, ctx->t_end};
      bpf_map_update_elem(&req_attn, &key, &first, BPF_NOEXIST);
    }
  }
  if ((op == OP_EXPERT_UP || op == OP_EXPERT_DOWN) && ctx->tile_z >= 0) {
    __u32 x = (__u32)ctx->tile_z;
    struct expert *e = bpf_map_lookup_elem(&expert_stat, &x);
    if (e) {
      add_time(&e->t, ns);
      __sync_fetch_and_add(&e->rows, ctx->work_rows);  /* ABI v2 */
    }
  }
  struct ended *end = bpf_map_lookup_elem(&scratch_end, &t);
  if (end) {
    end->task_gen = ctx->task_gen;
    end->t_end = ctx->t_end;
  }
  return 0;
}

/* The release lag: from the end of the producer whose trigger completed the
 * event (its task_end came first) to the release. */
SEC("megascope/observe/dep_release")
int on_release(struct ms_hook_ctx *ctx) {
  __u32 t = ctx->task_index, ec = ctx->event_class;
  struct ended *end = bpf_map_lookup_elem(&scratch_end, &t);
  if (!end || end->task_gen != ctx->task_gen || end->t_end > ctx->now_ns) return 0;
  __u64 lag = ctx->now_ns - end->t_end;
  struct time_stat *l = bpf_map_lookup_elem(&evclass_lag, &ec);
  if (l) add_time(l, lag);
  return 0;
}

/* Communication time per device: issue to completion of its share, keyed by
 * the device whose share it is (tile_z: in the simulator the device that runs
 * it; across processes also each receiver's task of that share, so a rank
 * whose shares arrive late is the one whose key grows). */
SEC("megascope/observe/comm")
int on_comm(struct ms_hook_ctx *ctx) {
  __u32 d = ctx->tile_z >= 0 ? (__u32)ctx->tile_z : ctx->device;
  __u64 *issued = bpf_map_lookup_elem(&scratch_issue, &d);
  if (!issued) return 0;
  if (ctx->comm_phase == MS_COMM_ISSUE) {
    *issued = ctx->now_ns;
    return 0;
  }
  struct time_stat *c = bpf_map_lookup_elem(&device_comm, &d);
  if (!c || !*issued || *issued > ctx->now_ns) return 0;
  add_time(c, ctx->now_ns - *issued);
  return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
