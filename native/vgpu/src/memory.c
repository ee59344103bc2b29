/*
 * Memory accounting against the container-wide limit, without a lock on the fast path.
 *
 * A slot's used[d].total holds what its process has been granted plus any reservation it is still
 * deciding on; context_size + module_size + data_size is what it has been granted (committed). A fast
 * reservation adds to total (a seq_cst atomic add), checks the region's decision flag, sums every slot's
 * total and, if that fits, commits (adds to data_size). Of two processes racing for the last bytes, the
 * later of the two sums always sees both reservations, so usage can never pass the limit (HAMi-core
 * checks then adds, and both can pass).
 *
 * A fast path never refuses: when its sum does not fit it withdraws and asks again under the file lock.
 * There the decision flag is raised first, so no new fast reservation can commit; the ones already in
 * flight are waited out (a handful of instructions each); and only then are the committed bytes summed.
 * A refusal is therefore decided on memory other processes really hold, never on another request's
 * passing reservation: a request that can never fit cannot make one that fits fail. The fast sum is
 * O(live slots) of plain loads: no syscall, no lock.
 *
 * Invariant: every slot's total >= its committed bytes (a reservation adds to total before data_size, a
 * release takes from data_size before total), and they are equal when nothing is in flight.
 *
 * Contexts (context.c) go through the same reservation, committed to context_size instead of data_size:
 * the monitor's context field, and part of the usage every limit check sums.
 */
#include <sched.h>
#include <time.h>

#include "config.h"
#include "shared_cache.h"
#include "memory.h"

uint64_t vgpu_limit[VGPU_MAX_DEVICES];

static struct vgpu_slot *my_slot(void) { return atomic_load_explicit(&vgpu_my_slot, memory_order_acquire); }

static uint64_t min_limit(uint64_t a, uint64_t b) {
    if (a == 0)
        return b;
    if (b == 0)
        return a;
    return a < b ? a : b;
}

/* The stricter of this process's limit and the one the region's creator recorded, so a process started
 * with a looser environment cannot exceed what the container was given. */
void vgpu_memory_setup(void) {
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        uint64_t mine = vgpu_config.mem_limit[d];
        uint64_t file = vgpu_region ? VGPU_LOAD(&vgpu_region->limit[d]) : 0;
        if (mine != file)
            vgpu_log(VGPU_LOG_WARN, "device %d: limit %llu differs from the shared cache's %llu; enforcing the "
                     "stricter", d, (unsigned long long)mine, (unsigned long long)file);
        vgpu_limit[d] = min_limit(mine, file);
    }
}

uint64_t vgpu_mem_usage(int dev) {
    if (!vgpu_region || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return 0;
    int32_t n = VGPU_LOAD(&vgpu_region->proc_num);
    uint64_t sum = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t v = __atomic_load_n(&vgpu_region->procs[i].used[dev].total, __ATOMIC_SEQ_CST);
        if (__builtin_add_overflow(sum, v, &sum))
            return UINT64_MAX;
    }
    return sum;
}

static uint64_t committed(const struct vgpu_device_memory *m) {
    return __atomic_load_n(&m->context_size, __ATOMIC_SEQ_CST) + __atomic_load_n(&m->module_size, __ATOMIC_SEQ_CST) +
           __atomic_load_n(&m->data_size, __ATOMIC_SEQ_CST);
}

/* The committed bucket a charge lands in: allocations in data_size, contexts in context_size. */
static uint64_t *bucket(struct vgpu_device_memory *m, bool context) {
    return context ? &m->context_size : &m->data_size;
}

static void withdraw(struct vgpu_slot *s, int dev, uint64_t bytes, bool context) {
    __atomic_fetch_sub(bucket(&s->used[dev], context), bytes, __ATOMIC_SEQ_CST);
    __atomic_fetch_sub(&s->used[dev].total, bytes, __ATOMIC_SEQ_CST);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A process stopped (SIGSTOP, a debugger) between reserving and committing must not wedge every
 * allocation of the container: past this, its in-flight bytes are counted as held (never over the
 * limit, at worst one refusal too many while it stays stopped). */
static const double SETTLE_MS = 50;

/* Caller holds the lock and has raised the decision flag. The bytes the container's processes hold on
 * dev once every reservation that was in flight before the flag has committed or withdrawn. */
static uint64_t settled_usage(int dev) {
    int32_t n = VGPU_LOAD(&vgpu_region->proc_num);
    uint64_t sum = 0;
    double deadline = 0;
    for (int32_t i = 0; i < n; i++) {
        const struct vgpu_device_memory *m = &vgpu_region->procs[i].used[dev];
        uint64_t held;
        for (unsigned spins = 0;; spins++) {
            /* total first: anything committed after this read was already in it (see the invariant) */
            uint64_t total = __atomic_load_n(&m->total, __ATOMIC_SEQ_CST);
            held = committed(m);
            if (held == total)
                break;
            if (deadline == 0)
                deadline = now_ms() + SETTLE_MS;
            else if (now_ms() > deadline) {
                held = total > held ? total : held;
                break;
            }
            if (spins > 64)
                sched_yield(); /* the owner may be descheduled mid-reservation */
        }
        if (__builtin_add_overflow(sum, held, &sum))
            return UINT64_MAX;
    }
    return sum;
}

static bool reserve_slow(struct vgpu_slot *s, int dev, uint64_t bytes, uint64_t limit, bool context) {
    vgpu_cache_lock();
    vgpu_cache_reclaim_dead_locked();
    /* The decision flag (HAMi's unused sm_init_flag): from here no fast reservation commits. */
    __atomic_store_n(&vgpu_region->sm_init_flag, 1, __ATOMIC_SEQ_CST);
    uint64_t usage = settled_usage(dev), after;
    bool ok = !__builtin_add_overflow(usage, bytes, &after) && after <= limit;
    if (ok) {
        __atomic_fetch_add(&s->used[dev].total, bytes, __ATOMIC_SEQ_CST);
        __atomic_fetch_add(bucket(&s->used[dev], context), bytes, __ATOMIC_SEQ_CST);
    }
    __atomic_store_n(&vgpu_region->sm_init_flag, 0, __ATOMIC_SEQ_CST);
    vgpu_cache_unlock();
    if (!ok)
        vgpu_log(VGPU_LOG_ERROR, "Device %d OOM: %llu bytes requested, %llu in use, limit %llu", dev,
                 (unsigned long long)bytes, (unsigned long long)usage, (unsigned long long)limit);
    return ok;
}

static bool reserve(int dev, uint64_t bytes, bool context) {
    struct vgpu_slot *s = my_slot();
    if (!s || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return true; /* not accounted: device beyond the file's 16 or no slot */
    uint64_t limit = vgpu_limit[dev];
    struct vgpu_device_memory *m = &s->used[dev];
    __atomic_fetch_add(&m->total, bytes, __ATOMIC_SEQ_CST); /* reserve */
    if (limit == 0 || VGPU_LIKELY(__atomic_load_n(&vgpu_region->sm_init_flag, __ATOMIC_SEQ_CST) == 0 &&
                                  vgpu_mem_usage(dev) <= limit)) {
        __atomic_fetch_add(bucket(m, context), bytes, __ATOMIC_SEQ_CST); /* commit */
        return true;
    }
    __atomic_fetch_sub(&m->total, bytes, __ATOMIC_SEQ_CST);
    return reserve_slow(s, dev, bytes, limit, context);
}

static void release(int dev, uint64_t bytes, bool context) {
    struct vgpu_slot *s = my_slot();
    if (s && dev >= 0 && dev < VGPU_MAX_DEVICES)
        withdraw(s, dev, bytes, context);
}

bool vgpu_mem_reserve(int dev, uint64_t bytes) { return reserve(dev, bytes, false); }
void vgpu_mem_release(int dev, uint64_t bytes) { release(dev, bytes, false); }
bool vgpu_mem_reserve_context(int dev, uint64_t bytes) { return reserve(dev, bytes, true); }
void vgpu_mem_release_context(int dev, uint64_t bytes) { release(dev, bytes, true); }

/* What this process has been granted on dev (allocations and contexts): what the driver should be
 * holding for it, less what the interposer does not see. */
uint64_t vgpu_mem_granted(int dev) {
    struct vgpu_slot *s = my_slot();
    if (!s || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return 0;
    return committed(&s->used[dev]);
}

/* What an application is shown: the slice, with free clamped at 0 (never a wrapped huge number) and
 * never more than the device really has free. Without a limit, the driver's numbers pass unchanged. */
void vgpu_mem_view(int dev, uint64_t phys_free, uint64_t phys_total, uint64_t *free, uint64_t *total,
                   uint64_t *used) {
    uint64_t limit = (dev >= 0 && dev < VGPU_MAX_DEVICES) ? vgpu_limit[dev] : 0;
    if (limit == 0) {
        *free = phys_free;
        *total = phys_total;
        *used = phys_total - (phys_free < phys_total ? phys_free : phys_total);
        return;
    }
    uint64_t usage = vgpu_mem_usage(dev);
    *total = limit < phys_total ? limit : phys_total;
    *used = usage;
    uint64_t left = usage < *total ? *total - usage : 0;
    *free = left < phys_free ? left : phys_free;
}
