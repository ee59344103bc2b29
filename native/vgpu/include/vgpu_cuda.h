/*
 * The CUDA driver types, constants and prototypes libvgpu needs, declared here so the library builds
 * without a CUDA toolkit. When the real <cuda.h> has been included first (the header check, built with
 * __CUDA_API_VERSION_INTERNAL so no name is macro-renamed), the types come from it and everything below
 * turns into compile-time checks: each constant must have cuda.h's value, each struct cuda.h's layout, and
 * each prototype is a redeclaration the compiler rejects if it differs from cuda.h's.
 */
#ifndef VGPU_CUDA_H
#define VGPU_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* CUresult values we return or test for. */
#define VGPU_CU_RESULTS(X)                       \
    X(CUDA_SUCCESS, 0)                           \
    X(CUDA_ERROR_INVALID_VALUE, 1)               \
    X(CUDA_ERROR_OUT_OF_MEMORY, 2)               \
    X(CUDA_ERROR_NOT_INITIALIZED, 3)             \
    X(CUDA_ERROR_DEINITIALIZED, 4)               \
    X(CUDA_ERROR_NO_DEVICE, 100)                 \
    X(CUDA_ERROR_INVALID_DEVICE, 101)            \
    X(CUDA_ERROR_INVALID_CONTEXT, 201)           \
    X(CUDA_ERROR_INVALID_HANDLE, 400)            \
    X(CUDA_ERROR_NOT_FOUND, 500)                 \
    X(CUDA_ERROR_NOT_SUPPORTED, 801)             \
    X(CUDA_ERROR_UNKNOWN, 999)

/* Other enumerators we use, with their cuda.h values. */
#define VGPU_CU_CONSTANTS(X)                               \
    X(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 16)        \
    X(CU_MEM_LOCATION_TYPE_DEVICE, 1)                      \
    X(CU_GET_PROC_ADDRESS_DEFAULT, 0)                      \
    X(CU_GET_PROC_ADDRESS_LEGACY_STREAM, 1)                \
    X(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, 2)    \
    X(CU_GET_PROC_ADDRESS_SUCCESS, 0)                      \
    X(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, 1)             \
    X(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, 2)       \
    X(CU_AD_FORMAT_UNSIGNED_INT8, 0x01)                    \
    X(CU_AD_FORMAT_UNSIGNED_INT16, 0x02)                   \
    X(CU_AD_FORMAT_UNSIGNED_INT32, 0x03)                   \
    X(CU_AD_FORMAT_SIGNED_INT8, 0x08)                      \
    X(CU_AD_FORMAT_SIGNED_INT16, 0x09)                     \
    X(CU_AD_FORMAT_SIGNED_INT32, 0x0a)                     \
    X(CU_AD_FORMAT_HALF, 0x10)                             \
    X(CU_AD_FORMAT_FLOAT, 0x20)

#ifndef __cuda_cuda_h__

#define VGPU_CU_AS_ENUM(name, value) name = (value),
typedef enum cudaError_enum { VGPU_CU_RESULTS(VGPU_CU_AS_ENUM) } CUresult;
enum { VGPU_CU_CONSTANTS(VGPU_CU_AS_ENUM) };
#undef VGPU_CU_AS_ENUM

typedef uint64_t cuuint64_t;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUexecAffinityParam_st CUexecAffinityParam; /* only passed through */
typedef struct CUctxCreateParams_st CUctxCreateParams;     /* only passed through */
typedef int CUdevice_attribute;
typedef int CUarray_format;
typedef int CUmemAllocationType;
typedef int CUmemAllocationHandleType;
typedef int CUmemLocationType;
typedef int CUdriverProcAddressQueryResult;

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef struct CUDA_LAUNCH_PARAMS_st {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

#else /* checking against the real cuda.h */

#define VGPU_CU_ASSERT_VALUE(name, value) _Static_assert((name) == (value), #name " differs from cuda.h");
VGPU_CU_RESULTS(VGPU_CU_ASSERT_VALUE)
VGPU_CU_CONSTANTS(VGPU_CU_ASSERT_VALUE)
#undef VGPU_CU_ASSERT_VALUE

#endif

/* Layouts on x86_64: asserted in both modes, so ours and cuda.h's agree with the same numbers. */
_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation layout");
_Static_assert(offsetof(CUmemAllocationProp, location) == 8, "CUmemAllocationProp.location");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(offsetof(CUDA_ARRAY_DESCRIPTOR, NumChannels) == 20, "CUDA_ARRAY_DESCRIPTOR layout");
_Static_assert(offsetof(CUDA_ARRAY3D_DESCRIPTOR, NumChannels) == 28, "CUDA_ARRAY3D_DESCRIPTOR layout");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig layout");
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig size");
_Static_assert(offsetof(CUDA_LAUNCH_PARAMS, gridDimX) == 8, "CUDA_LAUNCH_PARAMS layout");
_Static_assert(offsetof(CUDA_LAUNCH_PARAMS, hStream) == 40, "CUDA_LAUNCH_PARAMS layout");
_Static_assert(sizeof(CUDA_LAUNCH_PARAMS) == 56, "CUDA_LAUNCH_PARAMS size");

/* Driver entry points, hooked or called. */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult cuArrayDestroy(CUarray hArray);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams);
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList, unsigned int numDevices,
                                              unsigned int flags);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);

#endif
