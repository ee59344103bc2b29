/*
 * The two lookup paths besides direct linking: an exported dlsym() and cuGetProcAddress(_v2).
 *
 * dlsym hands out a wrapper only when the caller's lookup would have produced the driver's own function
 * for a name we hook (or our exported wrapper, as RTLD_DEFAULT finds it). Every other name and handle -
 * cudnn*, cublas*, cuda* runtime names, libraries defining their own cu* symbols - gets exactly what the
 * C library's dlsym returns. RTLD_NEXT goes to the C library untouched, with the caller's own return
 * address, so "the next foo" is exactly glibc's answer: never the caller itself (no recursion), the
 * same answer every time (no NULL on repeats); from a program that is our wrapper, as LD_PRELOAD puts us
 * first.
 *
 * cuGetProcAddress asks the real driver first, so versions, _ptsz variants and errors are the driver's;
 * the pointer it returns is then swapped for our wrapper of that very function.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

typedef void *(*dlsym_fn)(void *, const char *);

/* The C library's dlsym, found with dlvsym so that our own exported dlsym is never in the way. */
dlsym_fn vgpu_libc_dlsym;

dlsym_fn vgpu_resolve_libc_dlsym(void) {
    dlsym_fn f = __atomic_load_n(&vgpu_libc_dlsym, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!f)
            f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        __atomic_store_n(&vgpu_libc_dlsym, f, __ATOMIC_RELEASE);
    }
    return f;
}

void *vgpu_real_dlsym(void *handle, const char *name) {
    dlsym_fn f = vgpu_resolve_libc_dlsym();
    return f ? f(handle, name) : NULL;
}

static int hook_index(const char *name) {
    for (int i = 0; i < VGPU_HOOK_COUNT; i++)
        if (strcmp(vgpu_fn_name[i], name) == 0)
            return i;
    return -1;
}

static bool driver_name(const char *name) {
    return (name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0;
}

/* dlsym(RTLD_NEXT, ...) must see its real caller's return address (glibc searches the objects after the
 * caller's), so that case jumps straight into the C library's dlsym with the caller's frame untouched.
 * It also runs inside the ASan runtime's own start-up, before anything else can be called. */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "    cmpq $-1, %rdi\n"                 /* RTLD_NEXT */
        "    jne vgpu_dlsym_handle\n"
        "    movq vgpu_libc_dlsym(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    jnz 1f\n"
        "    pushq %rdi\n"
        "    pushq %rsi\n"
        "    subq $8, %rsp\n"                  /* 16-byte stack alignment for the call */
        "    call vgpu_resolve_libc_dlsym\n"
        "    addq $8, %rsp\n"
        "    popq %rsi\n"
        "    popq %rdi\n"
        "1:  jmp *%rax\n"
        ".size dlsym, .-dlsym\n");

void *vgpu_dlsym_handle(void *handle, const char *name) {
    void *p = vgpu_real_dlsym(handle, name);
    if (!p || !driver_name(name))
        return p;
    int i = hook_index(name);
    if (i < 0)
        return p;
    vgpu_ensure_init();
    return (p == vgpu_real[i] || p == vgpu_hook_fn[i]) && vgpu_real[i] ? vgpu_hook_fn[i] : p;
}

/* Which hooked function a base name means for this CUDA version, when the driver's pointer is not one
 * we recognise (a driver may hand out internal entry points). Versions are when each _v2 appeared. */
struct versioned {
    const char *base;
    int since;
    const char *name;
};
static const struct versioned VERSIONED[] = {
    {"cuMemAlloc", 3020, "cuMemAlloc_v2"},         {"cuMemFree", 3020, "cuMemFree_v2"},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},     {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"}, {"cuArrayCreate", 3020, "cuArrayCreate_v2"},
    {"cuArray3DCreate", 3020, "cuArray3DCreate_v2"}, {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
};

static int hook_by_name(const char *symbol, int cuda_version, cuuint64_t flags) {
    char name[128];
    for (size_t k = 0; k < sizeof VERSIONED / sizeof VERSIONED[0]; k++)
        if (strcmp(VERSIONED[k].base, symbol) == 0)
            return cuda_version >= VERSIONED[k].since ? hook_index(VERSIONED[k].name) : -1;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        int i = hook_index(name);
        if (i >= 0)
            return i;
    }
    return hook_index(symbol);
}

static void *hook_for(void *p, const char *symbol, int cuda_version, cuuint64_t flags) {
    if (!p)
        return p;
    for (int i = 0; i < VGPU_HOOK_COUNT; i++)
        if (vgpu_real[i] == p)
            return vgpu_hook_fn[i];
    int i = symbol ? hook_by_name(symbol, cuda_version, flags) : -1;
    return (i >= 0 && vgpu_real[i]) ? vgpu_hook_fn[i] : p;
}

VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    vgpu_ensure_init();
    if (!HAVE_REAL(cuGetProcAddress))
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn)
        *pfn = hook_for(*pfn, symbol, cudaVersion, flags);
    return rc;
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus) {
    vgpu_ensure_init();
    if (!HAVE_REAL(cuGetProcAddress_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn)
        *pfn = hook_for(*pfn, symbol, cudaVersion, flags);
    return rc;
}
