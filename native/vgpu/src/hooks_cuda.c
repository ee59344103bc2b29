/*
 * CUDA driver hooks for initialisation, memory allocation and memory information. Each allocation is
 * reserved against the limit before the real call (so the limit is never passed, even for a moment),
 * recorded by pointer/handle after it, and un-accounted by the matching free.
 */
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "driver.h"
#include "shared_cache.h"
#include "memory.h"
#include "hooks.h"

#define REAL_OR_RETURN(n, err)                \
    do {                                      \
        if (VGPU_UNLIKELY(!HAVE_REAL(n)))     \
            return (err);                     \
    } while (0)

/* After the real allocation: keep the charge and remember it, or give it back. */
static CUresult settle(enum vgpu_table_kind kind, CUresult rc, uint64_t key, uint64_t bytes, int dev) {
    if (rc != CUDA_SUCCESS)
        vgpu_mem_release(dev, bytes);
    else if (!vgpu_table_put(kind, key, bytes, dev))
        vgpu_mem_release(dev, bytes); /* untrackable (no memory): a charge no free could remove is worse */
    return rc;
}

/* After the real free: drop the charge, or keep the record if the driver refused. */
static CUresult forget(enum vgpu_table_kind kind, CUresult rc, uint64_t key, bool tracked, uint64_t bytes,
                       int dev) {
    if (tracked && rc == CUDA_SUCCESS)
        vgpu_mem_release(dev, bytes);
    else if (tracked)
        vgpu_table_put(kind, key, bytes, dev);
    return rc;
}

VGPU_EXPORT CUresult cuInit(unsigned int flags) {
    vgpu_ensure_init();
    REAL_OR_RETURN(cuInit, CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = REAL(cuInit)(flags);
    if (rc == CUDA_SUCCESS) {
        vgpu_ensure_attached();
        if (vgpu_device_count == 0) {
            vgpu_refresh_device_count();
            vgpu_cache_record_devices(vgpu_device_count);
        }
        vgpu_host_pid_look_once(VGPU_LOOK_AT_INIT); /* HAMi-core knows it when cuInit returns */
    }
    return rc;
}

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    vgpu_ready();
    REAL_OR_RETURN(cuMemAlloc_v2, CUDA_ERROR_NOT_INITIALIZED);
    if (!dptr || bytesize == 0)
        return REAL(cuMemAlloc_v2)(dptr, bytesize); /* the driver reports the bad argument */
    int dev = vgpu_current_device();
    if (!vgpu_mem_reserve(dev, bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = REAL(cuMemAlloc_v2)(dptr, bytesize);
    return settle(VGPU_TABLE_DPTR, rc, rc == CUDA_SUCCESS ? *dptr : 0, bytesize, dev);
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    vgpu_ready();
    REAL_OR_RETURN(cuMemAllocManaged, CUDA_ERROR_NOT_INITIALIZED);
    if (!dptr || bytesize == 0)
        return REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    int dev = vgpu_current_device();
    if (!vgpu_mem_reserve(dev, bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    return settle(VGPU_TABLE_DPTR, rc, rc == CUDA_SUCCESS ? *dptr : 0, bytesize, dev);
}

/* The pitch is only known afterwards: reserve the unpadded size, then charge the difference. */
VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                        unsigned int ElementSizeBytes) {
    vgpu_ready();
    REAL_OR_RETURN(cuMemAllocPitch_v2, CUDA_ERROR_NOT_INITIALIZED);
    uint64_t est;
    if (!dptr || !pPitch || __builtin_mul_overflow((uint64_t)WidthInBytes, (uint64_t)Height, &est) || est == 0)
        return REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    int dev = vgpu_current_device();
    if (!vgpu_mem_reserve(dev, est))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (rc != CUDA_SUCCESS)
        return settle(VGPU_TABLE_DPTR, rc, 0, est, dev);
    uint64_t actual = (uint64_t)*pPitch * Height;
    if (actual > est && !vgpu_mem_reserve(dev, actual - est)) {
        if (HAVE_REAL(cuMemFree_v2))
            REAL(cuMemFree_v2)(*dptr);
        vgpu_mem_release(dev, est);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (actual < est)
        vgpu_mem_release(dev, est - actual);
    return settle(VGPU_TABLE_DPTR, rc, *dptr, actual, dev);
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    vgpu_ready();
    REAL_OR_RETURN(cuMemFree_v2, CUDA_ERROR_NOT_INITIALIZED);
    uint64_t bytes = 0;
    int dev = -1;
    bool tracked = vgpu_table_take(VGPU_TABLE_DPTR, dptr, &bytes, &dev);
    CUresult rc = REAL(cuMemFree_v2)(dptr); /* untracked pointers are freed too, not leaked */
    return forget(VGPU_TABLE_DPTR, rc, dptr, tracked, bytes, dev);
}

/* Stream-ordered allocations are charged by requested size (the pool's cached reserve is not). */
#define ASYNC_ALLOC(name, ...)                                                     \
    vgpu_ready();                                                                \
    REAL_OR_RETURN(name, CUDA_ERROR_NOT_INITIALIZED);                            \
    if (!dptr || bytesize == 0)                                                  \
        return REAL(name)(dptr, bytesize, __VA_ARGS__);                          \
    int dev = vgpu_current_device();                                             \
    if (!vgpu_mem_reserve(dev, bytesize))                                        \
        return CUDA_ERROR_OUT_OF_MEMORY;                                         \
    CUresult rc = REAL(name)(dptr, bytesize, __VA_ARGS__);                       \
    return settle(VGPU_TABLE_DPTR, rc, rc == CUDA_SUCCESS ? *dptr : 0, bytesize, dev)

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocAsync, hStream);
}
VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocAsync_ptsz, hStream);
}
VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocFromPoolAsync, pool, hStream);
}
VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                  CUstream hStream) {
    ASYNC_ALLOC(cuMemAllocFromPoolAsync_ptsz, pool, hStream);
}

#define ASYNC_FREE(name)                                                           \
    vgpu_ready();                                                                \
    REAL_OR_RETURN(name, CUDA_ERROR_NOT_INITIALIZED);                            \
    uint64_t bytes = 0;                                                          \
    int dev = -1;                                                                \
    bool tracked = vgpu_table_take(VGPU_TABLE_DPTR, dptr, &bytes, &dev);         \
    CUresult rc = REAL(name)(dptr, hStream);                                     \
    return forget(VGPU_TABLE_DPTR, rc, dptr, tracked, bytes, dev)

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { ASYNC_FREE(cuMemFreeAsync); }
VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { ASYNC_FREE(cuMemFreeAsync_ptsz); }

/* VMM: physical memory is charged at cuMemCreate when it lives on a device; mapping it is free. */
VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags) {
    vgpu_ready();
    REAL_OR_RETURN(cuMemCreate, CUDA_ERROR_NOT_INITIALIZED);
    if (!handle || !prop || size == 0 || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return REAL(cuMemCreate)(handle, size, prop, flags);
    int dev = prop->location.id;
    if (!vgpu_mem_reserve(dev, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = REAL(cuMemCreate)(handle, size, prop, flags);
    return settle(VGPU_TABLE_VMM, rc, rc == CUDA_SUCCESS ? *handle : 0, size, dev);
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    vgpu_ready();
    REAL_OR_RETURN(cuMemRelease, CUDA_ERROR_NOT_INITIALIZED);
    uint64_t bytes = 0;
    int dev = -1;
    bool tracked = vgpu_table_take(VGPU_TABLE_VMM, handle, &bytes, &dev);
    CUresult rc = REAL(cuMemRelease)(handle);
    return forget(VGPU_TABLE_VMM, rc, handle, tracked, bytes, dev);
}

static uint64_t element_bytes(CUarray_format format) {
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4; /* 32-bit formats; an estimate for the exotic ones */
    }
}

/* Bytes of a W x H x D array (0 in H or D means a lower-dimensional array), saturating. */
static uint64_t array_bytes(size_t w, size_t h, size_t d, unsigned channels, CUarray_format format) {
    uint64_t n = element_bytes(format) * (channels ? channels : 1);
    if (__builtin_mul_overflow(n, (uint64_t)w, &n) || __builtin_mul_overflow(n, (uint64_t)(h ? h : 1), &n) ||
        __builtin_mul_overflow(n, (uint64_t)(d ? d : 1), &n))
        return UINT64_MAX;
    return n;
}

static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
    uint64_t sum = 0;
    size_t w = desc->Width, h = desc->Height, d = desc->Depth;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        uint64_t b = array_bytes(w, h, d, desc->NumChannels, desc->Format);
        if (__builtin_add_overflow(sum, b, &sum))
            return UINT64_MAX;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        d = d > 1 ? d / 2 : d;
    }
    return sum;
}

#define ARRAY_CREATE(name, bytes_expr, ...)                                        \
    vgpu_ready();                                                                \
    REAL_OR_RETURN(name, CUDA_ERROR_NOT_INITIALIZED);                            \
    if (!pHandle || !desc)                                                       \
        return REAL(name)(pHandle, __VA_ARGS__);                                 \
    uint64_t bytes = (bytes_expr);                                               \
    int dev = vgpu_current_device();                                             \
    if (!vgpu_mem_reserve(dev, bytes))                                           \
        return CUDA_ERROR_OUT_OF_MEMORY;                                         \
    CUresult rc = REAL(name)(pHandle, __VA_ARGS__);                              \
    return settle(VGPU_TABLE_ARRAY, rc, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0, bytes, dev)

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    ARRAY_CREATE(cuArrayCreate_v2, array_bytes(desc->Width, desc->Height, 0, desc->NumChannels, desc->Format),
                 desc);
}
VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    ARRAY_CREATE(cuArray3DCreate_v2,
                 array_bytes(desc->Width, desc->Height, desc->Depth, desc->NumChannels, desc->Format), desc);
}
VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int numMipmapLevels) {
    ARRAY_CREATE(cuMipmappedArrayCreate, mipmap_bytes(desc, numMipmapLevels), desc, numMipmapLevels);
}

#define ARRAY_DESTROY(name, handle)                                                          \
    vgpu_ready();                                                                          \
    REAL_OR_RETURN(name, CUDA_ERROR_NOT_INITIALIZED);                                      \
    uint64_t key = (uint64_t)(uintptr_t)(handle), bytes = 0;                               \
    int dev = -1;                                                                          \
    bool tracked = vgpu_table_take(VGPU_TABLE_ARRAY, key, &bytes, &dev);                   \
    CUresult rc = REAL(name)(handle);                                                      \
    return forget(VGPU_TABLE_ARRAY, rc, key, tracked, bytes, dev)

VGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray) { ARRAY_DESTROY(cuArrayDestroy, hArray); }
VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    ARRAY_DESTROY(cuMipmappedArrayDestroy, hMipmappedArray);
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    vgpu_ready();
    REAL_OR_RETURN(cuMemGetInfo_v2, CUDA_ERROR_NOT_INITIALIZED);
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    size_t f, t;
    CUresult rc = REAL(cuMemGetInfo_v2)(&f, &t);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t vf, vt, used;
    vgpu_mem_view(vgpu_current_device(), f, t, &vf, &vt, &used);
    *free = (size_t)vf;
    *total = (size_t)vt;
    return CUDA_SUCCESS;
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    vgpu_ready();
    REAL_OR_RETURN(cuDeviceTotalMem_v2, CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (rc == CUDA_SUCCESS && dev >= 0 && dev < VGPU_MAX_DEVICES && vgpu_limit[dev] && vgpu_limit[dev] < *bytes)
        *bytes = (size_t)vgpu_limit[dev];
    return rc;
}
