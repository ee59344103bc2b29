/*
 * Layer 6, hooks: the driver functions libvgpu exports, declared by the driver API headers (include/):
 * initialisation, allocation and memory information (hooks_cuda.c), contexts (context.c), launches
 * (hooks_launch.c), NVML memory information (hooks_nvml.c). Above throttle; only init.c is above them.
 * This header holds what the hooks share.
 */
#ifndef VGPU_HOOKS_H
#define VGPU_HOOKS_H

#include <stdatomic.h>

#include "config.h"
#include "driver.h"
#include "shared_cache.h"

/* Atop every hook: one acquire load once the process is attached and running. */
static inline void vgpu_ready(void) {
    if (VGPU_UNLIKELY(atomic_load_explicit(&vgpu_attached, memory_order_acquire) != VGPU_RUNNING))
        vgpu_ensure_attached();
}

#endif
