/*
 * Layer 3, shared cache: the file every process of the container shares (shared_cache.c) and this
 * process's host PID, which its slot records (hostpid.c). Above the driver.
 *
 * The shared-cache file, byte-compatible with HAMi-core's shared_region_t version 1.2 (the offsets below
 * are asserted against the spec's table). Fields are plain integers accessed with __atomic builtins; the
 * file is shared by every process of the container and read by HAMi's vGPU monitor.
 *
 * What differs from HAMi-core in how the bytes are used (the monitor never reads these):
 *  - the lock is an OFD write lock on the byte just past the struct (file offset VGPU_LOCK_OFFSET), which
 *    the kernel drops when its holder dies; `sem` and `sem_postinit` are initialised but unused;
 *  - `sm_init_flag` (HAMi-core's guard of an unused function) is the allocation decision flag: 1 while a
 *    process decides a near-the-limit allocation under the lock, so no lock-free reservation commits
 *    meanwhile (memory.c); a flag left by a dead holder sends fast paths to the lock, where the next
 *    decision clears it;
 *  - a slot's `unused[0]` holds its process's start time (clock ticks since boot) so a recycled PID is not
 *    mistaken for the slot's owner; `seqlock` stays 0 because every counter is a single atomic word.
 */
#ifndef VGPU_SHARED_CACHE_H
#define VGPU_SHARED_CACHE_H

#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define VGPU_MAGIC 19920718
#define VGPU_MAJOR 1
#define VGPU_MINOR 2
enum { VGPU_MAX_PROCS = 1024, VGPU_UUID_LEN = 96 };

struct vgpu_device_memory {
    uint64_t context_size, module_size, data_size, offset, total;
    uint64_t unused[3];
};

struct vgpu_device_util {
    uint64_t dec_util, enc_util, sm_util;
    uint64_t unused[3];
};

struct vgpu_slot {
    int32_t pid;
    int32_t hostpid;
    struct vgpu_device_memory used[VGPU_MAX_DEVICES];
    uint64_t monitorused[VGPU_MAX_DEVICES];
    struct vgpu_device_util device_util[VGPU_MAX_DEVICES];
    int32_t status;
    uint64_t seqlock;
    uint64_t unused[2];
};

struct vgpu_region {
    int32_t initialized_flag;
    uint32_t major_version;
    uint32_t minor_version;
    int32_t sm_init_flag;
    uint64_t owner_pid;
    sem_t sem;
    uint64_t device_num;
    char uuids[VGPU_MAX_DEVICES][VGPU_UUID_LEN];
    uint64_t limit[VGPU_MAX_DEVICES];
    uint64_t sm_limit[VGPU_MAX_DEVICES];
    struct vgpu_slot procs[VGPU_MAX_PROCS];
    int32_t proc_num;
    int32_t utilization_switch;
    int32_t recent_kernel;
    int32_t priority;
    uint64_t last_kernel_time;
    sem_t sem_postinit;
};

#define VGPU_CHECK_OFFSET(type, field, off) _Static_assert(offsetof(type, field) == (off), #field)
VGPU_CHECK_OFFSET(struct vgpu_region, major_version, 4);
VGPU_CHECK_OFFSET(struct vgpu_region, sm_init_flag, 12);
VGPU_CHECK_OFFSET(struct vgpu_region, owner_pid, 16);
VGPU_CHECK_OFFSET(struct vgpu_region, sem, 24);
VGPU_CHECK_OFFSET(struct vgpu_region, device_num, 56);
VGPU_CHECK_OFFSET(struct vgpu_region, uuids, 64);
VGPU_CHECK_OFFSET(struct vgpu_region, limit, 1600);
VGPU_CHECK_OFFSET(struct vgpu_region, sm_limit, 1728);
VGPU_CHECK_OFFSET(struct vgpu_region, procs, 1856);
VGPU_CHECK_OFFSET(struct vgpu_region, proc_num, 2008896);
VGPU_CHECK_OFFSET(struct vgpu_region, utilization_switch, 2008900);
VGPU_CHECK_OFFSET(struct vgpu_region, recent_kernel, 2008904);
VGPU_CHECK_OFFSET(struct vgpu_region, priority, 2008908);
VGPU_CHECK_OFFSET(struct vgpu_region, last_kernel_time, 2008912);
VGPU_CHECK_OFFSET(struct vgpu_region, sem_postinit, 2008920);
VGPU_CHECK_OFFSET(struct vgpu_slot, used, 8);
VGPU_CHECK_OFFSET(struct vgpu_slot, monitorused, 1032);
VGPU_CHECK_OFFSET(struct vgpu_slot, device_util, 1160);
VGPU_CHECK_OFFSET(struct vgpu_slot, status, 1928);
VGPU_CHECK_OFFSET(struct vgpu_slot, seqlock, 1936);
VGPU_CHECK_OFFSET(struct vgpu_device_memory, total, 32);
VGPU_CHECK_OFFSET(struct vgpu_device_util, sm_util, 16);
_Static_assert(sizeof(struct vgpu_device_memory) == 64, "device_memory_t");
_Static_assert(sizeof(struct vgpu_device_util) == 48, "device_util_t");
_Static_assert(sizeof(struct vgpu_slot) == 1960, "shrreg_proc_slot_t");
_Static_assert(sizeof(struct vgpu_region) == 2008952, "shared_region_t");

/* The lock byte: the file is sizeof+1 long (as HAMi-core writes it) and this is that last byte. */
#define VGPU_LOCK_OFFSET ((off_t)sizeof(struct vgpu_region))

#define VGPU_LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define VGPU_LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define VGPU_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* ---- shared_cache.c ---- */
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
/* Where this process stands: written by init.c only (attach, fork, the suspend and resume signals), read
 * on the way into the layers above. */
enum { VGPU_DETACHED = 0, VGPU_RUNNING = 1, VGPU_SUSPENDED = 2 }; /* SIGUSR2 suspends, SIGUSR1 resumes */
extern atomic_int vgpu_attached;

/* ---- hostpid.c ---- */
enum { VGPU_LOOK_AT_INIT = 1u, VGPU_LOOK_AT_LAUNCH = 2u }; /* the one-shot looks for the host PID */
int32_t vgpu_host_pid(void);              /* the PID NVML lists this process under; 0 until known */
void vgpu_host_pid_found(int32_t pid);    /* records it (the first finding stands) in the slot too */
void vgpu_host_pid_look(void);            /* one NVML listing: our own PID in it is ours */
void vgpu_host_pid_look_once(unsigned stage); /* the listing, once per stage and process, if unknown */
void vgpu_host_pid_before_fork(void);
void vgpu_host_pid_after_fork(bool child);

#endif
