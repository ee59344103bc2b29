/*
 * Layer 5, throttle: the SM limit, a sampler thread steering a token bucket per device, and the launch
 * gate the launch hooks read (throttle.c). Above memory.
 */
#ifndef VGPU_THROTTLE_H
#define VGPU_THROTTLE_H

#include <stdatomic.h>
#include <stdint.h>

#include "vgpu_cuda.h"

enum {
    VGPU_GATE_UNREADY = 1u,  /* process not attached yet */
    VGPU_GATE_TICK = 2u,     /* the sampler wants to hear about the next launch */
    VGPU_GATE_THROTTLE = 4u, /* some device has an SM limit in force */
    VGPU_GATE_BLOCKED = 8u,  /* the monitor set recent_kernel < 0 */
    VGPU_GATE_SUSPENDED = 16u /* SIGUSR2 (HAMi-core's suspend); set and cleared by init.c only */
};
extern _Atomic unsigned vgpu_launch_gate;
CUresult vgpu_launch_slow(uint64_t blocks);
void vgpu_throttle_start(void);
void vgpu_throttle_attached(void);
void vgpu_throttle_forget_after_fork(void);
uint64_t vgpu_grid_blocks(unsigned x, unsigned y, unsigned z);
unsigned vgpu_wave_blocks(void); /* one block per SM of the calling thread's device */

#endif
