/*
 * NVML hooks: memory information shows the container's slice. Devices are matched by CUDA ordinal, the
 * index HAMi's CUDA_DEVICE_MEMORY_LIMIT_<i> uses (devices.c maps NVML indices to CUDA ordinals through
 * CUDA_VISIBLE_DEVICES).
 */
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "driver.h"
#include "memory.h"
#include "hooks.h"

static int ordinal_of(nvmlDevice_t device) {
    unsigned idx;
    if (!HAVE_REAL(nvmlDeviceGetIndex) || REAL(nvmlDeviceGetIndex)(device, &idx) != NVML_SUCCESS)
        return -1;
    return vgpu_cuda_ordinal(idx);
}

/* Rewrite a device's free/total/used as its slice sees them; false (nothing changed) when it has no limit.
 * Both NVML memory structs share these three fields, so both versions go through here. */
static bool slice_view(nvmlDevice_t device, unsigned long long *free, unsigned long long *total,
                       unsigned long long *used) {
    int dev = ordinal_of(device);
    if (dev < 0 || dev >= VGPU_MAX_DEVICES || vgpu_limit[dev] == 0)
        return false;
    uint64_t f, t, u;
    vgpu_mem_view(dev, *free, *total, &f, &t, &u);
    *total = t;
    *used = u;
    *free = f;
    return true;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    vgpu_ready();
    if (!HAVE_REAL(nvmlDeviceGetMemoryInfo))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = REAL(nvmlDeviceGetMemoryInfo)(device, memory);
    if (rc == NVML_SUCCESS && memory)
        slice_view(device, &memory->free, &memory->total, &memory->used);
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    vgpu_ready();
    if (!HAVE_REAL(nvmlDeviceGetMemoryInfo_v2))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = REAL(nvmlDeviceGetMemoryInfo_v2)(device, memory);
    if (rc == NVML_SUCCESS && memory && slice_view(device, &memory->free, &memory->total, &memory->used))
        memory->reserved = 0; /* driver reservations are outside the slice's accounting */
    return rc;
}
