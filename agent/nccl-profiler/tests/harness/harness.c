/*
 * Calls libwarden_nccl_profiler.so the way NCCL does: dlopen, dlsym of the versioned
 * struct, init per communicator, then group -> collective -> proxy events from a host
 * thread and a proxy thread per communicator, recordEventState, finalize.
 *
 * usage: harness LIB VERSION SCENARIO
 *   VERSION   4, 5 or 6
 *   SCENARIO  run       three communicators, concurrent host and proxy threads; the
 *                       last collective of communicator 0 starts and never stops
 *             garbage   null and unknown descriptor fields, unknown event types
 *             disabled  the segment directory is unusable: init must leave the
 *                       context null and the mask alone, and every call returns 0
 *             disabled-unprivileged  as disabled, after giving up root (so a
 *                       read-only directory is read-only)
 *             links     one communicator (rank 0 of 4) under the mask the environment
 *                       gives (the test asks for default+proxystep): per collective,
 *                       send ProxyOps to peers 1 and 2 and a receive ProxyOp from peer
 *                       3, each with ProxyStep events and their state transitions in
 *                       NCCL's order; peer 2's steps wait LINK_SLOW_US in SendWait
 * env: HARNESS_STOP=1  raise SIGSTOP before finalize (the test inspects the segments)
 *      HARNESS_OPS=N   collectives per communicator (default 200; links: 40)
 *
 * Exit status 0 when every call returned ncclSuccess and every check held; otherwise
 * it prints what failed and exits 1.
 *
 * The structs below follow NCCL's profiler_v4.h .. profiler_v6.h member for member.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef void (*logger_t)(int level, unsigned long flags, const char *file, int line,
                         const char *fmt, ...);

/* ---- descriptor members ---- */
typedef struct {
  uint64_t seqNumber; const char *func; void const *sendBuff; void *recvBuff;
  size_t count; int root; const char *datatype; uint8_t nChannels; uint8_t nWarps;
  const char *algo; const char *proto;
} coll_v4_t;
typedef struct {
  uint64_t seqNumber; const char *func; void const *sendBuff; void *recvBuff;
  size_t count; int root; const char *datatype; uint8_t nChannels; uint8_t nWarps;
  const char *algo; const char *proto; void *parentGroup;
} coll_v5_t;
typedef struct {
  const char *func; void *buff; const char *datatype; size_t count; int peer;
  uint8_t nChannels;
} p2p_v4_t;
typedef struct {
  const char *func; void *buff; const char *datatype; size_t count; int peer;
  uint8_t nChannels; void *parentGroup;
} p2p_v5_t;
typedef struct {
  pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend;
} proxy_op_t;
typedef struct { int step; } proxy_step_t;
typedef struct { uint8_t channelId; uint64_t pTimer; } kernel_ch_t;
typedef struct { int64_t id; void *data; } net_plugin_t;
typedef struct { bool graphCaptured; int groupDepth; } group_api_t;
typedef struct {
  const char *func; size_t count; const char *datatype; int root; void *stream;
  bool graphCaptured;
} coll_api_t;
typedef struct {
  const char *func; size_t count; const char *datatype; void *stream; bool graphCaptured;
} p2p_api_t;
typedef struct { void *stream; } kernel_launch_t;
typedef struct {
  uint8_t channelId; uint8_t isSend; uint8_t peer; uint32_t step; uint32_t size;
  uint64_t startTs; uint64_t readyTs;
} kernel_step_t;
typedef struct {
  uint64_t seqNumber; const char *func; void const *sendBuff; void *recvBuff;
  size_t count; int root; const char *datatype; const char *syncStrategy;
  bool intraBatchSync; uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum;
  void *stream;
} ce_coll_t;
typedef struct { bool isComplete; int nRanks; } ce_sync_t;
typedef struct { int numOps; size_t totalBytes; bool useIntraSync; } ce_batch_t;

/* ---- descriptors ---- */
typedef struct {
  uint8_t type; void *parentObj; int rank;
  union {
    coll_v4_t coll; p2p_v4_t p2p; proxy_op_t proxyOp; proxy_step_t proxyStep;
    kernel_ch_t kernelCh; net_plugin_t netPlugin;
  };
} descr_v4_t;
typedef struct {
  uint64_t type; void *parentObj; int rank;
  union {
    group_api_t groupApi; coll_api_t collApi; p2p_api_t p2pApi;
    kernel_launch_t kernelLaunch; coll_v5_t coll; p2p_v5_t p2p; proxy_op_t proxyOp;
    proxy_step_t proxyStep; kernel_ch_t kernelCh; net_plugin_t netPlugin;
  };
} descr_v5_t;
typedef struct {
  uint64_t type; void *parentObj; int rank;
  union {
    group_api_t groupApi; coll_api_t collApi; p2p_api_t p2pApi;
    kernel_launch_t kernelLaunch; coll_v5_t coll; p2p_v5_t p2p; proxy_op_t proxyOp;
    proxy_step_t proxyStep; kernel_ch_t kernelCh; kernel_step_t kernelStep;
    net_plugin_t netPlugin; ce_coll_t ceColl; ce_sync_t ceCollSync; ce_batch_t ceCollBatch;
  };
} descr_v6_t;

#if defined(__x86_64__)
_Static_assert(sizeof(descr_v5_t) == 112, "v5 descriptor is 112 bytes");
_Static_assert(offsetof(descr_v5_t, coll) == 24, "v5 union at offset 24");
_Static_assert(offsetof(descr_v5_t, coll.algo) == 88, "v5 coll.algo at offset 88");
_Static_assert(sizeof(descr_v4_t) == 104, "v4 descriptor is 104 bytes");
_Static_assert(offsetof(descr_v4_t, parentObj) == 8, "v4 parentObj after a u8 type");
_Static_assert(sizeof(descr_v6_t) == 112, "v6 descriptor is 112 bytes");
#endif

/* ---- the exported structs ---- */
typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, int *mask, const char *commName, uint64_t commHash,
                       int nNodes, int nranks, int rank, logger_t logfn);
  ncclResult_t (*startEvent)(void *ctx, void **handle, descr_v4_t *d);
  ncclResult_t (*stopEvent)(void *handle);
  ncclResult_t (*recordEventState)(void *handle, int state, void *args);
  ncclResult_t (*finalize)(void *ctx);
} profiler_v4_t;
typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, uint64_t commId, int *mask, const char *commName,
                       int nNodes, int nranks, int rank, logger_t logfn);
  ncclResult_t (*startEvent)(void *ctx, void **handle, descr_v5_t *d);
  ncclResult_t (*stopEvent)(void *handle);
  ncclResult_t (*recordEventState)(void *handle, int state, void *args);
  ncclResult_t (*finalize)(void *ctx);
} profiler_v5_t;
typedef struct {
  const char *name;
  ncclResult_t (*init)(void **ctx, uint64_t commId, int *mask, const char *commName,
                       int nNodes, int nranks, int rank, logger_t logfn);
  ncclResult_t (*startEvent)(void *ctx, void **handle, descr_v6_t *d);
  ncclResult_t (*stopEvent)(void *handle);
  ncclResult_t (*recordEventState)(void *handle, int state, void *args);
  ncclResult_t (*finalize)(void *ctx);
} profiler_v6_t;

enum {
  EV_GROUP = 1 << 0, EV_COLL = 1 << 1, EV_P2P = 1 << 2, EV_PROXY_OP = 1 << 3,
  EV_PROXY_STEP = 1 << 4, EV_PROXY_CTRL = 1 << 5, EV_KERNEL_CH = 1 << 6,
  EV_NET_PLUGIN = 1 << 7, EV_GROUP_API = 1 << 8, EV_COLL_API = 1 << 9,
  EV_CE_COLL = 1 << 12,
};
enum {
  ST_PROXY_OP_IN_PROGRESS = 19, ST_PROXY_STEP_SEND_GPU_WAIT = 8,
  ST_PROXY_STEP_SEND_PEER_WAIT = 20, ST_PROXY_STEP_SEND_WAIT = 9,
  ST_PROXY_STEP_RECV_WAIT = 10, ST_PROXY_STEP_RECV_FLUSH_WAIT = 11,
  ST_PROXY_STEP_RECV_GPU_WAIT = 12, ST_KERNEL_CH_STOP = 22
};
/* ncclProfilerEventStateArgs_v4_t (v5 and v6 use the same union). */
typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void *data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} state_args_t;

/* ---- one call path for all versions ---- */
static int version;
static profiler_v4_t *p4;
static profiler_v5_t *p5;
static profiler_v6_t *p6;
static pid_t self_pid;
static int failures;

#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "harness: %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                               \
      fprintf(stderr, "\n");                                                      \
      __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);                         \
    }                                                                             \
  } while (0)
#define OK(call) CHECK((call) == 0, "%s returned non-zero", #call)

/* What an event says, whatever the version. */
typedef struct {
  uint64_t type; void *parent; int rank;
  uint64_t seq; const char *func; size_t count; const char *dtype; int root; int peer;
  uint8_t nch;
  pid_t pid; int channel; int is_send;
} ev_t;

static int last_log_level;
static char last_log[512];
static void logger(int level, unsigned long flags, const char *file, int line,
                   const char *fmt, ...) {
  (void)flags; (void)file; (void)line;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_log, sizeof last_log, fmt, ap);
  va_end(ap);
  last_log_level = level;
}

static int do_init(void **ctx, int *mask, const char *name, uint64_t hash, int nnodes,
                   int nranks, int rank) {
  switch (version) {
  case 4: return p4->init(ctx, mask, name, hash, nnodes, nranks, rank, logger);
  case 5: return p5->init(ctx, hash, mask, name, nnodes, nranks, rank, logger);
  default: return p6->init(ctx, hash, mask, name, nnodes, nranks, rank, logger);
  }
}

#define FILL_UNION(d, e)                                                          \
  do {                                                                            \
    if ((e)->type == EV_COLL) {                                                   \
      (d).coll.seqNumber = (e)->seq; (d).coll.func = (e)->func;                   \
      (d).coll.count = (e)->count; (d).coll.root = (e)->root;                     \
      (d).coll.datatype = (e)->dtype; (d).coll.nChannels = (e)->nch;              \
      (d).coll.nWarps = 16; (d).coll.algo = "RING"; (d).coll.proto = "SIMPLE";    \
    } else if ((e)->type == EV_P2P) {                                             \
      (d).p2p.func = (e)->func; (d).p2p.count = (e)->count;                       \
      (d).p2p.datatype = (e)->dtype; (d).p2p.peer = (e)->peer;                    \
      (d).p2p.nChannels = (e)->nch;                                               \
    } else if ((e)->type == EV_PROXY_OP) {                                        \
      (d).proxyOp.pid = (e)->pid; (d).proxyOp.channelId = (uint8_t)(e)->channel;  \
      (d).proxyOp.peer = (e)->peer; (d).proxyOp.nSteps = 8;                       \
      (d).proxyOp.chunkSize = 1 << 19; (d).proxyOp.isSend = (e)->is_send;         \
    } else if ((e)->type == EV_PROXY_STEP) {                                      \
      (d).proxyStep.step = (int)(e)->seq;                                         \
    } else if ((e)->type == EV_KERNEL_CH) {                                       \
      (d).kernelCh.channelId = (uint8_t)(e)->channel; (d).kernelCh.pTimer = 12345; \
    }                                                                             \
  } while (0)

static int do_start(void *ctx, void **handle, const ev_t *e) {
  switch (version) {
  case 4: {
    descr_v4_t d;
    memset(&d, 0, sizeof d);
    d.type = (uint8_t)e->type; d.parentObj = e->parent; d.rank = e->rank;
    FILL_UNION(d, e);
    return p4->startEvent(ctx, handle, &d);
  }
  case 5: {
    descr_v5_t d;
    memset(&d, 0, sizeof d);
    d.type = e->type; d.parentObj = e->parent; d.rank = e->rank;
    FILL_UNION(d, e);
    if (e->type == EV_COLL) d.coll.parentGroup = NULL;
    return p5->startEvent(ctx, handle, &d);
  }
  default: {
    descr_v6_t d;
    memset(&d, 0, sizeof d);
    d.type = e->type; d.parentObj = e->parent; d.rank = e->rank;
    FILL_UNION(d, e);
    if (e->type == EV_CE_COLL) {
      d.ceColl.seqNumber = e->seq; d.ceColl.func = e->func; d.ceColl.count = e->count;
      d.ceColl.datatype = e->dtype; d.ceColl.syncStrategy = "barrier";
    }
    return p6->startEvent(ctx, handle, &d);
  }
  }
}

static int do_stop(void *h) {
  return version == 4 ? p4->stopEvent(h) : version == 5 ? p5->stopEvent(h) : p6->stopEvent(h);
}
static int do_record(void *h, int state, void *args) {
  return version == 4   ? p4->recordEventState(h, state, args)
         : version == 5 ? p5->recordEventState(h, state, args)
                        : p6->recordEventState(h, state, args);
}
static int do_finalize(void *ctx) {
  return version == 4 ? p4->finalize(ctx) : version == 5 ? p5->finalize(ctx) : p6->finalize(ctx);
}

/* ---- a bounded queue of parent handles from a host thread to its proxy thread ---- */
#define QCAP 64
typedef struct {
  pthread_mutex_t mu; pthread_cond_t cv;
  void *items[QCAP]; int kinds[QCAP]; int head, tail, closed;
} queue_t;

static void q_push(queue_t *q, void *h, int kind) {
  pthread_mutex_lock(&q->mu);
  while (q->tail - q->head == QCAP) pthread_cond_wait(&q->cv, &q->mu);
  q->items[q->tail % QCAP] = h; q->kinds[q->tail % QCAP] = kind; q->tail++;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}
static int q_pop(queue_t *q, void **h, int *kind) {
  pthread_mutex_lock(&q->mu);
  while (q->tail == q->head && !q->closed) pthread_cond_wait(&q->cv, &q->mu);
  int got = q->tail != q->head;
  if (got) { *h = q->items[q->head % QCAP]; *kind = q->kinds[q->head % QCAP]; q->head++; }
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return got;
}
static void q_close(queue_t *q) {
  pthread_mutex_lock(&q->mu);
  q->closed = 1;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

/* ---- scenario "run" ---- */
#define NCOMMS 3
typedef struct {
  int index; void *ctx; int mask; int ops; int rank; int hang_last;
  queue_t q; void *hung;
} comm_t;

/* NCCL's proxy thread: a send and a receive ProxyOp per parent, each with a step. */
static void *proxy_thread(void *arg) {
  comm_t *c = arg;
  void *parent; int kind;
  while (q_pop(&c->q, &parent, &kind)) {
    if (!(c->mask & EV_PROXY_OP)) continue;
    for (int is_send = 1; is_send >= 0; is_send--) {
      void *op = (void *)0x1;
      ev_t e = { .type = EV_PROXY_OP, .parent = parent, .rank = c->rank,
                 .pid = self_pid, .channel = is_send, .peer = (c->rank + 1) % 4,
                 .is_send = is_send };
      OK(do_start(c->ctx, &op, &e));
      CHECK(op != NULL, "a ProxyOp under a recorded %s gets a handle",
            kind == EV_COLL ? "collective" : "p2p");
      OK(do_record(op, ST_PROXY_OP_IN_PROGRESS, NULL));
      if (c->mask & EV_PROXY_STEP) {
        void *step = (void *)0x1;
        ev_t s = { .type = EV_PROXY_STEP, .parent = op, .rank = c->rank, .seq = 0 };
        OK(do_start(c->ctx, &step, &s));
        size_t trans[1] = { 4096 };
        OK(do_record(step, ST_PROXY_STEP_SEND_WAIT, trans));
        OK(do_stop(step));
      }
      if (c->mask & EV_KERNEL_CH) {
        void *k = (void *)0x1;
        ev_t s = { .type = EV_KERNEL_CH, .parent = parent, .rank = c->rank, .channel = is_send };
        OK(do_start(c->ctx, &k, &s));
        CHECK(k != NULL, "a KernelCh under a recorded operation gets a handle");
        uint64_t stop_clock[1] = { 99999 };
        OK(do_record(k, ST_KERNEL_CH_STOP, stop_clock));
        OK(do_stop(k));
      }
      OK(do_stop(op));
    }
  }
  return NULL;
}

/* The application thread: ncclGroupStart/End around each collective; every tenth
 * step also a send/recv pair. NCCL stops the task events right after enqueueing,
 * usually before the proxy thread has started its ProxyOps. */
static void *host_thread(void *arg) {
  comm_t *c = arg;
  for (int i = 0; i < c->ops; i++) {
    void *group = (void *)0x1;
    ev_t g = { .type = EV_GROUP, .rank = c->rank };
    OK(do_start(c->ctx, &group, &g));
    CHECK(group == NULL, "group events are not followed");
    void *coll = NULL;
    ev_t e = { .type = EV_COLL, .parent = NULL, .rank = c->rank, .seq = (uint64_t)i,
               .func = "AllReduce", .count = 1024 * (size_t)(i + 1), .dtype = "ncclFloat32",
               .root = -1, .nch = 2 };
    OK(do_start(c->ctx, &coll, &e));
    CHECK(coll != NULL, "collective %d of comm %d gets a handle", i, c->index);
    bool last = i == c->ops - 1;
    if (last && c->hang_last) {
      /* Enters the collective and never gets further: no stop, no proxy work. */
      c->hung = coll;
      break;
    }
    q_push(&c->q, coll, EV_COLL);
    if (i % 10 == 9) {
      for (int s = 0; s < 2; s++) {
        void *p = NULL;
        ev_t pe = { .type = EV_P2P, .rank = c->rank, .func = s ? "Recv" : "Send",
                    .count = 256, .dtype = "ncclBfloat16", .peer = (c->rank + 1) % 4, .nch = 1 };
        OK(do_start(c->ctx, &p, &pe));
        CHECK(p != NULL, "p2p gets a handle");
        q_push(&c->q, p, EV_P2P);
        OK(do_stop(p));
      }
    }
    OK(do_stop(coll));
    OK(do_stop(group));
  }
  q_close(&c->q);
  return NULL;
}

static void scenario_run(int ops) {
  static comm_t comms[NCOMMS];
  const char *names[NCOMMS] = { "tp-0", "dp-0", NULL };
  for (int i = 0; i < NCOMMS; i++) {
    comm_t *c = &comms[i];
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->q.mu, NULL);
    pthread_cond_init(&c->q.cv, NULL);
    c->index = i; c->ops = ops; c->rank = i; c->hang_last = i == 0;
    c->mask = 0;
    OK(do_init(&c->ctx, &c->mask, names[i], 0xc0ffee00ULL + (uint64_t)i, 2, 4, i));
    CHECK(c->ctx != NULL, "comm %d gets a context (log: %s)", i, last_log);
    CHECK(c->mask & EV_COLL, "the mask asks for collectives (0x%x)", c->mask);
  }
  /* NCCL's mask is one process-wide int; every init wrote the same value. */
  pthread_t host[NCOMMS], proxy[NCOMMS];
  for (int i = 0; i < NCOMMS; i++) {
    pthread_create(&proxy[i], NULL, proxy_thread, &comms[i]);
    pthread_create(&host[i], NULL, host_thread, &comms[i]);
  }
  for (int i = 0; i < NCOMMS; i++) {
    pthread_join(host[i], NULL);
    pthread_join(proxy[i], NULL);
  }
  printf("harness: %d communicators x %d collectives done, last of comm 0 in flight\n",
         NCOMMS, ops);
  fflush(stdout);
  if (getenv("HARNESS_STOP")) raise(SIGSTOP);
  for (int i = 0; i < NCOMMS; i++) OK(do_finalize(comms[i].ctx));
}

/* ---- scenario "links" ---- */
#define LINK_STEPS 8      /* steps per ProxyOp */
#define LINK_WINDOW 4     /* steps in flight at once (NCCL allows NCCL_STEPS = 8) */
#define LINK_BYTES 65536  /* transSize of every send step */
#define LINK_SLOW_US 300  /* extra SendWait of peer 2's steps */
typedef struct {
  void *ctx; int mask; int ops; queue_t q;
} link_comm_t;

static void *link_proxy_thread(void *arg) {
  link_comm_t *c = arg;
  void *parent; int kind;
  while (q_pop(&c->q, &parent, &kind)) {
    /* NCCL's proxy: ops for the collective's channels, sends to 1 and 2, a receive. */
    const int peers[3] = { 1, 2, 3 }, sends[3] = { 1, 1, 0 };
    void *ops[3];
    for (int o = 0; o < 3; o++) {
      ops[o] = NULL;
      ev_t e = { .type = EV_PROXY_OP, .parent = parent, .rank = 0, .pid = self_pid,
                 .channel = 0, .peer = peers[o], .is_send = sends[o] };
      OK(do_start(c->ctx, &ops[o], &e));
      CHECK(ops[o] != NULL, "a ProxyOp under a recorded collective gets a handle");
      OK(do_record(ops[o], ST_PROXY_OP_IN_PROGRESS, NULL));
    }
    for (int base = 0; base < LINK_STEPS; base += LINK_WINDOW) {
      for (int o = 0; o < 3; o++) {
        void *steps[LINK_WINDOW];
        for (int k = 0; k < LINK_WINDOW; k++) {
          steps[k] = (void *)0x1;
          ev_t s = { .type = EV_PROXY_STEP, .parent = ops[o], .rank = 0,
                     .seq = (uint64_t)(base + k) };
          OK(do_start(c->ctx, &steps[k], &s));
          if (sends[o]) {
            CHECK(steps[k] != NULL, "a send step gets a handle");
            /* The GPU filled the buffer; the receiver accepted; isend posted. */
            OK(do_record(steps[k], ST_PROXY_STEP_SEND_GPU_WAIT, NULL));
            OK(do_record(steps[k], ST_PROXY_STEP_SEND_PEER_WAIT, NULL));
            state_args_t a;
            memset(&a, 0, sizeof a);
            a.proxyStep.transSize = LINK_BYTES;
            OK(do_record(steps[k], ST_PROXY_STEP_SEND_WAIT, &a));
          } else {
            OK(do_record(steps[k], ST_PROXY_STEP_RECV_WAIT, NULL));
          }
        }
        /* The network works on the window; peer 2's link is slow. */
        if (peers[o] == 2) usleep(LINK_SLOW_US);
        for (int k = 0; k < LINK_WINDOW; k++) {
          if (!sends[o]) {
            state_args_t a;
            memset(&a, 0, sizeof a);
            a.proxyStep.transSize = LINK_BYTES;
            OK(do_record(steps[k], ST_PROXY_STEP_RECV_FLUSH_WAIT, &a));
            OK(do_record(steps[k], ST_PROXY_STEP_RECV_GPU_WAIT, NULL));
          }
          OK(do_stop(steps[k]));
        }
      }
    }
    for (int o = 0; o < 3; o++) OK(do_stop(ops[o]));
  }
  return NULL;
}

static void scenario_links(int ops) {
  static link_comm_t c;
  memset(&c, 0, sizeof c);
  pthread_mutex_init(&c.q.mu, NULL);
  pthread_cond_init(&c.q.cv, NULL);
  c.ops = ops;
  OK(do_init(&c.ctx, &c.mask, "links", 0x11e4c000ULL, 2, 4, 0));
  CHECK(c.ctx != NULL, "the comm gets a context (log: %s)", last_log);
  CHECK(c.mask & EV_PROXY_STEP, "the mask asks for proxy steps (0x%x)", c.mask);
  pthread_t proxy;
  pthread_create(&proxy, NULL, link_proxy_thread, &c);
  for (int i = 0; i < ops; i++) {
    void *coll = NULL;
    ev_t e = { .type = EV_COLL, .rank = 0, .seq = (uint64_t)i, .func = "AllReduce",
               .count = 1 << 20, .dtype = "ncclFloat32", .root = -1, .nch = 1 };
    OK(do_start(c.ctx, &coll, &e));
    CHECK(coll != NULL, "collective %d gets a handle", i);
    q_push(&c.q, coll, EV_COLL);
    OK(do_stop(coll));
  }
  q_close(&c.q);
  pthread_join(proxy, NULL);
  printf("harness: links: %d collectives done\n", ops);
  fflush(stdout);
  if (getenv("HARNESS_STOP")) raise(SIGSTOP);
  OK(do_finalize(c.ctx));
}

/* ---- scenario "garbage" ---- */
static void scenario_garbage(void) {
  void *ctx = NULL;
  int mask = 0;
  OK(do_init(&ctx, &mask, NULL, 0xbadc0de, 1, 2, 0));
  CHECK(ctx != NULL, "init with a null name works (log: %s)", last_log);
  void *h = (void *)0x1;

  /* Null descriptor, null handle pointer, null context. */
  switch (version) {
  case 4: OK(p4->startEvent(ctx, &h, NULL)); break;
  case 5: OK(p5->startEvent(ctx, &h, NULL)); break;
  default: OK(p6->startEvent(ctx, &h, NULL)); break;
  }
  CHECK(h == NULL, "null descriptor: null handle");
  ev_t coll = { .type = EV_COLL, .func = "AllReduce", .count = 8, .dtype = "ncclInt8" };
  OK(do_start(ctx, NULL, &coll));
  h = (void *)0x1;
  OK(do_start(NULL, &h, &coll));
  CHECK(h == NULL, "null context: null handle");

  /* Unknown and untracked types. */
  uint64_t types[] = { 0, 1ULL << 20, 3, EV_PROXY_CTRL, EV_NET_PLUGIN, EV_GROUP_API,
                       EV_COLL_API, EV_CE_COLL, 255 };
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    if (version == 4 && types[i] > 255) continue;
    ev_t e = { .type = types[i], .parent = (void *)0xdeadbeef, .func = "AllReduce",
               .dtype = "ncclFloat32", .count = 4 };
    h = (void *)0x1;
    OK(do_start(ctx, &h, &e));
    CHECK(h == NULL, "type 0x%llx: null handle", (unsigned long long)types[i]);
    OK(do_stop(h));
    OK(do_record(h, 12345, NULL));
  }

  /* A collective with null and unknown names: recorded, zero bytes, unknown op. */
  ev_t odd = { .type = EV_COLL, .func = NULL, .count = (size_t)-1, .dtype = NULL, .nch = 255 };
  void *c1 = NULL;
  OK(do_start(ctx, &c1, &odd));
  CHECK(c1 != NULL, "a collective with null names is still recorded");
  ev_t odd2 = { .type = EV_COLL, .func = "Frobnicate", .count = 3,
                .dtype = "ncclVeryLongDatatypeNameThatGoesOnAndOnAndOnBeyondAnyLimit" };
  void *c2 = NULL;
  OK(do_start(ctx, &c2, &odd2));
  OK(do_record(c2, 999, NULL));
  OK(do_record(c2, ST_PROXY_OP_IN_PROGRESS, (void *)0xdeadbeef));

  /* Children with bad parents: null, foreign pid (PXN: the address is another
   * process's), an address that is not one of the plugin's, a tagged child handle. */
  int stack_thing = 0;
  ev_t kids[] = {
    { .type = EV_PROXY_OP, .parent = NULL, .pid = self_pid },
    { .type = EV_PROXY_OP, .parent = (void *)0xdeadbeef, .pid = self_pid + 1 },
    { .type = EV_PROXY_OP, .parent = &stack_thing, .pid = self_pid },
    { .type = EV_KERNEL_CH, .parent = NULL },
    { .type = EV_KERNEL_CH, .parent = (char *)c1 + 8 },
  };
  for (size_t i = 0; i < sizeof kids / sizeof kids[0]; i++) {
    h = (void *)0x1;
    OK(do_start(ctx, &h, &kids[i]));
    CHECK(h == NULL, "child %zu with a bad parent: null handle", i);
  }
  /* A proxy step under a real proxy op. */
  ev_t op = { .type = EV_PROXY_OP, .parent = c1, .pid = self_pid, .is_send = 1 };
  void *oph = NULL;
  OK(do_start(ctx, &oph, &op));
  CHECK(oph != NULL, "a ProxyOp under a recorded collective gets a handle");
  ev_t step = { .type = EV_PROXY_STEP, .parent = oph };
  void *sh = (void *)0x1;
  OK(do_start(ctx, &sh, &step));
  OK(do_stop(sh));
  OK(do_record(oph, ST_PROXY_OP_IN_PROGRESS, NULL));

  OK(do_stop(NULL));
  OK(do_record(NULL, ST_PROXY_OP_IN_PROGRESS, NULL));
  OK(do_finalize(NULL));

  OK(do_stop(c1));
  OK(do_stop(oph));
  OK(do_stop(c2));

  /* After all that, a plain collective still works. */
  void *c3 = NULL;
  ev_t plain = { .type = EV_COLL, .seq = 7, .func = "Broadcast", .count = 10,
                 .dtype = "ncclFloat64", .root = 3, .nch = 4 };
  OK(do_start(ctx, &c3, &plain));
  CHECK(c3 != NULL, "a plain collective after garbage gets a handle");
  OK(do_stop(c3));
  printf("harness: garbage done\n");
  fflush(stdout);
  if (getenv("HARNESS_STOP")) raise(SIGSTOP);
  OK(do_finalize(ctx));
}

/* ---- scenario "disabled" ---- */
static void scenario_disabled(void) {
  for (int i = 0; i < 2; i++) {
    void *ctx = (void *)0x1;
    int mask = 0;
    last_log_level = 0;
    OK(do_init(&ctx, &mask, "dp", 0xd15ab1ed + (uint64_t)i, 1, 2, i));
    CHECK(ctx == NULL, "init leaves the context null");
    CHECK(mask == 0, "init leaves the process-wide mask alone (0x%x)", mask);
    CHECK(last_log_level == 2 && strstr(last_log, "Warden profiler off") != NULL,
          "init warns through NCCL's logger (level %d: %s)", last_log_level, last_log);
    void *h = (void *)0x1;
    ev_t e = { .type = EV_COLL, .func = "AllReduce", .count = 8, .dtype = "ncclInt8" };
    OK(do_start(ctx, &h, &e));
    CHECK(h == NULL, "events of a disabled communicator get null handles");
    ev_t op = { .type = EV_PROXY_OP, .parent = h, .pid = self_pid };
    OK(do_start(ctx, &h, &op));
    OK(do_record(h, ST_PROXY_OP_IN_PROGRESS, NULL));
    OK(do_stop(h));
    OK(do_finalize(ctx));
  }
  printf("harness: disabled done (%s)\n", last_log);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s LIB VERSION SCENARIO\n", argv[0]);
    return 2;
  }
  self_pid = getpid();
  version = atoi(argv[2]);
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "harness: dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclProfiler_v%d", version);
  void *s = dlsym(lib, sym);
  if (!s) {
    fprintf(stderr, "harness: dlsym %s: %s\n", sym, dlerror());
    return 1;
  }
  p4 = s; p5 = s; p6 = s;
  CHECK(p5->name != NULL && strcmp(p5->name, "warden") == 0, "plugin name");

  const char *scenario = argv[3];
  if (strcmp(scenario, "disabled-unprivileged") == 0) {
    /* Root ignores directory permissions; give it up the way a job runs. */
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) {
      perror("harness: setuid");
      return 1;
    }
    scenario = "disabled";
  }
  const char *ops = getenv("HARNESS_OPS");
  if (strcmp(scenario, "run") == 0) scenario_run(ops ? atoi(ops) : 200);
  else if (strcmp(scenario, "garbage") == 0) scenario_garbage();
  else if (strcmp(scenario, "disabled") == 0) scenario_disabled();
  else if (strcmp(scenario, "links") == 0) scenario_links(ops ? atoi(ops) : 40);
  else {
    fprintf(stderr, "harness: unknown scenario %s\n", scenario);
    return 2;
  }
  /* NCCL closes the plugin when its last communicator is gone. */
  dlclose(lib);
  if (failures) {
    fprintf(stderr, "harness: %d checks failed\n", failures);
    return 1;
  }
  printf("harness: ok\n");
  return 0;
}
