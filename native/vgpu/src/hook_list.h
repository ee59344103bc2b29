/* The hook lists alone, so the linker version script can be generated from them with cpp. */
#ifndef VGPU_HOOK_LIST_H
#define VGPU_HOOK_LIST_H

/* Driver functions that libvgpu exports a wrapper for. The only list: the enum, the name table, the
 * dlsym/cuGetProcAddress lookup and the linker version script are all generated from it. */
#define VGPU_CUDA_HOOKS(X)                                                                         \
    X(cuInit) X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuMemGetInfo_v2) X(cuDeviceTotalMem_v2)   \
    X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocPitch_v2) X(cuMemAllocManaged)                     \
    X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync)                           \
    X(cuMemAllocFromPoolAsync_ptsz) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz) X(cuMemCreate)         \
    X(cuMemRelease) X(cuArrayCreate_v2) X(cuArray3DCreate_v2) X(cuArrayDestroy)                     \
    X(cuMipmappedArrayCreate) X(cuMipmappedArrayDestroy) X(cuLaunchKernel) X(cuLaunchKernel_ptsz)   \
    X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) X(cuLaunchCooperativeKernel)                       \
    X(cuLaunchCooperativeKernel_ptsz) X(cuLaunchCooperativeKernelMultiDevice) X(cuGraphLaunch)            \
    X(cuGraphLaunch_ptsz) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuCtxCreate_v2)  \
    X(cuCtxCreate_v3) X(cuCtxCreate_v4) X(cuCtxDestroy_v2)

#define VGPU_NVML_HOOKS(X) X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetMemoryInfo_v2)

/* Driver functions libvgpu only calls. */
#define VGPU_CUDA_CALLS(X) X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuCtxGetDevice) X(cuDeviceGetUuid_v2)
#define VGPU_NVML_CALLS(X)                                                                          \
    X(nvmlInit_v2) X(nvmlDeviceGetCount_v2) X(nvmlDeviceGetHandleByIndex_v2) X(nvmlDeviceGetIndex)  \
    X(nvmlDeviceGetUUID) X(nvmlDeviceGetComputeRunningProcesses) X(nvmlDeviceGetProcessUtilization) \
    X(nvmlDeviceGetUtilizationRates)

#endif
