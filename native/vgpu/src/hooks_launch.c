/*
 * Kernel launch hooks: plain, Ex, cooperative (single and multi-device), CUDA graphs, and their _ptsz
 * forms all draw from the same SM-limit bucket. The hot path is one relaxed load of the process's launch gate: zero means no SM
 * limit is in force, the monitor is not blocking us and the sampler has already heard about a launch
 * since its last tick, so the launch goes straight to the driver.
 */
#include <stdatomic.h>

#include "config.h"
#include "driver.h"
#include "throttle.h"

/* Each hook is a pure tail call into the driver when the gate is open; everything else lives in a
 * separate cold function so the hot path needs no stack frame. */
#define LAUNCH_HOOK(name, params, args, grid)                                          \
    __attribute__((noinline, cold)) static CUresult name##_slow params {             \
        CUresult rc = vgpu_launch_slow(vgpu_grid_blocks grid);                     \
        if (rc != CUDA_SUCCESS)                                                      \
            return rc;                                                               \
        if (VGPU_UNLIKELY(!HAVE_REAL(name)))                                         \
            return CUDA_ERROR_NOT_INITIALIZED;                                       \
        return REAL(name) args;                                                      \
    }                                                                                \
    VGPU_EXPORT CUresult name params {                                               \
        if (VGPU_LIKELY(atomic_load_explicit(&vgpu_launch_gate, memory_order_relaxed) == 0) && \
            VGPU_LIKELY(HAVE_REAL(name)))                                            \
            return REAL(name) args;                                                  \
        return name##_slow args;                                                     \
    }

#define KERNEL_PARAMS                                                                           \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
     unsigned int bz, unsigned int shmem, CUstream s, void **params, void **extra)
#define KERNEL_ARGS (f, gx, gy, gz, bx, by, bz, shmem, s, params, extra)
#define COOP_PARAMS                                                                             \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, \
     unsigned int bz, unsigned int shmem, CUstream s, void **params)
#define COOP_ARGS (f, gx, gy, gz, bx, by, bz, shmem, s, params)
#define EX_PARAMS (const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
#define EX_ARGS (config, f, params, extra)
/* A NULL config is the driver's error to report; it costs nothing against the limit. */
#define EX_GRID (config ? config->gridDimX : 0, config ? config->gridDimY : 0, config ? config->gridDimZ : 0)

LAUNCH_HOOK(cuLaunchKernel, KERNEL_PARAMS, KERNEL_ARGS, (gx, gy, gz))
LAUNCH_HOOK(cuLaunchKernel_ptsz, KERNEL_PARAMS, KERNEL_ARGS, (gx, gy, gz))
LAUNCH_HOOK(cuLaunchCooperativeKernel, COOP_PARAMS, COOP_ARGS, (gx, gy, gz))
LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, COOP_PARAMS, COOP_ARGS, (gx, gy, gz))
LAUNCH_HOOK(cuLaunchKernelEx, EX_PARAMS, EX_ARGS, EX_GRID)
LAUNCH_HOOK(cuLaunchKernelEx_ptsz, EX_PARAMS, EX_ARGS, EX_GRID)

/* A graph's kernels are not visible at launch, so a graph launch costs one wave (a block per SM). The
 * limiter steers by measured utilisation per unit charged, so any consistent unit converges. */
#define GRAPH_PARAMS (CUgraphExec g, CUstream s)
#define GRAPH_ARGS (g, s)
LAUNCH_HOOK(cuGraphLaunch, GRAPH_PARAMS, GRAPH_ARGS, (vgpu_wave_blocks(), 1, 1))
LAUNCH_HOOK(cuGraphLaunch_ptsz, GRAPH_PARAMS, GRAPH_ARGS, (vgpu_wave_blocks(), 1, 1))

/* Every device's grid, charged to the calling thread's device. */
static unsigned multi_blocks(const CUDA_LAUNCH_PARAMS *list, unsigned n) {
    uint64_t sum = 0;
    for (unsigned i = 0; list && i < n; i++)
        if (__builtin_add_overflow(sum, vgpu_grid_blocks(list[i].gridDimX, list[i].gridDimY, list[i].gridDimZ), &sum))
            sum = UINT64_MAX;
    return sum > UINT32_MAX ? UINT32_MAX : (unsigned)sum;
}
#define MULTI_PARAMS (CUDA_LAUNCH_PARAMS * list, unsigned int n, unsigned int flags)
#define MULTI_ARGS (list, n, flags)
LAUNCH_HOOK(cuLaunchCooperativeKernelMultiDevice, MULTI_PARAMS, MULTI_ARGS, (multi_blocks(list, n), 1, 1))
