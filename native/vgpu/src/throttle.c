/*
 * SM limit: a sampler thread reads NVML per-process utilisation for the container's processes and
 * steers a per-device token bucket of thread blocks that launches draw from.
 *
 * Each tick the controller sets this process's allowance to what it launched x limit /
 * measured-container-utilisation (at most x4 up while under half the limit, else x2, and /2 down per
 * tick), per nominal tick of the time that really passed, starting from a small allowance instead of
 * "unlimited until the first sample" (HAMi-core lets the first ~120 ms through). Every process of the
 * container does the same against the same container-wide sum, so together they converge on the limit.
 * The gate is computed before the first launch, so there is no unthrottled start. Launches of every kind
 * (plain, Ex, cooperative, _ptsz) draw from the bucket.
 *
 * Monitor feedback (HAMi's fields): recent_kernel < 0 blocks launches until it is cleared; launches make
 * the sampler set recent_kernel = 2 (never over a -1) and last_kernel_time. utilization_switch = 0 turns
 * throttling off under the default policy; FORCE ignores it, DISABLE turns throttling and blocking off.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "driver.h"
#include "shared_cache.h"
#include "throttle.h"

enum { TICK_THROTTLED_MS = 50, TICK_IDLE_MS = 500, MAX_SAMPLES = 256 };
/* Tokens, allowances and the launched count are in 1/256 of a thread block, so an allowance can sit
 * between whole blocks: two and a half single-block kernels per tick average out as such, where whole
 * blocks would round them to two or three (-20 % or +20 % of a 10 % limit). */
enum { UNIT_SHIFT = 8, BLOCK = 1 << UNIT_SHIFT };
static const int64_t MAX_ALLOWANCE = INT64_MAX / 4;
/* The least allowance, an eighth of a block per tick: low enough that a few long kernels with small grids
 * still keep to a 10 % limit, and above zero so that an allowance can grow again. */
static const int64_t MIN_ALLOWANCE = BLOCK / 8;

_Atomic unsigned vgpu_launch_gate = VGPU_GATE_UNREADY;

struct bucket {
    _Atomic int64_t tokens;     /* units that may still start this tick; may go negative (debt) */
    _Atomic uint64_t launched;  /* units launched since the last tick */
    _Atomic bool active;
    int64_t allowance;          /* units per tick; sampler thread only */
    int64_t sms;                /* the device's SM count: the blocks of one wave */
};

static struct bucket buckets[VGPU_MAX_DEVICES];
static atomic_bool launch_seen;
static atomic_bool sampler_started;
static bool nvml_ready;
static unsigned long long last_sample_us[VGPU_MAX_DEVICES];
static uint64_t last_tick_ns[VGPU_MAX_DEVICES]; /* sampler thread only */

uint64_t vgpu_grid_blocks(unsigned x, unsigned y, unsigned z) {
    uint64_t n = (uint64_t)x * y; /* fits: both are 32-bit */
    if (__builtin_mul_overflow(n, (uint64_t)z, &n))
        return UINT64_MAX;
    return n;
}

unsigned vgpu_wave_blocks(void) {
    int d = vgpu_current_device();
    return (unsigned)(d >= 0 && d < VGPU_MAX_DEVICES && buckets[d].sms > 0 ? buckets[d].sms : 16);
}

static void sleep_ms(long ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static uint64_t sm_limit_of(int d) {
    uint64_t mine = vgpu_config.sm_limit[d];
    uint64_t file = vgpu_region ? VGPU_LOAD_RELAXED(&vgpu_region->sm_limit[d]) : 100;
    if (file == 0 || file > 100)
        file = 100;
    return mine < file ? mine : file;
}

static bool throttling_wanted(int d) {
    if (sm_limit_of(d) >= 100 || vgpu_config.policy == VGPU_POLICY_DISABLE)
        return false;
    if (vgpu_config.policy == VGPU_POLICY_FORCE)
        return true;
    return !vgpu_region || VGPU_LOAD_RELAXED(&vgpu_region->utilization_switch) != 0;
}

static bool blocked_by_monitor(void) {
    return vgpu_config.policy != VGPU_POLICY_DISABLE && vgpu_region &&
           VGPU_LOAD_RELAXED(&vgpu_region->recent_kernel) < 0;
}

static int devices(void) {
    int n = __atomic_load_n(&vgpu_device_count, __ATOMIC_RELAXED);
    return n <= 0 ? 1 : (n > VGPU_MAX_DEVICES ? VGPU_MAX_DEVICES : n);
}

/* Recompute the throttle/blocked bits; TICK is left as it is. */
static void refresh_gate(void) {
    unsigned bits = 0;
    for (int d = 0; d < devices(); d++) {
        bool on = throttling_wanted(d) && atomic_load(&sampler_started); /* no refills, no bucket */
        atomic_store(&buckets[d].active, on);
        if (on)
            bits |= VGPU_GATE_THROTTLE;
    }
    if (blocked_by_monitor())
        bits |= VGPU_GATE_BLOCKED;
    unsigned old = atomic_load(&vgpu_launch_gate);
    while (!atomic_compare_exchange_weak(&vgpu_launch_gate, &old,
                                         (old & (VGPU_GATE_TICK | VGPU_GATE_SUSPENDED)) | bits)) {
    }
}

static void take_tokens(int d, uint64_t blocks) {
    if (d < 0 || d >= VGPU_MAX_DEVICES)
        return;
    struct bucket *b = &buckets[d];
    int64_t cost = blocks > (uint64_t)MAX_ALLOWANCE >> UNIT_SHIFT ? MAX_ALLOWANCE : (int64_t)blocks << UNIT_SHIFT;
    while (atomic_load(&b->active)) {
        if (atomic_load(&b->tokens) > 0) { /* one launch may overdraw; the debt delays the next ones */
            atomic_fetch_sub(&b->tokens, cost);
            atomic_fetch_add(&b->launched, (uint64_t)cost);
            return;
        }
        sleep_ms(2);
    }
}

static void ensure_sampler(void);

CUresult vgpu_launch_slow(uint64_t blocks) {
    unsigned g = atomic_load(&vgpu_launch_gate);
    if (g & (VGPU_GATE_UNREADY | VGPU_GATE_SUSPENDED)) {
        vgpu_ensure_attached();
        g = atomic_load(&vgpu_launch_gate);
    }
    ensure_sampler();
    g = atomic_load(&vgpu_launch_gate);
    /* The slow path takes every first launch (TICK is set from attach until one clears it). */
    vgpu_host_pid_look_once(VGPU_LOOK_AT_LAUNCH);
    if (g & VGPU_GATE_TICK) {
        atomic_store(&launch_seen, true);
        atomic_fetch_and(&vgpu_launch_gate, ~(unsigned)VGPU_GATE_TICK);
    }
    /* Also checked directly: the slow path runs at least once per tick, so a block set by the monitor
     * takes effect before the sampler has seen it. */
    while (blocked_by_monitor())
        sleep_ms(10);
    if (g & VGPU_GATE_THROTTLE)
        take_tokens(vgpu_current_device(), blocks);
    return CUDA_SUCCESS;
}

/* ---- the sampler thread ---- */

static nvmlDevice_t nvml_device(int cuda_dev) {
    nvmlDevice_t h = NULL;
    int idx = vgpu_nvml_index(cuda_dev);
    if (!nvml_ready || idx < 0 || !HAVE_REAL(nvmlDeviceGetHandleByIndex_v2) ||
        REAL(nvmlDeviceGetHandleByIndex_v2)((unsigned)idx, &h) != NVML_SUCCESS)
        return NULL;
    return h;
}

static void setup_nvml(void) { nvml_ready = HAVE_REAL(nvmlInit_v2) && REAL(nvmlInit_v2)() == NVML_SUCCESS; }

static bool in_container(unsigned pid) {
    int32_t n = VGPU_LOAD(&vgpu_region->proc_num);
    for (int32_t i = 0; i < n; i++)
        if (VGPU_LOAD_RELAXED(&vgpu_region->procs[i].pid) != 0 &&
            (unsigned)VGPU_LOAD_RELAXED(&vgpu_region->procs[i].hostpid) == pid)
            return true;
    return false;
}

/* Container utilisation of device d in percent, or -1 when there is no fresh sample. While our host PID
 * is unknown (hostpid.c) it is the device's utilisation, which over-throttles but never under-throttles. */
static int container_util(int d, struct vgpu_slot *me) {
    static nvmlProcessUtilizationSample_t samples[MAX_SAMPLES];
    nvmlDevice_t h = nvml_device(d);
    if (!h)
        return -1;
    int32_t host_pid = vgpu_host_pid();
    if (!host_pid) {
        nvmlUtilization_t u;
        if (!HAVE_REAL(nvmlDeviceGetUtilizationRates) || REAL(nvmlDeviceGetUtilizationRates)(h, &u) != NVML_SUCCESS)
            return -1;
        return (int)(u.gpu > 100 ? 100 : u.gpu);
    }
    unsigned count = MAX_SAMPLES;
    if (!HAVE_REAL(nvmlDeviceGetProcessUtilization) ||
        REAL(nvmlDeviceGetProcessUtilization)(h, samples, &count, last_sample_us[d]) != NVML_SUCCESS)
        return -1;
    unsigned sum = 0;
    bool any = false;
    for (unsigned i = 0; i < count && i < MAX_SAMPLES; i++) {
        if (samples[i].timeStamp > last_sample_us[d])
            last_sample_us[d] = samples[i].timeStamp;
        if (samples[i].pid == (unsigned)host_pid)
            VGPU_STORE(&me->device_util[d].sm_util, (uint64_t)samples[i].smUtil);
        if (in_container(samples[i].pid)) {
            sum += samples[i].smUtil;
            any = true;
        }
    }
    return any ? (int)(sum > 100 ? 100 : sum) : 0;
}

/* New allowance (units per nominal tick) from what we launched over the last `ticks` nominal ticks (the
 * sampler may run late) and what the container achieved with it. With nothing of ours launched the sample
 * says nothing about what our launches cost (the utilisation is earlier work still running, or other
 * processes'), so the allowance holds: halving it then would leave a process that paused for its queue to
 * drain far below its share. */
static int64_t steer(int64_t allowance, uint64_t launched, double ticks, int util, uint64_t limit) {
    if (util < 0 || launched == 0)
        return allowance; /* no fresh sample, or no launches to scale: hold */
    int64_t next = allowance;
    double per_tick = (double)launched / ticks;
    if ((uint64_t)util <= limit) {
        /* room left: grow towards launched * limit / util, at most x4 while under half the limit (a quick
         * start), else x2 */
        double most = (2 * (uint64_t)util <= limit ? 4.0 : 2.0) * (double)allowance;
        double target = util > 0 ? per_tick * (double)limit / util : most;
        next = target > (double)allowance ? (int64_t)(target < most ? target : most) : allowance;
    } else {
        double target = per_tick * (double)limit / util;
        next = target < (double)allowance / 2 ? allowance / 2 : (int64_t)target;
        if (next > allowance)
            next = allowance;
    }
    return next < MIN_ALLOWANCE ? MIN_ALLOWANCE : (next > MAX_ALLOWANCE ? MAX_ALLOWANCE : next);
}

static void refill(struct bucket *b, int64_t allowance) {
    int64_t t = atomic_load(&b->tokens);
    int64_t next;
    do { /* debt carries over; unused tokens do not pile up beyond one tick's worth */
        next = t + allowance;
        if (next > allowance)
            next = allowance;
    } while (!atomic_compare_exchange_weak(&b->tokens, &t, next));
}

static void report_launches(void) {
    if (!atomic_exchange(&launch_seen, false) || !vgpu_region)
        return;
    vgpu_cache_raise_kernel_time((uint64_t)time(NULL));
    int32_t rk = VGPU_LOAD(&vgpu_region->recent_kernel);
    while (rk >= 0 && rk != 2 && !__atomic_compare_exchange_n(&vgpu_region->recent_kernel, &rk, 2, false,
                                                              __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
    }
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Nominal ticks since the last throttled tick. The sampler runs late when the machine is busy; steering and
 * refilling by the time that really passed keeps the launch rate right (a late tick would otherwise read
 * as under-use and double the allowance). */
static double ticks_since(uint64_t *last) {
    uint64_t now = mono_ns();
    double ticks = *last ? (double)(now - *last) / (TICK_THROTTLED_MS * 1e6) : 1.0;
    *last = now;
    return ticks < 0.25 ? 0.25 : ticks;
}

static bool tick(void) {
    struct vgpu_slot *me = atomic_load(&vgpu_my_slot);
    if (!me)
        return false;
    if (!vgpu_host_pid())
        vgpu_host_pid_look();
    report_launches();
    atomic_fetch_or(&vgpu_launch_gate, VGPU_GATE_TICK);
    refresh_gate();
    bool any = false;
    for (int d = 0; d < devices(); d++) {
        struct bucket *b = &buckets[d];
        if (!atomic_load(&b->active)) {
            last_tick_ns[d] = 0; /* a bucket switched on again starts from one tick */
            continue;
        }
        any = true;
        int util = container_util(d, me);
        double ticks = ticks_since(&last_tick_ns[d]);
        b->allowance = steer(b->allowance, atomic_exchange(&b->launched, 0), ticks, util, sm_limit_of(d));
        double due = (double)b->allowance * (ticks < 4.0 ? ticks : 4.0); /* a long pause is not made up */
        refill(b, due < (double)MAX_ALLOWANCE ? (int64_t)due : MAX_ALLOWANCE);
    }
    return any;
}

static void *sampler_main(void *arg) {
    (void)arg;
    setup_nvml();
    /* cuInit, the first context and the first launch look for the host PID (hostpid.c); this look is for
     * a process attached by another hooked call, and the ticks keep looking while it is unknown. */
    if (!vgpu_host_pid())
        vgpu_host_pid_look();
    bool throttled = true;
    for (;;) {
        sleep_ms(throttled ? TICK_THROTTLED_MS : TICK_IDLE_MS);
        throttled = tick();
    }
    return NULL;
}

static void init_buckets(void) {
    for (int d = 0; d < devices(); d++) {
        int sms = 0;
        if (!HAVE_REAL(cuDeviceGetAttribute) ||
            REAL(cuDeviceGetAttribute)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d) != CUDA_SUCCESS || sms <= 0)
            sms = 16;
        buckets[d].sms = sms;
        buckets[d].allowance = (int64_t)sms * 8 * BLOCK; /* a few waves per tick until the first sample */
        atomic_store(&buckets[d].tokens, buckets[d].allowance);
        atomic_store(&buckets[d].launched, 0);
    }
}

static bool start_sampler(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the application's signals are not ours to receive */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int err = pthread_create(&t, &attr, sampler_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0)
        vgpu_log(VGPU_LOG_ERROR, "cannot start the utilisation sampler: %s; SM limits are not enforced",
                 strerror(err));
    return err == 0;
}

/* Called once per process from the attach path, before the process counts as attached. */
void vgpu_throttle_start(void) {
    init_buckets();
    atomic_store(&vgpu_launch_gate, VGPU_GATE_TICK);
}

/* Called once per process right after attaching (cuInit, or the first hooked call), as HAMi-core starts
 * its watcher there. The thread is created here and does its NVML work itself, so the attach path pays
 * for pthread_create only (cuInit also looks for the host PID once, hostpid.c). */
void vgpu_throttle_attached(void) { ensure_sampler(); }

static void ensure_sampler(void) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    if (VGPU_LIKELY(atomic_load(&sampler_started)))
        return;
    pthread_mutex_lock(&mu);
    if (!atomic_load(&sampler_started) && atomic_load(&vgpu_attached)) {
        atomic_store(&sampler_started, start_sampler());
        refresh_gate();
    }
    pthread_mutex_unlock(&mu);
}

/* Fork child: the sampler thread did not survive; it is restarted at the child's attach. */
void vgpu_throttle_forget_after_fork(void) {
    atomic_store(&sampler_started, false); /* the host PID is forgotten by hostpid.c's own handler */
    memset(last_tick_ns, 0, sizeof last_tick_ns);
    atomic_store(&vgpu_launch_gate, VGPU_GATE_UNREADY);
}
