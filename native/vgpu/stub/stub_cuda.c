/* The CUDA half of the test stub (see stub.h). */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stub.h"

#define EXPORT __attribute__((visibility("default")))
#define FAIL_IF_INJECTED(fn)                         \
    do {                                             \
        int e_ = stub_injected_error(fn);            \
        if (e_)                                      \
            return (CUresult)e_;                     \
    } while (0)
#define NEED_INIT()                                  \
    do {                                             \
        if (!stub_initialized())                     \
            return CUDA_ERROR_NOT_INITIALIZED;       \
    } while (0)

enum { MAX_DEV = 16, MAX_CFG_LINE = 256 };

static struct stub_config cfg;
static char fail_spec[1024];
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static int initialized;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t used[MAX_DEV];
static uint64_t next_addr[MAX_DEV];
static int trace_pos;
static __thread int current_dev = -1;

struct alloc {
    uint64_t key, bytes;
    int dev;
};
static struct alloc *allocs;
static size_t n_allocs, cap_allocs;

static const char *knob(const char *key, char *buf, size_t len) {
    const char *v = getenv(key);
    if (v)
        return v;
    const char *path = getenv("VGPU_STUB_SCRIPT");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return NULL;
    char line[MAX_CFG_LINE];
    const char *found = NULL;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (strncmp(line, key, klen) == 0 && line[klen] == '=') {
            snprintf(buf, len, "%s", line + klen + 1);
            found = buf;
        }
    }
    fclose(f);
    return found;
}

static uint64_t parse_size(const char *v, uint64_t dflt) {
    if (!v)
        return dflt;
    char *end;
    uint64_t n = strtoull(v, &end, 10);
    switch (*end) {
    case 'k': case 'K': return n << 10;
    case 'm': case 'M': return n << 20;
    case 'g': case 'G': return n << 30;
    default: return n;
    }
}

static void load_config(void) {
    char buf[MAX_CFG_LINE];
    cfg.memory = parse_size(knob("VGPU_STUB_MEMORY", buf, sizeof buf), 16ULL << 30);
    const char *v = knob("VGPU_STUB_DEVICES", buf, sizeof buf);
    cfg.devices = v ? atoi(v) : 1;
    if (cfg.devices < 1 || cfg.devices > MAX_DEV)
        cfg.devices = 1;
    v = knob("VGPU_STUB_SM_COUNT", buf, sizeof buf);
    cfg.sm_count = v ? atoi(v) : 80;
    v = knob("VGPU_STUB_CAPACITY", buf, sizeof buf);
    cfg.capacity = v ? atof(v) : 0;
    v = knob("VGPU_STUB_KERNEL_US", buf, sizeof buf);
    cfg.kernel_ns = v && atof(v) > 0 ? (uint64_t)(atof(v) * 1e3) : 0;
    v = knob("VGPU_STUB_QUEUE_US", buf, sizeof buf);
    cfg.queue_ns = v && atof(v) >= 0 ? (uint64_t)(atof(v) * 1e3) : 100000000ULL;
    v = knob("VGPU_STUB_PID_OFFSET", buf, sizeof buf);
    cfg.pid_offset = v ? atoi(v) : 0;
    v = knob("VGPU_STUB_HIDE_PROCESS", buf, sizeof buf);
    cfg.hide_process = v ? atoi(v) : 0;
    v = knob("VGPU_STUB_UTIL", buf, sizeof buf);
    if (v && strcmp(v, "model") != 0) {
        for (const char *p = v; *p && cfg.util_trace_len < 64;) {
            char *end;
            cfg.util_trace[cfg.util_trace_len++] = (int)strtol(p, &end, 10);
            p = *end == ',' ? end + 1 : end + strlen(end);
        }
    }
    cfg.context_size = parse_size(knob("VGPU_STUB_CONTEXT_SIZE", buf, sizeof buf), 0);
    v = knob("VGPU_STUB_LIST_AFTER_CONTEXT", buf, sizeof buf);
    cfg.list_after_context = v ? atoi(v) : 0;
    v = knob("VGPU_STUB_PROCESS_MEMORY_NA", buf, sizeof buf);
    cfg.process_memory_na = v ? atoi(v) : 0;
    v = knob("VGPU_STUB_NVML_INIT_US", buf, sizeof buf);
    cfg.nvml_init_us = v && atoi(v) > 0 ? (unsigned)atoi(v) : 0;
    v = knob("VGPU_STUB_FAIL", buf, sizeof buf);
    snprintf(fail_spec, sizeof fail_spec, "%s", v ? v : "");
    for (int d = 0; d < MAX_DEV; d++)
        next_addr[d] = 0x7f0000000000ULL + ((uint64_t)d << 36);
}

const struct stub_config *stub_config(void) {
    pthread_once(&cfg_once, load_config);
    return &cfg;
}

int stub_injected_error(const char *fn) {
    stub_config();
    size_t len = strlen(fn);
    for (const char *p = fail_spec; (p = strstr(p, fn)) != NULL; p += len) {
        bool starts = p == fail_spec || p[-1] == ',';
        if (starts && p[len] == '=')
            return atoi(p + len + 1);
    }
    return 0;
}

int stub_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }

uint64_t stub_used_bytes(int dev) {
    pthread_mutex_lock(&mu);
    uint64_t u = (dev >= 0 && dev < MAX_DEV) ? used[dev] : 0;
    pthread_mutex_unlock(&mu);
    return u;
}

/* ---- utilisation model ----
 * Each device is a timeline on which this process's kernels run one after another, as on a GPU that the
 * process has to itself (the model is per process: tests run one process per device). A kernel launched at
 * time t starts at max(t, the end of the kernel before it) and lasts VGPU_STUB_KERNEL_US plus
 * blocks / VGPU_STUB_CAPACITY. A launch that leaves more than VGPU_STUB_QUEUE_US of work queued waits until
 * the device has worked it down to that, as a real launch blocks on a full queue; so a process that
 * launches flat out keeps the device at 100 %, and no faster. NVML reports, as a real driver does, the
 * share of the sampling window (here: since the previous query) in which the device ran this process's
 * kernels. Everything is modelled device time on CLOCK_MONOTONIC: how much CPU the launching process gets
 * changes only when it can launch, never how long its kernels run. */
struct timeline {
    uint64_t busy_until; /* the end of the last kernel queued, ns */
    uint64_t queued;     /* device time of every kernel queued so far, ns */
    uint64_t window_start, done_at_window_start;
};
static struct timeline timelines[MAX_DEV];
static pthread_mutex_t timeline_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Device time completed by `t`, no earlier than every launch so far: each kernel started by then, or
 * starts when the one before it ends, so the device is busy without a gap from t to busy_until. */
static uint64_t done_by(const struct timeline *l, uint64_t t) {
    return l->queued - (l->busy_until > t ? l->busy_until - t : 0);
}

static void start_timelines(void) {
    pthread_mutex_lock(&timeline_mu);
    uint64_t t = mono_ns();
    for (int d = 0; d < MAX_DEV; d++)
        if (timelines[d].window_start == 0)
            timelines[d].window_start = t;
    pthread_mutex_unlock(&timeline_mu);
}

static void run_kernel(int dev, uint64_t blocks) {
    const struct stub_config *c = &cfg;
    if (c->kernel_ns == 0 && c->capacity <= 0)
        return; /* kernels cost nothing: launch at full speed, utilisation stays 0 */
    double per_block = c->capacity > 0 ? 1e9 / c->capacity : 0;
    double ns = (double)c->kernel_ns + (double)blocks * per_block;
    uint64_t cost = ns < 3.6e12 ? (uint64_t)ns : 3600000000000ULL; /* an hour at most */
    pthread_mutex_lock(&timeline_mu);
    struct timeline *l = &timelines[dev];
    uint64_t t = mono_ns();
    l->busy_until = (l->busy_until > t ? l->busy_until : t) + cost;
    l->queued += cost;
    uint64_t backlog = l->busy_until - t;
    pthread_mutex_unlock(&timeline_mu);
    if (backlog > c->queue_ns) {
        uint64_t wait = backlog - c->queue_ns;
        struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000ULL), .tv_nsec = (long)(wait % 1000000000ULL)};
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
        }
    }
}

uint64_t stub_busy_ns(int dev) {
    if (dev < 0 || dev >= MAX_DEV)
        return 0;
    pthread_mutex_lock(&timeline_mu);
    uint64_t done = done_by(&timelines[dev], mono_ns());
    pthread_mutex_unlock(&timeline_mu);
    return done;
}

static unsigned model_util_percent(int dev) {
    pthread_mutex_lock(&timeline_mu);
    struct timeline *l = &timelines[dev];
    uint64_t t = mono_ns(), done = done_by(l, t);
    uint64_t span = t - l->window_start, busy = done - l->done_at_window_start;
    l->window_start = t;
    l->done_at_window_start = done;
    pthread_mutex_unlock(&timeline_mu);
    uint64_t pct = span ? (200 * busy + span) / (2 * span) : 0; /* rounded, as NVML reports whole percents */
    return pct > 100 ? 100 : (unsigned)pct;
}

unsigned stub_util_percent(int dev) {
    const struct stub_config *c = stub_config();
    if (dev < 0 || dev >= MAX_DEV)
        return 0;
    if (c->util_trace_len == 0)
        return model_util_percent(dev);
    pthread_mutex_lock(&mu);
    int i = trace_pos < c->util_trace_len ? trace_pos++ : c->util_trace_len - 1;
    unsigned u = (unsigned)c->util_trace[i];
    pthread_mutex_unlock(&mu);
    return u;
}

/* ---- device memory ---- */

static CUresult stub_alloc(uint64_t *key_out, uint64_t bytes, int dev) {
    if (dev < 0 || dev >= cfg.devices)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mu);
    CUresult rc = CUDA_SUCCESS;
    if (bytes > cfg.memory - used[dev]) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (n_allocs == cap_allocs && !(allocs = realloc(allocs, (cap_allocs = cap_allocs ? cap_allocs * 2 : 64) * sizeof *allocs))) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        uint64_t key = next_addr[dev];
        next_addr[dev] += (bytes + 511) / 512 * 512 + 512;
        allocs[n_allocs++] = (struct alloc){key, bytes, dev};
        used[dev] += bytes;
        *key_out = key;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

static CUresult stub_free(uint64_t key) {
    pthread_mutex_lock(&mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = n_allocs; i-- > 0;) {
        if (allocs[i].key == key) {
            used[allocs[i].dev] -= allocs[i].bytes;
            allocs[i] = allocs[--n_allocs];
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

static CUresult stub_alloc_ptr(unsigned long long *out, uint64_t bytes, int dev) {
    uint64_t key = 0;
    CUresult rc = stub_alloc(&key, bytes, dev);
    *out = key;
    return rc;
}

static int cur_dev(void) { return current_dev >= 0 ? current_dev : -1; }

/* ---- exported driver API ---- */

EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    stub_config();
    FAIL_IF_INJECTED("cuInit");
    if (!stub_initialized())
        start_timelines();
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    *v = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    NEED_INIT();
    if (ordinal < 0 || ordinal >= cfg.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
    NEED_INIT();
    *n = cfg.devices;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attr, CUdevice dev) {
    NEED_INIT();
    if (dev < 0 || dev >= cfg.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *pi = attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? cfg.sm_count : 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    NEED_INIT();
    if (dev < 0 || dev >= cfg.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)cfg.memory;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    NEED_INIT();
    if (dev < 0 || dev >= cfg.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    uuid->bytes[15] = (char)dev; /* prints as NVML's GPU-00000000-0000-0000-0000-00000000000<dev> */
    return CUDA_SUCCESS;
}

/* ---- contexts: each live one holds VGPU_STUB_CONTEXT_SIZE of device memory ---- */

/* Primary context of dev: handle 0x1000 + dev, alive while retained. A created context: handle
 * CREATED_BASE + (serial << 8) + dev, alive until destroyed. */
enum { CREATED_BASE = 0x100000, MAX_CREATED = 256 };
static int primary_refs[MAX_DEV];
static uintptr_t created[MAX_CREATED]; /* 0 = free entry */
static unsigned created_serial;
static __thread CUcontext current_ctx;

static int primary_device(uintptr_t h) {
    return (h >= 0x1000 && h < 0x1000 + (uintptr_t)cfg.devices) ? (int)(h - 0x1000) : -1;
}

static int created_index(uintptr_t h) {
    for (int i = 0; h >= CREATED_BASE && i < MAX_CREATED; i++)
        if (created[i] == h)
            return i;
    return -1;
}

/* The device of a live context, -1 for anything else. Caller holds mu. */
static int ctx_device_locked(CUcontext ctx) {
    uintptr_t h = (uintptr_t)ctx;
    int d = primary_device(h);
    if (d >= 0)
        return primary_refs[d] > 0 ? d : -1;
    return created_index(h) >= 0 ? (int)(h & 0xff) : -1;
}

uint64_t stub_context_bytes(int dev) {
    const struct stub_config *c = stub_config();
    if (dev < 0 || dev >= MAX_DEV)
        return 0;
    pthread_mutex_lock(&mu);
    uint64_t n = primary_refs[dev] > 0;
    for (int i = 0; i < MAX_CREATED; i++)
        n += created[i] != 0 && (int)(created[i] & 0xff) == dev;
    pthread_mutex_unlock(&mu);
    return n * c->context_size;
}

int stub_context_count(void) {
    int n = 0;
    pthread_mutex_lock(&mu);
    for (int d = 0; d < MAX_DEV; d++)
        n += primary_refs[d] > 0;
    for (int i = 0; i < MAX_CREATED; i++)
        n += created[i] != 0;
    pthread_mutex_unlock(&mu);
    return n;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    NEED_INIT();
    FAIL_IF_INJECTED("cuDevicePrimaryCtxRetain");
    if (dev < 0 || dev >= cfg.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    primary_refs[dev]++;
    pthread_mutex_unlock(&mu);
    *ctx = (CUcontext)(uintptr_t)(0x1000 + dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    NEED_INIT();
    if (dev < 0 || dev >= cfg.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (primary_refs[dev] > 0)
        primary_refs[dev]--;
    else
        rc = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&mu);
    return rc;
}

static CUresult create_context(CUcontext *pctx, CUdevice dev) {
    NEED_INIT();
    FAIL_IF_INJECTED("cuCtxCreate");
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= cfg.devices)
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY; /* no free entry: as a driver out of context memory */
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_CREATED; i++) {
        if (created[i] == 0) {
            created[i] = CREATED_BASE + ((uintptr_t)(++created_serial) << 8) + (uintptr_t)dev;
            *pctx = (CUcontext)created[i];
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    if (rc == CUDA_SUCCESS) { /* a new context becomes the calling thread's current one */
        current_ctx = *pctx;
        current_dev = dev;
    }
    return rc;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return create_context(pctx, dev);
}
EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                               CUdevice dev) {
    (void)params, (void)n, (void)flags;
    return create_context(pctx, dev);
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    (void)params, (void)flags;
    return create_context(pctx, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    NEED_INIT();
    pthread_mutex_lock(&mu);
    int i = created_index((uintptr_t)ctx);
    if (i >= 0)
        created[i] = 0;
    pthread_mutex_unlock(&mu);
    if (i < 0)
        return CUDA_ERROR_INVALID_CONTEXT; /* unknown, already destroyed, or a primary context */
    if (current_ctx == ctx) {
        current_ctx = NULL;
        current_dev = -1;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = current_ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    pthread_mutex_lock(&mu);
    int d = ctx ? ctx_device_locked(ctx) : -1;
    pthread_mutex_unlock(&mu);
    if (ctx && d < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    current_ctx = ctx;
    current_dev = d;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (current_dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *d = current_dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    NEED_INIT();
    FAIL_IF_INJECTED("cuMemGetInfo_v2");
    int d = cur_dev();
    if (d < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *total = (size_t)cfg.memory;
    *free = (size_t)(cfg.memory - stub_used_bytes(d) - stub_context_bytes(d));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    NEED_INIT();
    FAIL_IF_INJECTED("cuMemAlloc_v2");
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return stub_alloc_ptr(dptr, bytes, cur_dev());
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    NEED_INIT();
    return dptr ? stub_free(dptr) : CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned elem) {
    NEED_INIT();
    (void)elem;
    if (!dptr || !pitch || w == 0 || h == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *pitch = (w + 511) / 512 * 512;
    return stub_alloc_ptr(dptr, (uint64_t)*pitch * h, cur_dev());
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags) {
    NEED_INIT();
    (void)flags;
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return stub_alloc_ptr(dptr, bytes, cur_dev());
}

#define ASYNC_ALLOC_BODY                              \
    NEED_INIT();                                      \
    (void)s;                                          \
    if (!dptr || bytes == 0)                          \
        return CUDA_ERROR_INVALID_VALUE;              \
    return stub_alloc_ptr(dptr, bytes, cur_dev())

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s) { ASYNC_ALLOC_BODY; }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s) { ASYNC_ALLOC_BODY; }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool p, CUstream s) {
    (void)p;
    ASYNC_ALLOC_BODY;
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool p, CUstream s) {
    (void)p;
    ASYNC_ALLOC_BODY;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) {
    (void)s;
    return stub_free(dptr);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) {
    (void)s;
    return stub_free(dptr);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    NEED_INIT();
    (void)flags;
    if (!h || !prop || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return stub_alloc_ptr(h, size, prop->location.id);
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return stub_free(h); }

static CUresult array_alloc(void **out, uint64_t bytes) {
    uint64_t key;
    CUresult rc = stub_alloc(&key, bytes, cur_dev());
    if (rc == CUDA_SUCCESS)
        *out = (void *)(uintptr_t)key;
    return rc;
}
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    NEED_INIT();
    return array_alloc((void **)a, (uint64_t)d->Width * (d->Height ? d->Height : 1) * d->NumChannels);
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    NEED_INIT();
    return array_alloc((void **)a, (uint64_t)d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
                                       d->NumChannels);
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return stub_free((uint64_t)(uintptr_t)a); }
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    NEED_INIT();
    (void)levels;
    return array_alloc((void **)a, (uint64_t)d->Width * (d->Height ? d->Height : 1) * d->NumChannels * 2);
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return stub_free((uint64_t)(uintptr_t)a); }

static CUresult launch(unsigned gx, unsigned gy, unsigned gz) {
    NEED_INIT();
    FAIL_IF_INJECTED("cuLaunchKernel");
    int d = cur_dev();
    if (d < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    run_kernel(d, (uint64_t)gx * gy * gz);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned sh, CUstream s, void **p, void **e) {
    (void)f, (void)bx, (void)by, (void)bz, (void)sh, (void)s, (void)p, (void)e;
    return launch(gx, gy, gz);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned sh, CUstream s, void **p, void **e) {
    (void)f, (void)bx, (void)by, (void)bz, (void)sh, (void)s, (void)p, (void)e;
    return launch(gx, gy, gz);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    (void)f, (void)p, (void)e;
    return c ? launch(c->gridDimX, c->gridDimY, c->gridDimZ) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    (void)f, (void)p, (void)e;
    return c ? launch(c->gridDimX, c->gridDimY, c->gridDimZ) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned sh, CUstream s, void **p) {
    (void)f, (void)bx, (void)by, (void)bz, (void)sh, (void)s, (void)p;
    return launch(gx, gy, gz);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned sh, CUstream s, void **p) {
    (void)f, (void)bx, (void)by, (void)bz, (void)sh, (void)s, (void)p;
    return launch(gx, gy, gz);
}

/* A test graph's handle is the number of blocks it runs (graphs are not built in the stub). */
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    (void)s;
    return g ? launch((unsigned)(uintptr_t)g, 1, 1) : CUDA_ERROR_INVALID_HANDLE;
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    (void)s;
    return g ? launch((unsigned)(uintptr_t)g, 1, 1) : CUDA_ERROR_INVALID_HANDLE;
}
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned n, unsigned flags) {
    (void)flags;
    if (!list || n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUresult rc = launch(list[i].gridDimX, list[i].gridDimY, list[i].gridDimZ);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}

/* Names from other CUDA libraries, so tests can check the interposer leaves them alone. */
EXPORT int cudnnCreate(void **handle) {
    *handle = NULL;
    return 0;
}
EXPORT int cudaMalloc(void **p, size_t n) {
    (void)n;
    *p = NULL;
    return 0;
}

/* ---- cuGetProcAddress: the driver's own functions by base name and version ---- */
#define STUB_TABLE(X)                                                                                  \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute)        \
    X(cuDeviceTotalMem_v2) X(cuDeviceGetUuid_v2) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2)                 \
    X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxCreate_v2) X(cuCtxDestroy_v2) X(cuGetProcAddress) X(cuGetProcAddress_v2) \
    X(cuMemGetInfo_v2) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged)     \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync)                              \
    X(cuMemAllocFromPoolAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemCreate)            \
    X(cuMemRelease) X(cuArrayCreate_v2) X(cuArray3DCreate_v2) X(cuArrayDestroy)                        \
    X(cuMipmappedArrayCreate) X(cuMipmappedArrayDestroy) X(cuLaunchKernel) X(cuLaunchKernel_ptsz)      \
    X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) X(cuLaunchCooperativeKernel)                          \
    X(cuLaunchCooperativeKernel_ptsz) X(cuLaunchCooperativeKernelMultiDevice) X(cuGraphLaunch)          \
    X(cuGraphLaunch_ptsz)

#define STUB_ENTRY(n) {#n, (void *)&n},
static const struct {
    const char *name;
    void *fn;
} TABLE[] = {STUB_TABLE(STUB_ENTRY)};

static void *by_name(const char *name) {
    for (size_t i = 0; i < sizeof TABLE / sizeof TABLE[0]; i++)
        if (strcmp(TABLE[i].name, name) == 0)
            return TABLE[i].fn;
    return NULL;
}

static CUresult proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags, int *status) {
    char name[128];
    void *p = NULL;
    *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        p = by_name(name);
    }
    if (!p && version >= (strcmp(symbol, "cuGetProcAddress") == 0 ? 12000 : 3020)) {
        snprintf(name, sizeof name, "%s_v2", symbol);
        p = by_name(name);
    }
    if (!p)
        p = by_name(symbol);
    *pfn = p;
    if (!p)
        return CUDA_ERROR_NOT_FOUND;
    *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    int status;
    return proc_address(symbol, pfn, version, flags, &status);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    int s;
    CUresult rc = proc_address(symbol, pfn, version, flags, &s);
    if (status)
        *status = s;
    return rc;
}
