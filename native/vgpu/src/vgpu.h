/*
 * libvgpu internals: the one list of hooked and called driver functions, the table of real entry points
 * and the small API each file offers the others. Every non-static symbol starts with vgpu_.
 */
#ifndef VGPU_INTERNAL_H
#define VGPU_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "vgpu_cuda.h"
#include "vgpu_nvml.h"

#include "hook_list.h"

#define VGPU_AS_ENUM(n) VGPU_FN_##n,
enum vgpu_fn_id {
    VGPU_CUDA_HOOKS(VGPU_AS_ENUM) VGPU_NVML_HOOKS(VGPU_AS_ENUM) VGPU_HOOK_COUNT,
    VGPU_AFTER_HOOKS_ = VGPU_HOOK_COUNT - 1, /* calls continue the numbering after the hooks */
    VGPU_CUDA_CALLS(VGPU_AS_ENUM) VGPU_NVML_CALLS(VGPU_AS_ENUM) VGPU_FN_COUNT
};
#undef VGPU_AS_ENUM

/* Real entry points, written once by the init path and read-only afterwards. */
extern void *vgpu_real[VGPU_FN_COUNT];
extern const char *const vgpu_fn_name[VGPU_FN_COUNT];
extern void *const vgpu_hook_fn[VGPU_HOOK_COUNT];

#define REAL(n) ((__typeof__(&n))vgpu_real[VGPU_FN_##n])
#define HAVE_REAL(n) (vgpu_real[VGPU_FN_##n] != NULL)
#define VGPU_EXPORT __attribute__((visibility("default")))
#define VGPU_LIKELY(x) __builtin_expect(!!(x), 1)
#define VGPU_UNLIKELY(x) __builtin_expect(!!(x), 0)

enum { VGPU_MAX_DEVICES = 16 };

/* ---- log.c ---- */
enum { VGPU_LOG_ERROR = 0, VGPU_LOG_WARN = 2, VGPU_LOG_INFO = 3, VGPU_LOG_DEBUG = 4 };
extern int vgpu_log_level;
void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- limits.c ---- */
enum vgpu_policy { VGPU_POLICY_DEFAULT = 0, VGPU_POLICY_FORCE = 1, VGPU_POLICY_DISABLE = 2 };
/* VGPU_CONTEXT_MEMORY: charge what the driver holds for each context (HAMi-core, the default) or not. */
enum vgpu_context_memory { VGPU_CONTEXT_CHARGE = 0, VGPU_CONTEXT_IGNORE = 1 };
struct vgpu_config {
    uint64_t mem_limit[VGPU_MAX_DEVICES]; /* bytes, 0 = unlimited */
    uint64_t sm_limit[VGPU_MAX_DEVICES];  /* percent 1..100, 100 = no throttling */
    int priority;
    enum vgpu_policy policy;
    enum vgpu_context_memory context_memory;
    char cache_path[512];
};
extern struct vgpu_config vgpu_config;
void vgpu_config_load(struct vgpu_config *cfg);
bool vgpu_parse_size(const char *text, uint64_t *out);

/* ---- init.c ---- */
void vgpu_ensure_init(void);       /* real table + config, once per process */
void vgpu_ensure_attached(void);   /* + shared cache slot, once per process (again after fork); waits
                                      while the process is suspended */
extern int vgpu_device_count;      /* from cuDeviceGetCount; 0 = unknown */
void vgpu_refresh_device_count(void);
enum { VGPU_DETACHED = 0, VGPU_RUNNING = 1, VGPU_SUSPENDED = 2 }; /* SIGUSR2 suspends, SIGUSR1 resumes */
extern atomic_int vgpu_attached;
/* Atop every hook: one acquire load once the process is attached and running. */
static inline void vgpu_ready(void) {
    if (VGPU_UNLIKELY(atomic_load_explicit(&vgpu_attached, memory_order_acquire) != VGPU_RUNNING))
        vgpu_ensure_attached();
}
int vgpu_current_device(void);     /* CUDA ordinal of the calling thread's context, -1 if none */
void *vgpu_real_dlsym(void *handle, const char *name);

/* ---- shared_cache.c ---- */
struct vgpu_region;
struct vgpu_slot;
extern struct vgpu_region *vgpu_region;
extern _Atomic(struct vgpu_slot *) vgpu_my_slot;
void vgpu_cache_attach(void);
void vgpu_cache_detach(void);
void vgpu_cache_record_devices(int count);
void vgpu_cache_before_fork(void);
void vgpu_cache_after_fork_parent(void);
void vgpu_cache_after_fork_child(void);
int vgpu_cache_reclaim_dead_locked(void); /* caller holds the lock; returns slots freed */
void vgpu_cache_raise_kernel_time(uint64_t now);
void vgpu_cache_mark_started(void);
void vgpu_cache_set_status(int32_t status); /* this process's slot; async-signal-safe */
void vgpu_cache_lock(void);
void vgpu_cache_unlock(void);

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

/* ---- hooks_nvml.c ---- */
int vgpu_nvml_index(int cuda_dev);      /* -1 when not visible */
int vgpu_cuda_ordinal(unsigned nvml_index);

/* ---- hostpid.c ---- */
enum { VGPU_LOOK_AT_INIT = 1u, VGPU_LOOK_AT_LAUNCH = 2u }; /* the one-shot looks for the host PID */
int32_t vgpu_host_pid(void);              /* the PID NVML lists this process under; 0 until known */
void vgpu_host_pid_found(int32_t pid);    /* records it (the first finding stands) in the slot too */
void vgpu_host_pid_look(void);            /* one NVML listing: our own PID in it is ours */
void vgpu_host_pid_look_once(unsigned stage); /* the listing, once per stage and process, if unknown */
void vgpu_host_pid_before_fork(void);
void vgpu_host_pid_after_fork(bool child);

/* ---- throttle.c ---- */
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
