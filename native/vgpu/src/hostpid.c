/*
 * This process's host PID: the PID NVML lists it under. HAMi's monitor maps a container's processes by it
 * (the slot's hostpid) and the SM limiter reads per-process utilisation by it.
 *
 * HAMi-core learns it inside cuInit: it retains a primary context between two NVML process listings and
 * takes the PID that appeared. We create no context of our own (on a real GPU one costs some 100 ms and
 * hundreds of MiB, and is torn down again only for the application to create its own); we look when the
 * driver can tell:
 *  - when cuInit returns: one listing; our own PID in it is our host PID (no PID namespace, and a driver
 *    that lists a process before it has a context);
 *  - at the first context creation (a real driver lists a process only from then on): context.c lists
 *    the processes around it, HAMi-core's comparison made on the application's own context, and reports
 *    ours here; that also tells it in a PID namespace;
 *  - before the first kernel launch returns: a launch needs a context, so one more listing if it is
 *    still unknown (VGPU_CONTEXT_MEMORY=ignore, or a context made past our hooks).
 * Each of these looks once per process (again in a fork child), so no later launch pays for it; while it
 * stays unknown the sampler looks again on its ticks. In a PID namespace without the context comparison
 * it stays unknown, and the limiter steers by the device's utilisation.
 */
#include <pthread.h>
#include <unistd.h>

#include "config.h"
#include "driver.h"
#include "shared_cache.h"

enum { MAX_LISTED = 256 };

static _Atomic int32_t host_pid;    /* 0 until known */
static _Atomic unsigned looked;     /* the VGPU_LOOK_* stages already done */
static pthread_mutex_t look_mu = PTHREAD_MUTEX_INITIALIZER; /* serialises listings and nvml_once */
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static bool nvml_ok;

/* NVML counts its initialisations: the sampler's and context.c's own are unaffected. */
static void setup_nvml(void) { nvml_ok = HAVE_REAL(nvmlInit_v2) && REAL(nvmlInit_v2)() == NVML_SUCCESS; }

int32_t vgpu_host_pid(void) { return atomic_load_explicit(&host_pid, memory_order_acquire); }

void vgpu_host_pid_found(int32_t pid) {
    int32_t unknown = 0;
    if (pid <= 0)
        return;
    atomic_compare_exchange_strong(&host_pid, &unknown, pid); /* the first finding stands */
    struct vgpu_slot *me = atomic_load_explicit(&vgpu_my_slot, memory_order_acquire);
    if (me)
        VGPU_STORE(&me->hostpid, vgpu_host_pid());
}

/* Caller holds look_mu. Lists every device's processes; also refreshes monitorused for the monitor. */
static void look_locked(void) {
    pthread_once(&nvml_once, setup_nvml);
    if (!nvml_ok || !HAVE_REAL(nvmlDeviceGetHandleByIndex_v2) || !HAVE_REAL(nvmlDeviceGetComputeRunningProcesses))
        return;
    nvmlProcessInfo_v1_t infos[MAX_LISTED];
    int n = __atomic_load_n(&vgpu_device_count, __ATOMIC_RELAXED);
    n = n <= 0 ? 1 : (n > VGPU_MAX_DEVICES ? VGPU_MAX_DEVICES : n);
    for (int d = 0; d < n; d++) {
        int idx = vgpu_nvml_index(d);
        nvmlDevice_t h;
        unsigned count = MAX_LISTED;
        if (idx < 0 || REAL(nvmlDeviceGetHandleByIndex_v2)((unsigned)idx, &h) != NVML_SUCCESS ||
            REAL(nvmlDeviceGetComputeRunningProcesses)(h, &count, infos) != NVML_SUCCESS)
            continue;
        for (unsigned i = 0; i < count && i < MAX_LISTED; i++) {
            if (infos[i].pid == (unsigned)getpid())
                vgpu_host_pid_found((int32_t)infos[i].pid);
            struct vgpu_slot *me = atomic_load_explicit(&vgpu_my_slot, memory_order_acquire);
            int32_t hp = vgpu_host_pid();
            if (me && hp && infos[i].pid == (unsigned)hp &&
                infos[i].usedGpuMemory != VGPU_NVML_MEMORY_NOT_AVAILABLE) /* unknown: left as it was */
                VGPU_STORE(&me->monitorused[d], infos[i].usedGpuMemory);
        }
    }
}

void vgpu_host_pid_look(void) {
    pthread_mutex_lock(&look_mu);
    look_locked();
    pthread_mutex_unlock(&look_mu);
}

void vgpu_host_pid_look_once(unsigned stage) {
    if (VGPU_LIKELY(atomic_load_explicit(&looked, memory_order_acquire) & stage))
        return;
    pthread_mutex_lock(&look_mu); /* a second caller waits: its call too returns with the look done */
    if (!(atomic_load(&looked) & stage)) {
        if (!vgpu_host_pid())
            look_locked();
        atomic_fetch_or_explicit(&looked, stage, memory_order_release);
    }
    pthread_mutex_unlock(&look_mu);
}

void vgpu_host_pid_before_fork(void) { pthread_mutex_lock(&look_mu); }

/* A fork child is another process with another host PID, to be looked for again. */
void vgpu_host_pid_after_fork(bool child) {
    if (child) {
        atomic_store(&host_pid, 0);
        atomic_store(&looked, 0);
    }
    pthread_mutex_unlock(&look_mu);
}
