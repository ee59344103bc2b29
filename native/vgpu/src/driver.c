/*
 * The table of the real driver's entry points, filled once per process by init.c's start-up: the driver
 * is dlopen'ed at the first driver call, not at load time (init.c says why).
 */
#include <dlfcn.h>
#include <string.h>

#include "config.h"
#include "driver.h"

#define AS_NAME(n) #n,
const char *const vgpu_fn_name[VGPU_FN_COUNT] = {VGPU_CUDA_HOOKS(AS_NAME) VGPU_NVML_HOOKS(AS_NAME)
                                                     VGPU_CUDA_CALLS(AS_NAME) VGPU_NVML_CALLS(AS_NAME)};
void *vgpu_real[VGPU_FN_COUNT];
void *const *vgpu_hook_fn;

void vgpu_driver_load(void *const hook_fn[VGPU_HOOK_COUNT]) {
    vgpu_hook_fn = hook_fn;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NODELETE);
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NODELETE);
    if (!cuda)
        vgpu_log(VGPU_LOG_WARN, "libcuda.so.1 not found: %s", dlerror());
    for (int i = 0; i < VGPU_FN_COUNT; i++) {
        void *h = strncmp(vgpu_fn_name[i], "nvml", 4) == 0 ? nvml : cuda;
        void *p = h ? vgpu_real_dlsym(h, vgpu_fn_name[i]) : NULL;
        if (!p) /* e.g. the driver is already loaded under another name: whatever follows us */
            p = vgpu_real_dlsym(RTLD_NEXT, vgpu_fn_name[i]);
        vgpu_real[i] = (i < VGPU_HOOK_COUNT && p == hook_fn[i]) ? NULL : p; /* never call ourselves */
    }
}
