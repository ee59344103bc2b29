/*
 * Memory accounting against the container-wide limit, without a lock on the fast path.
 *
 * A reservation first publishes the bytes in this process's slot (a seq_cst atomic add) and then sums
 * every slot. Of two processes racing for the last bytes, the later of the two sums always sees both
 * reservations, so usage can never pass the limit (HAMi-core checks then adds, and both can pass). A
 * failed fast path withdraws, reclaims the slots of dead processes and tries once more under the lock;
 * only then is it an out-of-memory error. The sum is O(live slots) of plain loads: no syscall, no lock.
 */
#include "shared_cache.h"

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

static void publish(struct vgpu_slot *s, int dev, uint64_t bytes) {
    __atomic_fetch_add(&s->used[dev].total, bytes, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&s->used[dev].data_size, bytes, __ATOMIC_RELAXED);
}

static void withdraw(struct vgpu_slot *s, int dev, uint64_t bytes) {
    __atomic_fetch_sub(&s->used[dev].data_size, bytes, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&s->used[dev].total, bytes, __ATOMIC_SEQ_CST);
}

static bool reserve_slow(struct vgpu_slot *s, int dev, uint64_t bytes, uint64_t limit) {
    vgpu_cache_lock();
    vgpu_cache_reclaim_dead_locked();
    publish(s, dev, bytes);
    uint64_t usage = vgpu_mem_usage(dev);
    bool ok = usage <= limit;
    if (!ok)
        withdraw(s, dev, bytes);
    vgpu_cache_unlock();
    if (!ok)
        vgpu_log(VGPU_LOG_ERROR, "Device %d OOM: %llu bytes requested, %llu in use, limit %llu", dev,
                 (unsigned long long)bytes, (unsigned long long)(usage - bytes), (unsigned long long)limit);
    return ok;
}

bool vgpu_mem_reserve(int dev, uint64_t bytes) {
    struct vgpu_slot *s = my_slot();
    if (!s || dev < 0 || dev >= VGPU_MAX_DEVICES)
        return true; /* not accounted: device beyond the file's 16 or no slot */
    uint64_t limit = vgpu_limit[dev];
    publish(s, dev, bytes);
    if (limit == 0 || VGPU_LIKELY(vgpu_mem_usage(dev) <= limit))
        return true;
    withdraw(s, dev, bytes);
    return reserve_slow(s, dev, bytes, limit);
}

void vgpu_mem_release(int dev, uint64_t bytes) {
    struct vgpu_slot *s = my_slot();
    if (s && dev >= 0 && dev < VGPU_MAX_DEVICES)
        withdraw(s, dev, bytes);
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
