/*
 * A scriptable fake CUDA driver + NVML for tests only (one .so, soname libcuda.so.1, also linked as
 * libnvidia-ml.so.1 so both halves share state). Knobs, from the environment or from KEY=VALUE lines in
 * the file named by VGPU_STUB_SCRIPT (the environment wins):
 *   VGPU_STUB_MEMORY     physical memory per device (k/m/g suffix), default 16g
 *   VGPU_STUB_DEVICES    device count, default 1
 *   VGPU_STUB_SM_COUNT   multiprocessors per device, default 80
 *   VGPU_STUB_KERNEL_US  modelled device time of every kernel, in microseconds (may be fractional), default 0
 *   VGPU_STUB_CAPACITY   thread blocks per second the fake GPU runs; each block adds 1/capacity seconds to
 *                        its kernel's device time; default 0 = blocks add nothing
 *   VGPU_STUB_QUEUE_US   most modelled device time a launch may leave queued before it waits, default 100000
 *   VGPU_STUB_UTIL       "model" (default: utilisation is the modelled device time, see "utilisation
 *                        model" in stub_cuda.c) or a trace "u0,u1,..." returned one value per utilisation
 *                        query, the last one repeating
 *   VGPU_STUB_PID_OFFSET NVML reports host PID = pid + offset (a PID namespace), default 0
 *   VGPU_STUB_HIDE_PROCESS  1: NVML never lists this process
 *   VGPU_STUB_FAIL       "fnName=code,..." : those functions return that error code
 *   VGPU_STUB_CONTEXT_SIZE  device memory each live context holds (k/m/g suffix), default 0: a retained
 *                        primary context and every cuCtxCreate* context count once each in NVML's
 *                        per-process usedGpuMemory and in the device's used memory, as on a real GPU
 *   VGPU_STUB_LIST_AFTER_CONTEXT  1: NVML lists this process only while it holds a context (a real
 *                        driver's behaviour); default 0 lists it from cuInit on
 *   VGPU_STUB_PROCESS_MEMORY_NA  1: NVML lists processes with usedGpuMemory NVML_VALUE_NOT_AVAILABLE (as
 *                        drivers under WDDM or some virtualisation do); the device's used memory still counts
 *   VGPU_STUB_NVML_INIT_US  how long each nvmlInit takes, in microseconds (a real one takes tens of ms),
 *                        default 0
 */
#ifndef VGPU_STUB_H
#define VGPU_STUB_H

#include <stdint.h>

#include "vgpu_cuda.h"
#include "vgpu_nvml.h"

struct stub_config {
    uint64_t memory;
    int devices;
    int sm_count;
    double capacity;
    int util_trace[64];
    int util_trace_len; /* 0 = model */
    int pid_offset;
    int hide_process;
    uint64_t context_size;
    int list_after_context;
    int process_memory_na;
    unsigned nvml_init_us;
    /* the utilisation model, in nanoseconds */
    uint64_t kernel_ns;
    uint64_t queue_ns;
};

const struct stub_config *stub_config(void);
int stub_injected_error(const char *fn); /* 0 = none */
int stub_initialized(void);
uint64_t stub_used_bytes(int dev);
unsigned stub_util_percent(int dev); /* consumes one trace step / one model window */
uint64_t stub_context_bytes(int dev);  /* what this process's live contexts hold on dev */
int stub_context_count(void);         /* live contexts on every device */
/* Modelled device time of `dev` completed so far, in ns, for test programs (it consumes nothing). */
uint64_t stub_busy_ns(int dev);

#endif
