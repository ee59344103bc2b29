/*
 * NVML hooks: memory information shows the container's slice. Devices are matched by CUDA ordinal, the
 * index HAMi's CUDA_DEVICE_MEMORY_LIMIT_<i> uses; CUDA_VISIBLE_DEVICES (integer lists only) maps CUDA
 * ordinals to NVML indices. Any entry that is not an integer (a UUID, a MIG name) leaves the identity
 * map, which is also what a HAMi container without CUDA_VISIBLE_DEVICES has.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "vgpu.h"

static int cuda_to_nvml[VGPU_MAX_DEVICES];
static int mapped; /* number of CUDA ordinals CUDA_VISIBLE_DEVICES named; 0 = identity */
static pthread_once_t map_once = PTHREAD_ONCE_INIT;

static void load_map(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    for (const char *p = v; p && *p && n < VGPU_MAX_DEVICES;) {
        char *end;
        long idx = strtol(p, &end, 10);
        if (end == p || idx < 0 || idx > 255 || (*end != ',' && *end != '\0'))
            return; /* not an integer list: identity */
        cuda_to_nvml[n++] = (int)idx;
        p = *end ? end + 1 : end;
    }
    mapped = n;
}

int vgpu_nvml_index(int cuda_dev) {
    pthread_once(&map_once, load_map);
    if (mapped == 0)
        return cuda_dev;
    return (cuda_dev >= 0 && cuda_dev < mapped) ? cuda_to_nvml[cuda_dev] : -1;
}

int vgpu_cuda_ordinal(unsigned nvml_index) {
    pthread_once(&map_once, load_map);
    if (mapped == 0)
        return (int)nvml_index;
    for (int i = 0; i < mapped; i++)
        if (cuda_to_nvml[i] == (int)nvml_index)
            return i;
    return -1; /* a GPU this process's CUDA cannot see: shown as the driver reports it */
}

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
