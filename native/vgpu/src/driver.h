/*
 * Layer 2, driver: the real driver's entry points and what they say about the devices; above config.
 *  - driver.c: the table of real entry points, filled once per process (vgpu_driver_load());
 *  - dlsym.c: the C library's dlsym, and the two lookups that hand out our functions in place of the
 *    driver's (the exported dlsym and cuGetProcAddress(_v2));
 *  - devices.c: the device count, the calling thread's device, CUDA ordinal <-> NVML index.
 * The hooked and the called functions are listed once, in hook_list.h.
 */
#ifndef VGPU_DRIVER_H
#define VGPU_DRIVER_H

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

/* Real entry points, written once by vgpu_driver_load() and read-only afterwards. */
extern void *vgpu_real[VGPU_FN_COUNT];
extern const char *const vgpu_fn_name[VGPU_FN_COUNT];
/* Our own function for each hooked name, which the lookups hand out in place of the driver's: the table
 * init.c passes to vgpu_driver_load(), so this layer names no hook. NULL before vgpu_ensure_init(). */
extern void *const *vgpu_hook_fn;

#define REAL(n) ((__typeof__(&n))vgpu_real[VGPU_FN_##n])
#define HAVE_REAL(n) (vgpu_real[VGPU_FN_##n] != NULL)
#define VGPU_EXPORT __attribute__((visibility("default")))

/* ---- driver.c ---- */
void vgpu_driver_load(void *const hook_fn[VGPU_HOOK_COUNT]); /* opens the driver, fills vgpu_real */

/* ---- dlsym.c ---- */
void *vgpu_real_dlsym(void *handle, const char *name); /* the C library's dlsym, never ours */

/* ---- devices.c ---- */
extern int vgpu_device_count;           /* from cuDeviceGetCount; 0 = unknown */
void vgpu_refresh_device_count(void);
int vgpu_current_device(void);          /* CUDA ordinal of the calling thread's context, -1 if none */
int vgpu_nvml_index(int cuda_dev);      /* -1 when not visible */
int vgpu_cuda_ordinal(unsigned nvml_index);

/* ---- start-up, provided by init.c ----
 * The library starts lazily, at whichever lookup or hooked call comes first, never from a constructor
 * (init.c says why). So there is no moment before the first need at which init.c could register a
 * callback: it provides these two as a constant table instead, bound when the library is loaded, and the
 * layers below call through it without naming anything of init.c. The lowest caller is dlsym.c. */
struct vgpu_startup {
    void (*ensure_init)(void);     /* real table + config, once per process */
    void (*ensure_attached)(void); /* + shared cache slot, once per process (again after fork); waits
                                      while the process is suspended */
};
extern const struct vgpu_startup vgpu_startup;
static inline void vgpu_ensure_init(void) { vgpu_startup.ensure_init(); }
static inline void vgpu_ensure_attached(void) { vgpu_startup.ensure_attached(); }

#endif
