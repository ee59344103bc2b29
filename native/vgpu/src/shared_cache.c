/*
 * Creating, attaching to and locking the shared-cache file, and owning a process slot in it.
 *
 * Lock: an OFD write lock on the byte just past the struct. The kernel releases it when the holder's
 * last descriptor goes away, including on kill -9, so there is no owner to detect and no timeout to
 * tune. It is taken to create the region, to reclaim dead slots and on the allocation slow path (a limit
 * is near); a process-local mutex serialises the threads of one process around it.
 *
 * A normal start takes no lock at all: an initialised file is mapped as it is, and a free slot is taken
 * with one compare-and-swap on its pid. When 64 processes start together, handing a lock from one to the
 * next costs a wake-up of every waiter at each release (the kernel has no queue for record locks), which
 * made a crowded start take tens of milliseconds. Processes that find the file being created wait for
 * its creator with a read lock, which all of them get at once when the creator lets go.
 *
 * Slots never move while their process lives (HAMi-core compacts by copying the last slot into the
 * hole, which races with the owner's lock-free updates). A released slot is zeroed and then marked free
 * (pid 0, status 0); proc_num shrinks only over free slots at the tail. A lock holder that retires or
 * frees a slot first swaps its pid to PID_BUSY, so no lock-free claim can take the slot meanwhile.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "driver.h"
#include "shared_cache.h"

struct vgpu_region *vgpu_region;
_Atomic(struct vgpu_slot *) vgpu_my_slot;
atomic_int vgpu_attached;

static int cache_fd = -1;
static bool file_backed;
static pthread_mutex_t lock_mu = PTHREAD_MUTEX_INITIALIZER;
static const int RECLAIM_PER_ATTACH = 4; /* keeps attach O(1) in dead-slot checks */
/* The pid of a slot a lock holder is freeing or dropping from the tail. Seen under the lock, it was left
 * by a holder that died mid-way (only holders write it). The monitor skips it: its status is 0. */
enum { PID_BUSY = -1 };

static void lock_file(int fd, short type) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = VGPU_LOCK_OFFSET, .l_len = 1};
    while (fcntl(fd, F_OFD_SETLKW, &fl) == -1) {
        if (errno != EINTR) { /* cannot happen on a regular file we opened O_RDWR; never hang or exit */
            vgpu_log(VGPU_LOG_ERROR, "cannot lock the shared cache: %s", strerror(errno));
            break;
        }
    }
}

static void unlock_file(int fd) {
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = VGPU_LOCK_OFFSET, .l_len = 1};
    (void)fcntl(fd, F_OFD_SETLK, &fl);
}

static bool try_lock_file(int fd) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = VGPU_LOCK_OFFSET, .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

/* Returns once no process holds the lock, without keeping it: every process waiting here resumes at the
 * same release. The caller holds lock_mu: a read lock asked through an open file description that holds
 * the write lock would convert that lock, not wait for it. */
static void wait_for_holder(int fd) {
    lock_file(fd, F_RDLCK);
    unlock_file(fd);
}

void vgpu_cache_lock(void) {
    pthread_mutex_lock(&lock_mu);
    if (cache_fd < 0)
        return;
    lock_file(cache_fd, F_WRLCK);
    VGPU_STORE(&vgpu_region->owner_pid, (uint64_t)getpid());
}

/* vgpu_cache_lock() if nobody holds the lock now; false, holding nothing, otherwise. */
static bool cache_try_lock(void) {
    if (pthread_mutex_trylock(&lock_mu) != 0)
        return false;
    if (cache_fd >= 0 && !try_lock_file(cache_fd)) {
        pthread_mutex_unlock(&lock_mu);
        return false;
    }
    if (cache_fd >= 0)
        VGPU_STORE(&vgpu_region->owner_pid, (uint64_t)getpid());
    return true;
}

void vgpu_cache_unlock(void) {
    if (cache_fd >= 0) {
        VGPU_STORE(&vgpu_region->owner_pid, 0);
        unlock_file(cache_fd);
    }
    pthread_mutex_unlock(&lock_mu);
}

/* Start time (field 22 of /proc/<pid>/stat) and state; 0 / '\0' when unreadable. */
static uint64_t proc_start_time(pid_t pid, char *state) {
    char path[64], buf[1024];
    *state = '\0';
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may contain spaces and parentheses */
    if (!p || p[1] != ' ')
        return 0;
    *state = p[2];
    p += 2;
    for (int field = 3; field < 22 && p; field++) { /* p points at field 3 (state) */
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    return p ? strtoull(p, NULL, 10) : 0;
}

/* `thorough` also reads /proc (tens of microseconds) to catch zombies and recycled PIDs; without it only
 * a PID that no longer exists counts as dead. */
static bool slot_owner_alive(const struct vgpu_slot *s, bool thorough) {
    pid_t pid = VGPU_LOAD(&s->pid);
    if (kill(pid, 0) == -1 && errno == ESRCH)
        return false;
    if (!thorough)
        return true;
    char state;
    uint64_t start = proc_start_time(pid, &state);
    if (state == 'Z' || state == 'X' || state == 'x')
        return false;
    uint64_t recorded = VGPU_LOAD(&s->unused[0]);
    return !(recorded && start && recorded != start); /* a recycled PID is a different process */
}

static void zero_slot_counters(struct vgpu_slot *s) {
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        struct vgpu_device_memory *m = &s->used[d];
        VGPU_STORE(&m->context_size, 0);
        VGPU_STORE(&m->module_size, 0);
        VGPU_STORE(&m->data_size, 0);
        VGPU_STORE(&m->offset, 0);
        VGPU_STORE(&m->total, 0);
        VGPU_STORE(&s->monitorused[d], 0);
        VGPU_STORE(&s->device_util[d].sm_util, 0);
    }
}

static void free_slot(struct vgpu_slot *s) {
    zero_slot_counters(s);
    VGPU_STORE(&s->hostpid, 0);
    VGPU_STORE(&s->status, 0);
    VGPU_STORE(&s->unused[0], 0);
    VGPU_STORE(&s->pid, 0); /* last: a free slot must already read as empty */
}

/* Caller holds the lock. The tail slot is made unclaimable (PID_BUSY) before proc_num drops past it, and
 * proc_num only drops if no claim raised it meanwhile: a claimed slot never ends up beyond proc_num,
 * where the usage sums would miss it. */
static void shrink_tail(struct vgpu_region *r) {
    for (;;) {
        int32_t n = VGPU_LOAD(&r->proc_num), free_pid = 0;
        if (n <= 0 || !__atomic_compare_exchange_n(&r->procs[n - 1].pid, &free_pid, PID_BUSY, false,
                                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
            return;
        bool dropped = __atomic_compare_exchange_n(&r->proc_num, &n, n - 1, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST);
        __atomic_store_n(&r->procs[n - 1].pid, 0, __ATOMIC_SEQ_CST);
        if (!dropped)
            return;
    }
}

/* Caller holds the lock. Checks at most `budget` occupied slots, starting at `first`. */
static int reclaim_dead(struct vgpu_region *r, int first, int budget, bool thorough) {
    int32_t n = VGPU_LOAD(&r->proc_num);
    pid_t me = getpid();
    int freed = 0;
    for (int k = 0; k < n && budget > 0; k++) {
        struct vgpu_slot *s = &r->procs[(first + k) % n];
        pid_t pid = VGPU_LOAD(&s->pid);
        if (pid == 0 || pid == me)
            continue;
        if (pid == PID_BUSY) { /* a holder died while freeing it */
            free_slot(s);
            freed++;
            continue;
        }
        budget--;
        /* Swapped to PID_BUSY first: if the owner released it and a new process claimed it since we read
         * the pid, the swap fails and the new owner's slot is left alone. */
        if (!slot_owner_alive(s, thorough) && __atomic_compare_exchange_n(&s->pid, &pid, PID_BUSY, false,
                                                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            vgpu_log(VGPU_LOG_INFO, "reclaiming the slot of dead process %d", (int)pid);
            free_slot(s);
            freed++;
        }
    }
    shrink_tail(r);
    return freed;
}

int vgpu_cache_reclaim_dead_locked(void) { return reclaim_dead(vgpu_region, 0, VGPU_MAX_PROCS, true); }

static void set_up_slot(struct vgpu_slot *s, uint64_t start) {
    zero_slot_counters(s);
    VGPU_STORE(&s->unused[0], start);
    VGPU_STORE(&s->hostpid, 0);
    VGPU_STORE(&s->seqlock, 0);
    VGPU_STORE(&s->status, 1);
}

/* Claimed slots lie below proc_num before their process can allocate; racing claims only raise it. */
static void raise_proc_num(struct vgpu_region *r, int32_t want) {
    int32_t n = VGPU_LOAD(&r->proc_num);
    while (n < want &&
           !__atomic_compare_exchange_n(&r->proc_num, &n, want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
}

static bool holds_pid(const struct vgpu_region *r, pid_t pid) {
    int32_t n = VGPU_LOAD(&r->proc_num);
    for (int i = 0; i < n; i++)
        if (VGPU_LOAD_RELAXED(&r->procs[i].pid) == pid)
            return true;
    return false;
}

/* Takes the lowest free slot with a compare-and-swap of its pid from 0: no lock. NULL when all are in use. */
static struct vgpu_slot *claim_free(struct vgpu_region *r, pid_t me, uint64_t start) {
    for (int i = 0; i < VGPU_MAX_PROCS; i++) {
        int32_t free_pid = 0;
        if (VGPU_LOAD_RELAXED(&r->procs[i].pid) != 0 ||
            !__atomic_compare_exchange_n(&r->procs[i].pid, &free_pid, me, false, __ATOMIC_SEQ_CST,
                                         __ATOMIC_RELAXED))
            continue;
        struct vgpu_slot *s = &r->procs[i];
        set_up_slot(s, start);
        raise_proc_num(r, i + 1);
        return s;
    }
    return NULL;
}

/* Caller holds the lock. A slot already carrying our PID is a leftover of an earlier process with the
 * same PID (we have none yet), so it is reused: nobody else claims or frees it while we hold the lock. */
static struct vgpu_slot *claim_slot(struct vgpu_region *r, pid_t me, uint64_t start) {
    int32_t n = VGPU_LOAD(&r->proc_num);
    if (n > 0)
        reclaim_dead(r, (int)(me % n), RECLAIM_PER_ATTACH, true);
    n = VGPU_LOAD(&r->proc_num);
    for (int i = 0; i < n; i++) {
        struct vgpu_slot *s = &r->procs[i];
        if (VGPU_LOAD(&s->pid) == me) {
            set_up_slot(s, start);
            return s;
        }
    }
    struct vgpu_slot *s = claim_free(r, me, start);
    if (!s && reclaim_dead(r, 0, VGPU_MAX_PROCS, true) > 0)
        s = claim_free(r, me, start);
    return s;
}

static void init_region(struct vgpu_region *r, bool dirty) {
    if (dirty) /* a creator died half-way: start over; a fresh file is already all zeros */
        memset(r, 0, sizeof *r);
    r->major_version = VGPU_MAJOR;
    r->minor_version = VGPU_MINOR;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        r->limit[i] = vgpu_config.mem_limit[i];
        r->sm_limit[i] = vgpu_config.sm_limit[i];
    }
    /* Unused by libvgpu (see shared_cache.h) but initialised so HAMi-core tools find valid semaphores. */
    sem_init(&r->sem, 1, 1);
    sem_init(&r->sem_postinit, 1, 1);
    r->utilization_switch = 1;
    r->recent_kernel = 2;
    r->priority = vgpu_config.priority;
    r->proc_num = 0;
    __atomic_store_n(&r->initialized_flag, VGPU_MAGIC, __ATOMIC_RELEASE); /* written last */
}

static struct vgpu_region *private_region(const char *why) {
    vgpu_log(VGPU_LOG_ERROR, "shared cache %s unusable (%s); limits apply to this process alone",
             vgpu_config.cache_path, why);
    struct vgpu_region *r = calloc(1, sizeof *r);
    if (r)
        init_region(r, false);
    return r;
}

/* A process touches a few pages of the 2 MB file, never all of it. Without MADV_RANDOM the first fault
 * on a fresh (sparse) file reads ahead the whole file - here that is the disk's 8 MB read-ahead, about a
 * millisecond of zero-filling - and everyone else waits for the creator meanwhile. */
static void *map_region(int fd) {
    void *p = mmap(NULL, sizeof(struct vgpu_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return NULL;
    (void)madvise(p, sizeof(struct vgpu_region), MADV_RANDOM);
    return p;
}

/* Caller holds the lock. Returns NULL when the file cannot be used. */
static struct vgpu_region *map_locked(int fd, const char **why) {
    struct stat st;
    const off_t want = (off_t)sizeof(struct vgpu_region) + 1;
    if (fstat(fd, &st) != 0) {
        *why = strerror(errno);
        return NULL;
    }
    if (st.st_size < want && ftruncate(fd, want) != 0) {
        *why = strerror(errno);
        return NULL;
    }
    void *p = map_region(fd);
    if (!p) {
        *why = strerror(errno);
        return NULL;
    }
    struct vgpu_region *r = p;
    if (__atomic_load_n(&r->initialized_flag, __ATOMIC_ACQUIRE) != VGPU_MAGIC) {
        init_region(r, st.st_size != 0);
    } else if (r->major_version != VGPU_MAJOR || st.st_size < want) {
        *why = "incompatible layout version";
        munmap(p, sizeof(struct vgpu_region));
        return NULL;
    } else if (r->minor_version != VGPU_MINOR) {
        vgpu_log(VGPU_LOG_INFO, "shared cache is version %u.%u; using it as %d.%d (same layout)",
                 r->major_version, r->minor_version, VGPU_MAJOR, VGPU_MINOR);
    }
    return r;
}

/* The region of a file already initialised in this layout and version, mapped without the lock: its
 * creator stored the magic last. NULL for anything else (being created, a creator died half-way, an
 * older version), which map_locked() then handles under the lock. */
static struct vgpu_region *map_ready(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(struct vgpu_region) + 1)
        return NULL;
    void *p = map_region(fd);
    if (!p)
        return NULL;
    struct vgpu_region *r = p;
    if (__atomic_load_n(&r->initialized_flag, __ATOMIC_ACQUIRE) == VGPU_MAGIC && r->major_version == VGPU_MAJOR &&
        r->minor_version == VGPU_MINOR)
        return r;
    munmap(p, sizeof(struct vgpu_region));
    return NULL;
}

static void attach_file(void) {
    const char *why = NULL;
    int fd = open(vgpu_config.cache_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        vgpu_region = private_region(strerror(errno));
        return;
    }
    (void)fchmod(fd, 0666); /* the umask must not lock out the container's other users */
    cache_fd = fd;
    struct vgpu_region *r = map_ready(fd);
    if (!r) {
        pthread_mutex_lock(&lock_mu);
        /* Not ready: create it if nobody holds the lock; otherwise the holder is most likely creating it,
         * so wait for it alongside everyone else and look again. */
        bool locked = try_lock_file(fd);
        if (!locked) {
            wait_for_holder(fd);
            r = map_ready(fd);
        }
        if (!r) {
            if (!locked)
                lock_file(fd, F_WRLCK);
            r = map_locked(fd, &why);
            unlock_file(fd);
        }
        pthread_mutex_unlock(&lock_mu);
    }
    if (r) {
        vgpu_region = r;
        file_backed = true;
        return;
    }
    close(fd);
    cache_fd = -1;
    vgpu_region = private_region(why);
}

void vgpu_cache_attach(void) {
    if (!vgpu_region)
        attach_file();
    else if (file_backed && cache_fd < 0) /* a fork child: get our own open file description */
        cache_fd = open(vgpu_config.cache_path, O_RDWR | O_CLOEXEC);
    if (!vgpu_region) { /* out of memory even for the private copy: run unaccounted rather than crash */
        vgpu_log(VGPU_LOG_ERROR, "no memory for the accounting region; limits are not enforced");
        return;
    }
    pid_t me = getpid();
    char state;
    uint64_t start = proc_start_time(me, &state);
    struct vgpu_slot *s = holds_pid(vgpu_region, me) ? NULL : claim_free(vgpu_region, me, start);
    if (s) {
        /* Dead slots are cleared a few per start, as before, but only when that costs no wait and only
         * those whose PID is gone (a kill(2) each): the allocation slow path checks every slot thoroughly
         * before it refuses anything. */
        if (cache_try_lock()) {
            int32_t n = VGPU_LOAD(&vgpu_region->proc_num);
            if (n > 0)
                reclaim_dead(vgpu_region, (int)(me % n), RECLAIM_PER_ATTACH, false);
            vgpu_cache_unlock();
        }
    } else {
        vgpu_cache_lock();
        s = claim_slot(vgpu_region, me, start);
        vgpu_cache_unlock();
    }
    if (!s) {
        vgpu_log(VGPU_LOG_ERROR, "all %d process slots of the shared cache are in use; running unaccounted",
                 VGPU_MAX_PROCS);
        return;
    }
    atomic_store_explicit(&vgpu_my_slot, s, memory_order_release);
}

/* From a signal handler (suspend/resume): one atomic load and one atomic store. */
void vgpu_cache_set_status(int32_t status) {
    struct vgpu_slot *s = atomic_load(&vgpu_my_slot);
    if (s)
        VGPU_STORE(&s->status, status);
}

/* At exit: lock-free on purpose, because another thread may hold the process mutex forever now. */
void vgpu_cache_detach(void) {
    struct vgpu_slot *s = atomic_exchange(&vgpu_my_slot, NULL);
    if (s)
        free_slot(s);
}

/* The lock, to write a field that is written once per file. Processes that find the lock held wait for
 * its holder (most likely writing that field) all together, and take the lock only if the field is still
 * unwritten then: in a crowded start they do not pass the lock from one to the next just to find the work
 * done. False, holding nothing, when the field got written meanwhile. */
static bool lock_for_first_write(const uint64_t *field) {
    if (cache_try_lock())
        return true;
    pthread_mutex_lock(&lock_mu);
    if (cache_fd >= 0)
        wait_for_holder(cache_fd);
    pthread_mutex_unlock(&lock_mu);
    if (VGPU_LOAD(field) != 0)
        return false;
    vgpu_cache_lock();
    return true;
}

/* The device count and UUIDs the monitor labels its metrics with, written once per file by the first
 * process that knows them. The UUID comes from the CUDA driver (NVML prints the same 16 bytes), so no
 * NVML initialisation is needed on this path. */
void vgpu_cache_record_devices(int count) {
    if (!vgpu_region || count <= 0 || VGPU_LOAD(&vgpu_region->device_num) != 0 || !HAVE_REAL(cuDeviceGetUuid_v2) ||
        !lock_for_first_write(&vgpu_region->device_num))
        return;
    if (VGPU_LOAD(&vgpu_region->device_num) == 0) {
        int n = count < VGPU_MAX_DEVICES ? count : VGPU_MAX_DEVICES;
        for (int d = 0; d < n; d++) {
            CUuuid u;
            if (REAL(cuDeviceGetUuid_v2)(&u, d) != CUDA_SUCCESS)
                continue;
            const unsigned char *b = (const unsigned char *)u.bytes;
            snprintf(vgpu_region->uuids[d], VGPU_UUID_LEN,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
                     b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        }
        VGPU_STORE(&vgpu_region->device_num, (uint64_t)n);
    }
    vgpu_cache_unlock();
}

/* last_kernel_time only ever moves forward, whoever of the container's processes writes it. */
void vgpu_cache_raise_kernel_time(uint64_t now) {
    if (!vgpu_region)
        return;
    uint64_t last = VGPU_LOAD(&vgpu_region->last_kernel_time);
    while (last < now && !__atomic_compare_exchange_n(&vgpu_region->last_kernel_time, &last, now, false,
                                                      __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
    }
}

/* HAMi-core stamps last_kernel_time when a process attaches (its monitor reads a container that has just
 * started as active, not as idle since the epoch). */
void vgpu_cache_mark_started(void) { vgpu_cache_raise_kernel_time((uint64_t)time(NULL)); }

/* Fork: the prepare handler takes the process mutex so no thread of the parent is inside the lock when
 * the child is created; the child then drops the parent's slot and its descriptor (whose open file
 * description, and so whose lock, the parent shares). The mapping stays (MAP_SHARED is inherited); a
 * fresh descriptor is opened at the child's attach. */
void vgpu_cache_before_fork(void) { pthread_mutex_lock(&lock_mu); }
void vgpu_cache_after_fork_parent(void) { pthread_mutex_unlock(&lock_mu); }
void vgpu_cache_after_fork_child(void) {
    atomic_store(&vgpu_my_slot, NULL);
    if (cache_fd >= 0)
        close(cache_fd);
    cache_fd = -1;
    pthread_mutex_unlock(&lock_mu);
}
