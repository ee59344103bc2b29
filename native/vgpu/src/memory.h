/*
 * Layer 4, memory: what the container's processes hold against the limit, summed over the shared cache's
 * slots (memory.c), and which allocation holds how much on which device (alloc_table.c). Above the shared
 * cache.
 */
#ifndef VGPU_MEMORY_H
#define VGPU_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

/* ---- memory.c ---- */
extern uint64_t vgpu_limit[VGPU_MAX_DEVICES]; /* effective limit, 0 = unlimited */
bool vgpu_mem_reserve(int dev, uint64_t bytes);
void vgpu_mem_release(int dev, uint64_t bytes);
bool vgpu_mem_reserve_context(int dev, uint64_t bytes); /* the slot's context field, same limit check */
void vgpu_mem_release_context(int dev, uint64_t bytes);
uint64_t vgpu_mem_granted(int dev); /* this process's committed bytes on dev */
uint64_t vgpu_mem_usage(int dev);
void vgpu_memory_setup(void);
void vgpu_mem_view(int dev, uint64_t phys_free, uint64_t phys_total, uint64_t *free, uint64_t *total,
                   uint64_t *used);

/* ---- alloc_table.c ---- */
enum vgpu_table_kind { VGPU_TABLE_DPTR, VGPU_TABLE_VMM, VGPU_TABLE_ARRAY, VGPU_TABLE_COUNT };
bool vgpu_table_put(enum vgpu_table_kind kind, uint64_t key, uint64_t bytes, int dev);
bool vgpu_table_take(enum vgpu_table_kind kind, uint64_t key, uint64_t *bytes, int *dev);
void vgpu_table_before_fork(void);
void vgpu_table_after_fork(bool child);

#endif
