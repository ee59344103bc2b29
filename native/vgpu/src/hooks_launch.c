/*
 * Kernel launch hooks. The hot path is one relaxed load of the process's launch gate: zero means no SM
 * limit is in force, the monitor is not blocking us and the sampler has already heard about a launch
 * since its last tick, so the launch goes straight to the driver.
 */
#include "vgpu.h"

static inline CUresult gate(unsigned gx, unsigned gy, unsigned gz) {
    if (VGPU_UNLIKELY(atomic_load_explicit(&vgpu_launch_gate, memory_order_relaxed) != 0))
        return vgpu_launch_slow(vgpu_grid_blocks(gx, gy, gz));
    return CUDA_SUCCESS;
}

#define LAUNCH(name, gx, gy, gz, ...)                               \
    CUresult rc = gate((gx), (gy), (gz));                           \
    if (rc != CUDA_SUCCESS)                                         \
        return rc;                                                  \
    if (VGPU_UNLIKELY(!HAVE_REAL(name)))                            \
        return CUDA_ERROR_NOT_INITIALIZED;                          \
    return REAL(name)(__VA_ARGS__)

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                    unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                    CUstream s, void **params, void **extra) {
    LAUNCH(cuLaunchKernel, gx, gy, gz, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                         unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                         CUstream s, void **params, void **extra) {
    LAUNCH(cuLaunchKernel_ptsz, gx, gy, gz, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                               unsigned int bx, unsigned int by, unsigned int bz,
                                               unsigned int shmem, CUstream s, void **params) {
    LAUNCH(cuLaunchCooperativeKernel, gx, gy, gz, f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                                    unsigned int gz, unsigned int bx, unsigned int by,
                                                    unsigned int bz, unsigned int shmem, CUstream s,
                                                    void **params) {
    LAUNCH(cuLaunchCooperativeKernel_ptsz, gx, gy, gz, f, gx, gy, gz, bx, by, bz, shmem, s, params);
}

/* A NULL config is the driver's error to report; it costs nothing against the limit. */
VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    LAUNCH(cuLaunchKernelEx, config ? config->gridDimX : 0, config ? config->gridDimY : 0,
           config ? config->gridDimZ : 0, config, f, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
                                           void **extra) {
    LAUNCH(cuLaunchKernelEx_ptsz, config ? config->gridDimX : 0, config ? config->gridDimY : 0,
           config ? config->gridDimZ : 0, config, f, params, extra);
}
