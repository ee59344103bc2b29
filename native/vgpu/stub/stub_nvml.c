/* The NVML half of the test stub (see stub.h). */
#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "stub.h"

#define EXPORT __attribute__((visibility("default")))

static int nvml_up;

static nvmlReturn_t check(const char *fn) {
    int e = stub_injected_error(fn);
    if (e)
        return (nvmlReturn_t)e;
    return nvml_up ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

static int index_of(nvmlDevice_t h) {
    long i = (long)(uintptr_t)h - 0x100;
    return (i >= 0 && i < stub_config()->devices) ? (int)i : -1;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    int e = stub_injected_error("nvmlInit_v2");
    if (e)
        return (nvmlReturn_t)e;
    unsigned us = stub_config()->nvml_init_us;
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000L};
    while (us && nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
    nvml_up = 1;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    nvmlReturn_t rc = check("nvmlDeviceGetCount_v2");
    if (rc == NVML_SUCCESS)
        *n = (unsigned)stub_config()->devices;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned idx, nvmlDevice_t *h) {
    nvmlReturn_t rc = check("nvmlDeviceGetHandleByIndex_v2");
    if (rc != NVML_SUCCESS)
        return rc;
    if (idx >= (unsigned)stub_config()->devices)
        return NVML_ERROR_INVALID_ARGUMENT;
    *h = (nvmlDevice_t)(uintptr_t)(0x100 + idx);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned *idx) {
    int i = index_of(h);
    if (i < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *idx = (unsigned)i;
    return check("nvmlDeviceGetIndex");
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned len) {
    int i = index_of(h);
    if (i < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(uuid, len, "GPU-00000000-0000-0000-0000-%012d", i);
    return check("nvmlDeviceGetUUID");
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    int i = index_of(h);
    nvmlReturn_t rc = check("nvmlDeviceGetMemoryInfo");
    if (rc != NVML_SUCCESS || i < 0 || !m)
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    m->total = stub_config()->memory;
    m->used = stub_used_bytes(i) + stub_context_bytes(i);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    int i = index_of(h);
    nvmlReturn_t rc = check("nvmlDeviceGetMemoryInfo_v2");
    if (rc != NVML_SUCCESS || i < 0 || !m)
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    m->total = stub_config()->memory;
    m->reserved = 0;
    m->used = stub_used_bytes(i) + stub_context_bytes(i);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

static unsigned host_pid(void) { return (unsigned)((int)getpid() + stub_config()->pid_offset); }
static int listed(void) {
    const struct stub_config *c = stub_config();
    return stub_initialized() && !c->hide_process && (!c->list_after_context || stub_context_count() > 0);
}

/* A process's memory as nvidia-smi shows it: its allocations plus its contexts. */
static unsigned long long process_memory(int dev) {
    if (stub_config()->process_memory_na)
        return VGPU_NVML_MEMORY_NOT_AVAILABLE;
    return stub_used_bytes(dev) + stub_context_bytes(dev);
}

/* The v1 ABI and the two-call INSUFFICIENT_SIZE protocol of the unversioned symbol. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned *count,
                                                         nvmlProcessInfo_v1_t *infos) {
    int i = index_of(h);
    nvmlReturn_t rc = check("nvmlDeviceGetComputeRunningProcesses");
    if (rc != NVML_SUCCESS || i < 0 || !count)
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = listed() ? 1 : 0;
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    if (n)
        infos[0] = (nvmlProcessInfo_v1_t){.pid = host_pid(), .usedGpuMemory = process_memory(i)};
    return NVML_SUCCESS;
}

/* _v2 and _v3 take the four-field struct (MIG instance ids; 0xFFFFFFFF = not on a MIG instance). */
static nvmlReturn_t running_processes_v2(const char *fn, nvmlDevice_t h, unsigned *count, nvmlProcessInfo_v2_t *infos) {
    int i = index_of(h);
    nvmlReturn_t rc = check(fn);
    if (rc != NVML_SUCCESS || i < 0 || !count)
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = listed() ? 1 : 0;
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    if (n)
        infos[0] = (nvmlProcessInfo_v2_t){.pid = host_pid(), .usedGpuMemory = process_memory(i),
                                          .gpuInstanceId = 0xFFFFFFFFu, .computeInstanceId = 0xFFFFFFFFu};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return running_processes_v2("nvmlDeviceGetComputeRunningProcesses_v2", h, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned *count,
                                                            nvmlProcessInfo_v2_t *infos) {
    return running_processes_v2("nvmlDeviceGetComputeRunningProcesses_v3", h, count, infos);
}

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *s,
                                                    unsigned *count, unsigned long long last_seen) {
    int i = index_of(h);
    nvmlReturn_t rc = check("nvmlDeviceGetProcessUtilization");
    if (rc != NVML_SUCCESS || i < 0 || !count)
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    if (!listed())
        return NVML_ERROR_NOT_FOUND;
    if (!s || *count < 1) {
        *count = 1;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned long long t = now_us();
    if (t <= last_seen)
        return NVML_ERROR_NOT_FOUND;
    s[0] = (nvmlProcessUtilizationSample_t){.pid = host_pid(), .timeStamp = t, .smUtil = stub_util_percent(i)};
    *count = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    int i = index_of(h);
    nvmlReturn_t rc = check("nvmlDeviceGetUtilizationRates");
    if (rc != NVML_SUCCESS || i < 0 || !u)
        return rc != NVML_SUCCESS ? rc : NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = stub_util_percent(i);
    u->memory = 0;
    return NVML_SUCCESS;
}
