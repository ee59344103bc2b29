/*
 * Context memory: what the driver holds for each CUDA context (on real GPUs some 100-300 MiB) is charged
 * against the limit, in the slot's context field, so the container's usage is what nvidia-smi shows on
 * the host and opening many contexts cannot overrun the card.
 *
 * The size is the driver's own figure, sampled right after the context is created: NVML's memory for this
 * process on that device, less what this process has already been granted there (allocations and earlier
 * contexts). HAMi-core samples once, at start-up, and charges that figure to every primary context; we
 * sample each context, primary or created (cuCtxCreate_v2/_v3/_v4), so a second context is charged what
 * it really adds. A primary context is charged at its first retain and released at its last release; a
 * created one at its destroy. Unlike HAMi-core, which adds the charge even past the limit, a context
 * whose charge does not fit is destroyed again and the call fails with CUDA_ERROR_OUT_OF_MEMORY, the
 * driver's own answer when a context does not fit on the device.
 *
 * Our process in NVML's list: our PID (no PID namespace), else our host PID already known, else the one
 * PID that appeared in the list while the context was created (HAMi-core's discovery); whichever it is,
 * it is our host PID from then on (hostpid.c). If none of these tells (say two of the container's
 * processes created contexts at once), the context is charged all the memory that appeared on the device
 * meanwhile, as the listings show it (a WARN line says so): that holds our context and may hold another's,
 * so the charge can be too large until the context goes, never too small - a tenant who races its
 * processes must not get contexts for free.
 *
 * VGPU_CONTEXT_MEMORY=ignore turns all of this off (contexts pass straight to the driver); the limits
 * file pins the setting (limits.c). Context creation and destruction are serialised within the process,
 * so each sample sees exactly one new context.
 */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"
#include "driver.h"
#include "shared_cache.h"
#include "memory.h"
#include "hooks.h"

enum { MAX_LISTED = 256 };

struct listing {
    unsigned count;
    bool ok;
    nvmlProcessInfo_v1_t infos[MAX_LISTED];
    bool device_ok; /* device_used was read */
    unsigned long long device_used;
};

struct created_ctx {
    CUcontext ctx;
    int dev;
    uint64_t bytes;
};

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static bool nvml_ok;
static struct listing before; /* ctx_mu */
static struct listing after;  /* ctx_mu */
static int primary_refs[VGPU_MAX_DEVICES];       /* ctx_mu: our count of successful retains */
static uint64_t primary_bytes[VGPU_MAX_DEVICES]; /* ctx_mu */
static struct created_ctx *created;              /* ctx_mu */
static size_t n_created, cap_created;            /* ctx_mu */

static void lock_before_fork(void) { pthread_mutex_lock(&ctx_mu); }
static void unlock_after_fork(void) { pthread_mutex_unlock(&ctx_mu); }

/* A fork child has no CUDA contexts and a fresh slot with nothing charged. */
static void forget_after_fork(void) {
    for (int d = 0; d < VGPU_MAX_DEVICES; d++)
        primary_refs[d] = 0, primary_bytes[d] = 0;
    n_created = 0;
    pthread_mutex_unlock(&ctx_mu);
}

static void setup(void) {
    pthread_atfork(lock_before_fork, unlock_after_fork, forget_after_fork);
    /* NVML counts its initialisations: the sampler's own nvmlInit is unaffected. */
    nvml_ok = HAVE_REAL(nvmlInit_v2) && REAL(nvmlInit_v2)() == NVML_SUCCESS;
}

static bool charging(void) { return vgpu_config.context_memory == VGPU_CONTEXT_CHARGE; }

static void list_processes(int dev, struct listing *out) {
    out->ok = false;
    out->count = 0;
    int idx = vgpu_nvml_index(dev);
    nvmlDevice_t h;
    if (!nvml_ok || idx < 0 || !HAVE_REAL(nvmlDeviceGetHandleByIndex_v2) ||
        !HAVE_REAL(nvmlDeviceGetComputeRunningProcesses) ||
        REAL(nvmlDeviceGetHandleByIndex_v2)((unsigned)idx, &h) != NVML_SUCCESS)
        return;
    nvmlMemory_t memory;
    out->device_ok = HAVE_REAL(nvmlDeviceGetMemoryInfo) && REAL(nvmlDeviceGetMemoryInfo)(h, &memory) == NVML_SUCCESS;
    out->device_used = out->device_ok ? memory.used : 0;
    unsigned count = MAX_LISTED;
    if (REAL(nvmlDeviceGetComputeRunningProcesses)(h, &count, out->infos) != NVML_SUCCESS)
        return;
    out->count = count < MAX_LISTED ? count : MAX_LISTED;
    out->ok = true;
}

/* Whether every listed process's memory is a figure (not NVML_VALUE_NOT_AVAILABLE). */
static bool figures(const struct listing *l) {
    for (unsigned i = 0; i < l->count; i++)
        if (l->infos[i].usedGpuMemory == VGPU_NVML_MEMORY_NOT_AVAILABLE)
            return false;
    return true;
}

static const nvmlProcessInfo_v1_t *find_pid(const struct listing *l, unsigned pid) {
    for (unsigned i = 0; pid && i < l->count; i++)
        if (l->infos[i].pid == pid)
            return &l->infos[i];
    return NULL;
}

/* Our entry in `after`, or NULL when it cannot be told apart from other processes'. What it finds is our
 * host PID (hostpid.c): a driver lists a process from its first context on, so this is where it can tell. */
static const nvmlProcessInfo_v1_t *our_entry(void) {
    const nvmlProcessInfo_v1_t *e = find_pid(&after, (unsigned)getpid());
    if (!e)
        e = find_pid(&after, (unsigned)vgpu_host_pid());
    if (!e && before.ok) {
        for (unsigned i = 0; i < after.count; i++) {
            if (find_pid(&before, after.infos[i].pid))
                continue;
            if (e)
                return NULL; /* two processes got a context meanwhile: neither is known to be us */
            e = &after.infos[i];
        }
    }
    if (e)
        vgpu_host_pid_found((int32_t)e->pid); /* the monitor maps processes by it */
    return e;
}

static uint64_t listed_total(const struct listing *l) {
    uint64_t total = 0;
    for (unsigned i = 0; i < l->count; i++)
        total += l->infos[i].usedGpuMemory;
    return total;
}

/* Bytes the context just created on dev holds, as the driver reports them; an upper bound when our entry
 * cannot be told apart; 0 when NVML lists nothing. */
static uint64_t sample_context(int dev) {
    static bool warned, warned_na;
    list_processes(dev, &after);
    if ((after.ok && !figures(&after)) || (before.ok && !figures(&before))) {
        /* The driver lists processes without their memory: taken as a figure, NOT_AVAILABLE (2^64-1) would
         * make every context look enormous and be refused. The device's used memory still counts it. */
        if (!warned_na)
            vgpu_log(VGPU_LOG_WARN, "device %d: NVML does not report per-process memory (NOT_AVAILABLE); a "
                     "context is charged the memory the device gained while it was created", dev);
        warned_na = true;
        if (after.ok)
            (void)our_entry(); /* still learns our host PID, which the monitor maps processes by */
        return before.device_ok && after.device_ok && after.device_used > before.device_used
                   ? after.device_used - before.device_used
                   : 0;
    }
    const nvmlProcessInfo_v1_t *e = after.ok ? our_entry() : NULL;
    if (!e) {
        uint64_t was = before.ok ? listed_total(&before) : 0, now = after.ok ? listed_total(&after) : 0;
        if (!warned)
            vgpu_log(VGPU_LOG_WARN, "device %d: NVML does not tell this process's memory apart; a context is "
                     "charged all the memory that appeared on the device while it was created", dev);
        warned = true;
        return before.ok && now > was ? now - was : 0;
    }
    uint64_t granted = vgpu_mem_granted(dev);
    return e->usedGpuMemory > granted ? e->usedGpuMemory - granted : 0;
}

/* Lock and list the processes before a context is created; false (nothing taken) when not charging. */
static bool begin(CUcontext *pctx, CUdevice dev) {
    if (!charging() || !pctx || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return false;
    pthread_once(&setup_once, setup);
    pthread_mutex_lock(&ctx_mu);
    list_processes(dev, &before);
    return true;
}

/* Charge a new context, or, when that does not fit, tell the caller to undo it. */
static bool charge(int dev, uint64_t *bytes) {
    *bytes = sample_context(dev);
    if (*bytes == 0 || vgpu_mem_reserve_context(dev, *bytes)) /* nothing to charge fits even over the limit */
        return true;
    vgpu_log(VGPU_LOG_ERROR, "Device %d: a new context holds %llu bytes, over the limit; context refused", dev,
             (unsigned long long)*bytes);
    return false;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    vgpu_ready();
    if (VGPU_UNLIKELY(!HAVE_REAL(cuDevicePrimaryCtxRetain)))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!begin(pctx, dev))
        return REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    CUresult rc = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    if (rc == CUDA_SUCCESS && primary_refs[dev] == 0) {
        uint64_t bytes;
        if (!charge(dev, &bytes)) {
            if (HAVE_REAL(cuDevicePrimaryCtxRelease_v2))
                REAL(cuDevicePrimaryCtxRelease_v2)(dev);
            *pctx = NULL;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            primary_bytes[dev] = bytes;
        }
    }
    if (rc == CUDA_SUCCESS)
        primary_refs[dev]++;
    pthread_mutex_unlock(&ctx_mu);
    return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    vgpu_ready();
    if (VGPU_UNLIKELY(!HAVE_REAL(cuDevicePrimaryCtxRelease_v2)))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!charging() || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return REAL(cuDevicePrimaryCtxRelease_v2)(dev);
    pthread_once(&setup_once, setup);
    pthread_mutex_lock(&ctx_mu);
    CUresult rc = REAL(cuDevicePrimaryCtxRelease_v2)(dev);
    if (rc == CUDA_SUCCESS && primary_refs[dev] > 0 && --primary_refs[dev] == 0) {
        vgpu_mem_release_context(dev, primary_bytes[dev]);
        primary_bytes[dev] = 0;
    }
    pthread_mutex_unlock(&ctx_mu);
    return rc;
}

static bool remember(CUcontext ctx, int dev, uint64_t bytes) {
    if (n_created == cap_created) {
        size_t cap = cap_created ? cap_created * 2 : 16;
        struct created_ctx *grown = realloc(created, cap * sizeof *grown);
        if (!grown)
            return false;
        created = grown, cap_created = cap;
    }
    created[n_created++] = (struct created_ctx){ctx, dev, bytes};
    return true;
}

/* After the real cuCtxCreate*: charge the context, or destroy it again when it does not fit. */
static CUresult finish_create(CUresult rc, CUcontext *pctx, CUdevice dev) {
    uint64_t bytes;
    if (rc == CUDA_SUCCESS && !charge(dev, &bytes)) {
        if (HAVE_REAL(cuCtxDestroy_v2))
            REAL(cuCtxDestroy_v2)(*pctx);
        *pctx = NULL;
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (rc == CUDA_SUCCESS && !remember(*pctx, dev, bytes)) {
        vgpu_mem_release_context(dev, bytes); /* a charge no destroy could remove is worse */
        vgpu_log(VGPU_LOG_WARN, "out of memory recording a context; it is not charged");
    }
    pthread_mutex_unlock(&ctx_mu);
    return rc;
}

#define CTX_CREATE(name, ...)                                             \
    vgpu_ready();                                                         \
    if (VGPU_UNLIKELY(!HAVE_REAL(name)))                                  \
        return CUDA_ERROR_NOT_INITIALIZED;                                \
    if (!begin(pctx, dev))                                                \
        return REAL(name)(pctx, __VA_ARGS__, dev);                        \
    return finish_create(REAL(name)(pctx, __VA_ARGS__, dev), pctx, dev)

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CTX_CREATE(cuCtxCreate_v2, flags);
}
VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                    unsigned int flags, CUdevice dev) {
    CTX_CREATE(cuCtxCreate_v3, paramsArray, numParams, flags);
}
VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                    CUdevice dev) {
    CTX_CREATE(cuCtxCreate_v4, ctxCreateParams, flags);
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    vgpu_ready();
    if (VGPU_UNLIKELY(!HAVE_REAL(cuCtxDestroy_v2)))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!charging())
        return REAL(cuCtxDestroy_v2)(ctx);
    pthread_once(&setup_once, setup);
    pthread_mutex_lock(&ctx_mu);
    CUresult rc = REAL(cuCtxDestroy_v2)(ctx);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < n_created; i++) {
        if (created[i].ctx == ctx) {
            vgpu_mem_release_context(created[i].dev, created[i].bytes);
            created[i] = created[--n_created];
            break;
        }
    }
    pthread_mutex_unlock(&ctx_mu);
    return rc;
}
