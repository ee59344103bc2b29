/*
 * The one init path, and layer 7 (init), the top: the one file that knows every layer and wires them
 * together. vgpu_ensure_init() (pthread_once) fills the table of real entry points and loads the limits;
 * vgpu_ensure_attached() then joins the shared cache, once per process and again in a fork child. Both
 * run lazily from the hooks, never from a constructor: HAMi installs the library through
 * /etc/ld.so.preload, so it is loaded into every process of the container (shells, ls, ...), and only
 * processes that actually call the driver should dlopen it or take a slot. (Nor could a constructor
 * register them in time: the constructors of the libraries a program links run before a preloaded
 * library's, and may call the driver.) So the layers below reach them through vgpu_startup (driver.h),
 * defined at the bottom of this file, and this file hands the driver layer the table of our hooks.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "config.h"
#include "driver.h"
#include "shared_cache.h"
#include "memory.h"
#include "throttle.h"

/* Our function for each hooked name (the exported hooks of every layer, declared by include/). */
#define AS_FN(n) (void *)&n,
static void *const hook_fn[VGPU_HOOK_COUNT] = {VGPU_CUDA_HOOKS(AS_FN) VGPU_NVML_HOOKS(AS_FN)};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool exiting;

static void before_fork(void) {
    pthread_mutex_lock(&attach_mu);
    vgpu_cache_before_fork();
    vgpu_table_before_fork();
    vgpu_host_pid_before_fork();
}

static void after_fork_parent(void) {
    vgpu_host_pid_after_fork(false);
    vgpu_table_after_fork(false);
    vgpu_cache_after_fork_parent();
    pthread_mutex_unlock(&attach_mu);
}

/* The child is a new process: it takes its own slot at its first driver call. */
static void after_fork_child(void) {
    vgpu_host_pid_after_fork(true);
    vgpu_table_after_fork(true);
    vgpu_cache_after_fork_child();
    vgpu_throttle_forget_after_fork();
    atomic_store(&vgpu_attached, VGPU_DETACHED);
    pthread_mutex_unlock(&attach_mu);
}

static void do_init(void) {
    vgpu_config_load(&vgpu_config);
    vgpu_driver_load(hook_fn);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

static void ensure_init(void) { pthread_once(&init_once, do_init); }

/* HAMi-core's suspend and resume: SIGUSR2 sets the slot's status to 2 and holds every hooked call (and
 * every launch, through the launch gate) until SIGUSR1 sets it back to 1. Unlike HAMi-core, an
 * application's own handlers for these signals are kept: ours are installed only where the disposition
 * is still the default (which would have terminated the process). */
static void on_suspend(int sig) {
    (void)sig;
    int running = VGPU_RUNNING;
    if (atomic_compare_exchange_strong(&vgpu_attached, &running, VGPU_SUSPENDED)) {
        atomic_fetch_or(&vgpu_launch_gate, VGPU_GATE_SUSPENDED);
        vgpu_cache_set_status(2);
    }
}

static void on_resume(int sig) {
    (void)sig;
    int suspended = VGPU_SUSPENDED;
    if (atomic_compare_exchange_strong(&vgpu_attached, &suspended, VGPU_RUNNING)) {
        vgpu_cache_set_status(1);
        atomic_fetch_and(&vgpu_launch_gate, ~(unsigned)VGPU_GATE_SUSPENDED);
    }
}

static void install_handler(int sig, void (*handler)(int)) {
    struct sigaction old, sa = {.sa_handler = handler, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL)
        (void)sigaction(sig, &sa, NULL);
}

/* Polled: a hooked call may come from any thread, and a resume from a signal. */
static void wait_while_suspended(void) {
    while (atomic_load(&vgpu_attached) == VGPU_SUSPENDED && !atomic_load(&exiting)) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void ensure_attached(void) {
    int state = atomic_load_explicit(&vgpu_attached, memory_order_acquire);
    if (VGPU_LIKELY(state == VGPU_RUNNING))
        return;
    if (state == VGPU_SUSPENDED) {
        wait_while_suspended();
        return;
    }
    ensure_init();
    if (atomic_load(&exiting))
        return;
    pthread_mutex_lock(&attach_mu);
    if (atomic_load(&vgpu_attached) == VGPU_DETACHED) {
        vgpu_cache_attach();
        vgpu_memory_setup();
        vgpu_refresh_device_count();
        vgpu_cache_record_devices(vgpu_device_count);
        vgpu_throttle_start();
        vgpu_cache_mark_started();
        atomic_store_explicit(&vgpu_attached, VGPU_RUNNING, memory_order_release);
        vgpu_throttle_attached();
        install_handler(SIGUSR2, on_suspend);
        install_handler(SIGUSR1, on_resume);
    }
    pthread_mutex_unlock(&attach_mu);
}

/* Exit: give the slot back so the container's usage drops at once. Later hook calls from threads still
 * running pass through unaccounted instead of re-attaching. */
__attribute__((destructor)) static void vgpu_fini(void) {
    atomic_store(&exiting, true);
    vgpu_cache_detach();
}

const struct vgpu_startup vgpu_startup = {.ensure_init = ensure_init, .ensure_attached = ensure_attached};
