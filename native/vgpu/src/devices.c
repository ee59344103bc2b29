/*
 * Which device: the device count, the calling thread's device, and how CUDA ordinals map to NVML indices.
 * Devices are matched by CUDA ordinal, the index HAMi's CUDA_DEVICE_MEMORY_LIMIT_<i> uses;
 * CUDA_VISIBLE_DEVICES maps CUDA ordinals to NVML indices. Its entries are indices or GPU UUIDs (`GPU-...`,
 * whole or a prefix that names one GPU, as CUDA accepts them), resolved through NVML. Any other entry (a
 * MIG UUID, a UUID no GPU has) leaves the identity map, which is also what a HAMi container without
 * CUDA_VISIBLE_DEVICES has.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "driver.h"

int vgpu_device_count;

void vgpu_refresh_device_count(void) {
    int n = 0;
    if (HAVE_REAL(cuDeviceGetCount) && REAL(cuDeviceGetCount)(&n) == CUDA_SUCCESS && n > 0)
        __atomic_store_n(&vgpu_device_count, n, __ATOMIC_RELEASE);
}

int vgpu_current_device(void) {
    if (__atomic_load_n(&vgpu_device_count, __ATOMIC_RELAXED) == 1)
        return 0; /* the common case costs no driver call */
    CUdevice d;
    if (HAVE_REAL(cuCtxGetDevice) && REAL(cuCtxGetDevice)(&d) == CUDA_SUCCESS)
        return d;
    return -1;
}

static int cuda_to_nvml[VGPU_MAX_DEVICES];
static int mapped; /* number of CUDA ordinals CUDA_VISIBLE_DEVICES named; 0 = identity */
static pthread_once_t map_once = PTHREAD_ONCE_INIT;

/* The NVML index of the GPU whose UUID is `uuid` (its first `len` characters), or which alone starts
 * with them; -1 when none does, several do, or NVML cannot tell. */
static int index_of_uuid(const char *uuid, size_t len) {
    unsigned count = 0;
    if (!HAVE_REAL(nvmlInit_v2) || !HAVE_REAL(nvmlDeviceGetCount_v2) || !HAVE_REAL(nvmlDeviceGetHandleByIndex_v2) ||
        !HAVE_REAL(nvmlDeviceGetUUID) || REAL(nvmlInit_v2)() != NVML_SUCCESS ||
        REAL(nvmlDeviceGetCount_v2)(&count) != NVML_SUCCESS)
        return -1;
    int found = -1;
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t h;
        char name[96];
        if (REAL(nvmlDeviceGetHandleByIndex_v2)(i, &h) != NVML_SUCCESS ||
            REAL(nvmlDeviceGetUUID)(h, name, sizeof name) != NVML_SUCCESS || strncmp(name, uuid, len) != 0)
            continue;
        if (name[len] == '\0')
            return (int)i; /* the whole UUID */
        if (found >= 0)
            return -1; /* a prefix of two GPUs' UUIDs names neither */
        found = (int)i;
    }
    return found;
}

static int index_of_entry(const char *entry, size_t len) {
    if (len > 4 && strncmp(entry, "GPU-", 4) == 0)
        return index_of_uuid(entry, len);
    char *end;
    long idx = strtol(entry, &end, 10);
    return (end == entry + len && len > 0 && idx >= 0 && idx <= 255) ? (int)idx : -1;
}

static void load_map(void) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    for (const char *p = v; p && *p && n < VGPU_MAX_DEVICES;) {
        size_t len = strcspn(p, ",");
        int idx = index_of_entry(p, len);
        if (idx < 0)
            return; /* an entry we cannot place: identity */
        cuda_to_nvml[n++] = idx;
        p += len;
        if (*p == ',')
            p++;
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
