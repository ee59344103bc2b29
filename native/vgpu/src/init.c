/*
 * The one init path. vgpu_ensure_init() (pthread_once) fills the table of real entry points and loads
 * the limits; vgpu_ensure_attached() then joins the shared cache, once per process and again in a fork
 * child. Both run lazily from the hooks, never from a constructor: HAMi installs the library through
 * /etc/ld.so.preload, so it is loaded into every process of the container (shells, ls, ...), and only
 * processes that actually call the driver should dlopen it or take a slot.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#include "vgpu.h"

#define AS_NAME(n) #n,
#define AS_FN(n) (void *)&n,
const char *const vgpu_fn_name[VGPU_FN_COUNT] = {VGPU_CUDA_HOOKS(AS_NAME) VGPU_NVML_HOOKS(AS_NAME)
                                                     VGPU_CUDA_CALLS(AS_NAME) VGPU_NVML_CALLS(AS_NAME)};
void *const vgpu_hook_fn[VGPU_HOOK_COUNT] = {VGPU_CUDA_HOOKS(AS_FN) VGPU_NVML_HOOKS(AS_FN)};
void *vgpu_real[VGPU_FN_COUNT];
int vgpu_device_count;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
atomic_int vgpu_attached;
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

static void load_reals(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
    if (!cuda)
        vgpu_log(VGPU_LOG_WARN, "libcuda.so.1 not found: %s", dlerror());
    for (int i = 0; i < VGPU_FN_COUNT; i++) {
        void *h = strncmp(vgpu_fn_name[i], "nvml", 4) == 0 ? nvml : cuda;
        void *p = h ? vgpu_real_dlsym(h, vgpu_fn_name[i]) : NULL;
        if (!p) /* e.g. the driver is already loaded under another name: whatever follows us */
            p = vgpu_real_dlsym(RTLD_NEXT, vgpu_fn_name[i]);
        vgpu_real[i] = (i < VGPU_HOOK_COUNT && p == vgpu_hook_fn[i]) ? NULL : p; /* never call ourselves */
    }
}

static void do_init(void) {
    vgpu_config_load(&vgpu_config);
    load_reals();
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

void vgpu_ensure_init(void) { pthread_once(&init_once, do_init); }

void vgpu_refresh_device_count(void) {
    int n = 0;
    if (HAVE_REAL(cuDeviceGetCount) && REAL(cuDeviceGetCount)(&n) == CUDA_SUCCESS && n > 0)
        __atomic_store_n(&vgpu_device_count, n, __ATOMIC_RELEASE);
}

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

void vgpu_ensure_attached(void) {
    int state = atomic_load_explicit(&vgpu_attached, memory_order_acquire);
    if (VGPU_LIKELY(state == VGPU_RUNNING))
        return;
    if (state == VGPU_SUSPENDED) {
        wait_while_suspended();
        return;
    }
    vgpu_ensure_init();
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

int vgpu_current_device(void) {
    if (__atomic_load_n(&vgpu_device_count, __ATOMIC_RELAXED) == 1)
        return 0; /* the common case costs no driver call */
    CUdevice d;
    if (HAVE_REAL(cuCtxGetDevice) && REAL(cuCtxGetDevice)(&d) == CUDA_SUCCESS)
        return d;
    return -1;
}

/* Exit: give the slot back so the container's usage drops at once. Later hook calls from threads still
 * running pass through unaccounted instead of re-attaching. */
__attribute__((destructor)) static void vgpu_fini(void) {
    atomic_store(&exiting, true);
    vgpu_cache_detach();
}
