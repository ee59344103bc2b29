/*
 * A scriptable CUDA/NVML client for the pytest suite: each argument is one command, each command prints
 * one line of key=value pairs. Driver functions are reached through the path chosen by --via:
 *   direct   - linked symbols (what LD_PRELOAD interposes)
 *   dlsym    - dlsym(dlopen("libcuda.so.1"), "<versioned name>")
 *   procaddr - cuGetProcAddress_v2("<base name>", ..., --cuda-version, --ptsz)
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_cuda.h"
#include "vgpu_nvml.h"

enum via { VIA_DIRECT, VIA_DLSYM, VIA_PROCADDR };
static enum via via = VIA_DIRECT;
static int cuda_version = 12000;
static cuuint64_t proc_flags = 0;
static void *libcuda;

struct fns {
    __typeof__(&cuMemAlloc_v2) alloc;
    __typeof__(&cuMemFree_v2) free;
    __typeof__(&cuMemAllocPitch_v2) pitch;
    __typeof__(&cuMemAllocManaged) managed;
    __typeof__(&cuMemAllocAsync) alloc_async;
    __typeof__(&cuMemAllocFromPoolAsync) alloc_pool;
    __typeof__(&cuMemFreeAsync) free_async;
    __typeof__(&cuMemCreate) create;
    __typeof__(&cuMemRelease) release;
    __typeof__(&cuArrayCreate_v2) array;
    __typeof__(&cuArray3DCreate_v2) array3d;
    __typeof__(&cuArrayDestroy) array_destroy;
    __typeof__(&cuMipmappedArrayCreate) mipmap;
    __typeof__(&cuMipmappedArrayDestroy) mipmap_destroy;
    __typeof__(&cuMemGetInfo_v2) meminfo;
    __typeof__(&cuDeviceTotalMem_v2) totalmem;
    __typeof__(&cuLaunchKernel) launch;
    __typeof__(&cuLaunchKernelEx) launch_ex;
    __typeof__(&cuLaunchCooperativeKernel) launch_coop;
    __typeof__(&cuLaunchCooperativeKernelMultiDevice) launch_multi;
    __typeof__(&cuGraphLaunch) graph;
    __typeof__(&nvmlDeviceGetMemoryInfo) nvml_mem;
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) nvml_mem2;
    __typeof__(&cuCtxCreate_v2) ctx_create;
    __typeof__(&cuCtxDestroy_v2) ctx_destroy;
    __typeof__(&cuDevicePrimaryCtxRetain) retain;
    __typeof__(&cuDevicePrimaryCtxRelease_v2) release_primary;
};
static struct fns fn;

static void *resolve(const char *versioned, const char *base, void *direct) {
    if (via == VIA_DIRECT)
        return direct;
    if (via == VIA_DLSYM || strncmp(versioned, "nvml", 4) == 0)
        return dlsym(libcuda, versioned);
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (cuGetProcAddress_v2(base, &p, cuda_version, proc_flags, &st) != CUDA_SUCCESS)
        return NULL;
    return p;
}

#define R(field, versioned, base) fn.field = (__typeof__(fn.field))resolve(#versioned, base, (void *)&versioned)
static void resolve_all(void) {
    libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    R(alloc, cuMemAlloc_v2, "cuMemAlloc");
    R(free, cuMemFree_v2, "cuMemFree");
    R(pitch, cuMemAllocPitch_v2, "cuMemAllocPitch");
    R(managed, cuMemAllocManaged, "cuMemAllocManaged");
    R(alloc_async, cuMemAllocAsync, "cuMemAllocAsync");
    R(alloc_pool, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
    R(free_async, cuMemFreeAsync, "cuMemFreeAsync");
    R(create, cuMemCreate, "cuMemCreate");
    R(release, cuMemRelease, "cuMemRelease");
    R(array, cuArrayCreate_v2, "cuArrayCreate");
    R(array3d, cuArray3DCreate_v2, "cuArray3DCreate");
    R(array_destroy, cuArrayDestroy, "cuArrayDestroy");
    R(mipmap, cuMipmappedArrayCreate, "cuMipmappedArrayCreate");
    R(mipmap_destroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy");
    R(meminfo, cuMemGetInfo_v2, "cuMemGetInfo");
    R(totalmem, cuDeviceTotalMem_v2, "cuDeviceTotalMem");
    R(launch, cuLaunchKernel, "cuLaunchKernel");
    R(launch_ex, cuLaunchKernelEx, "cuLaunchKernelEx");
    R(launch_coop, cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel");
    R(launch_multi, cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice");
    R(graph, cuGraphLaunch, "cuGraphLaunch");
    R(nvml_mem, nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo");
    R(nvml_mem2, nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2");
    R(ctx_create, cuCtxCreate_v2, "cuCtxCreate");
    R(ctx_destroy, cuCtxDestroy_v2, "cuCtxDestroy");
    R(retain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    R(release_primary, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease");
}

enum kind { K_PTR, K_ASYNC, K_VMM, K_ARRAY, K_MIPMAP };
struct held {
    enum kind kind;
    uint64_t key;
};
static struct held stack[4096];
static int depth;

static uint64_t size_arg(const char *s) {
    char *end;
    uint64_t n = strtoull(s, &end, 10);
    switch (*end) {
    case 'k': return n << 10;
    case 'm': return n << 20;
    case 'g': return n << 30;
    default: return n;
    }
}

static void push(enum kind k, uint64_t key) {
    if (depth < 4096)
        stack[depth++] = (struct held){k, key};
}

static CUresult free_top(void) {
    if (depth == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct held h = stack[--depth];
    switch (h.kind) {
    case K_PTR: return fn.free(h.key);
    case K_ASYNC: return fn.free_async(h.key, NULL);
    case K_VMM: return fn.release(h.key);
    case K_ARRAY: return fn.array_destroy((CUarray)(uintptr_t)h.key);
    default: return fn.mipmap_destroy((CUmipmappedArray)(uintptr_t)h.key);
    }
}

static const char *object_of(void *p, const char **sym) {
    Dl_info info;
    *sym = "?";
    if (!p || !dladdr(p, &info) || !info.dli_fname)
        return "none";
    if (info.dli_sname)
        *sym = info.dli_sname;
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

static void set_device(int dev) {
    CUcontext ctx;
    CUresult rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc == CUDA_SUCCESS)
        rc = cuCtxSetCurrent(ctx);
    printf("device rc=%d dev=%d\n", rc, dev);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static CUresult launch_kind(const char *kind, unsigned grid) {
    if (strcmp(kind, "ex") == 0) {
        CUlaunchConfig c = {.gridDimX = grid, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128, .blockDimY = 1,
                            .blockDimZ = 1};
        return fn.launch_ex(&c, NULL, NULL, NULL);
    }
    if (strcmp(kind, "coop") == 0)
        return fn.launch_coop(NULL, grid, 1, 1, 128, 1, 1, 0, NULL, NULL);
    if (strcmp(kind, "multi") == 0) {
        CUDA_LAUNCH_PARAMS p = {.gridDimX = grid, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 128, .blockDimY = 1,
                                .blockDimZ = 1};
        return fn.launch_multi(&p, 1, 0);
    }
    if (strcmp(kind, "graph") == 0) /* the stub runs a graph whose handle is its block count */
        return fn.graph((CUgraphExec)(uintptr_t)grid, NULL);
    return fn.launch(NULL, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
}

static volatile sig_atomic_t usr2_caught;
static void on_usr2(int sig) {
    (void)sig;
    usr2_caught++;
}

static void nvml_mem(int v2, unsigned idx) {
    nvmlDevice_t h;
    nvmlReturn_t rc = nvmlInit_v2();
    if (rc == NVML_SUCCESS)
        rc = nvmlDeviceGetHandleByIndex_v2(idx, &h);
    unsigned long long total = 0, used = 0, free = 0;
    if (rc == NVML_SUCCESS && v2) {
        nvmlMemory_v2_t m = {.version = (unsigned)sizeof(nvmlMemory_v2_t) | (2u << 24)};
        rc = fn.nvml_mem2(h, &m);
        total = m.total, used = m.used, free = m.free;
    } else if (rc == NVML_SUCCESS) {
        nvmlMemory_t m;
        rc = fn.nvml_mem(h, &m);
        total = m.total, used = m.used, free = m.free;
    }
    printf("nvmlmem rc=%d total=%llu used=%llu free=%llu\n", rc, total, used, free);
}

/* Contexts made by ctx/ctx3/ctx4/ctxmany, destroyed last-first by ctxdestroy. */
static CUcontext contexts[1024];
static int n_contexts;

static CUresult create_context(const char *kind, int dev) {
    CUcontext c = NULL;
    CUresult rc;
    if (strcmp(kind, "ctx3") == 0)
        rc = cuCtxCreate_v3(&c, NULL, 0, 0, dev);
    else if (strcmp(kind, "ctx4") == 0)
        rc = cuCtxCreate_v4(&c, NULL, 0, dev);
    else
        rc = fn.ctx_create(&c, 0, dev);
    if (rc == CUDA_SUCCESS && n_contexts < 1024)
        contexts[n_contexts++] = c;
    return rc;
}

/* procmem[:v1|v2|v3] - NVML's memory for this process on device 0 (0 when it is not listed) */
static void process_memory(const char *version) {
    nvmlDevice_t h;
    nvmlReturn_t rc = nvmlInit_v2();
    if (rc == NVML_SUCCESS)
        rc = nvmlDeviceGetHandleByIndex_v2(0, &h);
    unsigned count = 8;
    unsigned long long bytes = 0;
    if (rc == NVML_SUCCESS && version && strcmp(version, "v1") != 0) {
        nvmlProcessInfo_v2_t infos[8];
        rc = strcmp(version, "v2") == 0 ? nvmlDeviceGetComputeRunningProcesses_v2(h, &count, infos)
                                        : nvmlDeviceGetComputeRunningProcesses_v3(h, &count, infos);
        for (unsigned i = 0; rc == NVML_SUCCESS && i < count; i++)
            bytes += infos[i].usedGpuMemory;
    } else if (rc == NVML_SUCCESS) {
        nvmlProcessInfo_v1_t infos[8];
        rc = nvmlDeviceGetComputeRunningProcesses(h, &count, infos);
        for (unsigned i = 0; rc == NVML_SUCCESS && i < count; i++)
            bytes += infos[i].usedGpuMemory;
    }
    printf("procmem rc=%d count=%u bytes=%llu\n", rc, rc == NVML_SUCCESS ? count : 0, bytes);
}

/* This process's slot's hostpid in the shared-cache file, read at the spec's offsets (vgpu-interposer.md
 * §5.2: procs at 1856, 1960 bytes a slot, pid then hostpid; proc_num at 2008896); -1 if it has no slot. */
static long slot_hostpid(void) {
    enum { PROCS = 1856, SLOT = 1960, PROC_NUM = 2008896 };
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    FILE *f = path ? fopen(path, "rb") : NULL;
    int32_t n = 0, ids[2];
    long found = -1;
    if (f && fseek(f, PROC_NUM, SEEK_SET) == 0 && fread(&n, sizeof n, 1, f) == 1) {
        for (int32_t i = 0; i < n && found < 0; i++)
            if (fseek(f, PROCS + (long)i * SLOT, SEEK_SET) == 0 && fread(ids, sizeof ids, 1, f) == 1 &&
                ids[0] == (int32_t)getpid())
                found = ids[1];
    }
    if (f)
        fclose(f);
    return found;
}

static void launch_windows(char *spec) {
    /* windows:ms:grid[:kind] - launch flat out, report blocks per wall-clock window; over the stub driver
     * also the device time its utilisation model completed in the window (busy_us) and the window's
     * length (wall_us), measured back to back so that no time falls between windows */
    int windows = atoi(strtok(spec, ":"));
    double ms = atof(strtok(NULL, ":"));
    unsigned grid = (unsigned)atoi(strtok(NULL, ":"));
    char *kind = strtok(NULL, ":");
    uint64_t (*busy_ns)(int) = (uint64_t(*)(int))dlsym(libcuda, "stub_busy_ns");
    double start = now_ms();
    uint64_t busy = busy_ns ? busy_ns(0) : 0;
    for (int w = 0; w < windows; w++) {
        double end = start + ms;
        uint64_t blocks = 0;
        while (now_ms() < end) {
            if (launch_kind(kind ? kind : "plain", grid) != CUDA_SUCCESS) {
                printf("window i=%d error=1\n", w);
                return;
            }
            blocks += grid;
        }
        double t = now_ms();
        if (busy_ns) {
            uint64_t b = busy_ns(0);
            printf("window i=%d blocks=%" PRIu64 " busy_us=%" PRIu64 " wall_us=%" PRIu64 "\n", w, blocks,
                   (b - busy) / 1000, (uint64_t)((t - start) * 1e3));
            busy = b;
        } else {
            printf("window i=%d blocks=%" PRIu64 "\n", w, blocks);
        }
        start = t;
    }
}

static void run(char *cmd) {
    char *arg = strchr(cmd, ':');
    if (arg)
        *arg++ = '\0';
    CUresult rc;
    uint64_t key = 0;
    if (strcmp(cmd, "cuinit") == 0) { /* cuInit alone: no context */
        printf("cuinit rc=%d\n", cuInit(0));
    } else if (strcmp(cmd, "hostpid") == 0) { /* what the slot holds at this moment */
        printf("hostpid pid=%d hostpid=%ld\n", (int)getpid(), slot_hostpid());
    } else if (strcmp(cmd, "init") == 0) {
        rc = cuInit(0);
        printf("init rc=%d\n", rc);
        if (rc == CUDA_SUCCESS)
            set_device(0);
    } else if (strcmp(cmd, "device") == 0) {
        set_device(atoi(arg));
    } else if (strcmp(cmd, "alloc") == 0 || strcmp(cmd, "managed") == 0 || strcmp(cmd, "async") == 0 ||
               strcmp(cmd, "pool") == 0) {
        unsigned long long p = 0;
        uint64_t n = size_arg(arg);
        if (cmd[0] == 'a' && cmd[1] == 'l')
            rc = fn.alloc(&p, n);
        else if (cmd[0] == 'm')
            rc = fn.managed(&p, n, 1);
        else if (cmd[0] == 'a')
            rc = fn.alloc_async(&p, n, NULL);
        else
            rc = fn.alloc_pool(&p, n, NULL, NULL);
        if (rc == CUDA_SUCCESS)
            push(cmd[0] == 'a' && cmd[1] == 's' ? K_ASYNC : K_PTR, p);
        printf("%s rc=%d bytes=%" PRIu64 "\n", cmd, rc, n);
    } else if (strcmp(cmd, "pitch") == 0) {
        unsigned long long p = 0;
        size_t pitch = 0, w = (size_t)strtoull(arg, &arg, 10), h = (size_t)strtoull(arg + 1, NULL, 10);
        rc = fn.pitch(&p, &pitch, w, h, 4);
        if (rc == CUDA_SUCCESS)
            push(K_PTR, p);
        printf("pitch rc=%d pitch=%zu\n", rc, pitch);
    } else if (strcmp(cmd, "vmm") == 0) {
        CUmemAllocationProp prop = {.type = 1, .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        unsigned long long h = 0;
        rc = fn.create(&h, (size_t)size_arg(arg), &prop, 0);
        if (rc == CUDA_SUCCESS)
            push(K_VMM, h);
        printf("vmm rc=%d\n", rc);
    } else if (strcmp(cmd, "array") == 0 || strcmp(cmd, "array3d") == 0 || strcmp(cmd, "mipmap") == 0) {
        size_t w = (size_t)strtoull(arg, &arg, 10), h = (size_t)strtoull(arg + 1, &arg, 10), d = 0;
        if (*arg == 'x')
            d = (size_t)strtoull(arg + 1, &arg, 10);
        CUarray a = NULL;
        CUmipmappedArray m = NULL;
        CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = w, .Height = h, .Depth = d, .Format = CU_AD_FORMAT_FLOAT,
                                      .NumChannels = 1};
        if (cmd[0] == 'm') {
            rc = fn.mipmap(&m, &d3, 1);
            key = (uint64_t)(uintptr_t)m;
        } else if (strcmp(cmd, "array3d") == 0) {
            rc = fn.array3d(&a, &d3);
            key = (uint64_t)(uintptr_t)a;
        } else {
            CUDA_ARRAY_DESCRIPTOR d2 = {.Width = w, .Height = h, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
            rc = fn.array(&a, &d2);
            key = (uint64_t)(uintptr_t)a;
        }
        if (rc == CUDA_SUCCESS)
            push(cmd[0] == 'm' ? K_MIPMAP : K_ARRAY, key);
        printf("%s rc=%d\n", cmd, rc);
    } else if (strcmp(cmd, "free") == 0) {
        printf("free rc=%d\n", free_top());
    } else if (strcmp(cmd, "freeall") == 0) {
        rc = CUDA_SUCCESS;
        while (depth > 0 && rc == CUDA_SUCCESS)
            rc = free_top();
        printf("freeall rc=%d\n", rc);
    } else if (strcmp(cmd, "meminfo") == 0) {
        size_t f = 0, t = 0;
        rc = fn.meminfo(&f, &t);
        printf("meminfo rc=%d free=%zu total=%zu\n", rc, f, t);
    } else if (strcmp(cmd, "meminfo-null") == 0) {
        printf("meminfo-null rc=%d\n", fn.meminfo(NULL, NULL));
    } else if (strcmp(cmd, "totalmem") == 0) {
        size_t b = 0;
        rc = fn.totalmem(&b, 0);
        printf("totalmem rc=%d bytes=%zu\n", rc, b);
    } else if (strcmp(cmd, "nvmlmem") == 0 || strcmp(cmd, "nvmlmem2") == 0) {
        nvml_mem(cmd[7] == '2', arg ? (unsigned)atoi(arg) : 0); /* nvmlmem[:<NVML index>] */
    } else if (strcmp(cmd, "launch") == 0) {
        /* launch:count:grid[:plain|ex|coop|multi|graph] */
        int count = atoi(strtok(arg, ":"));
        unsigned grid = (unsigned)atoi(strtok(NULL, ":"));
        char *kind = strtok(NULL, ":");
        int n = 0;
        rc = CUDA_SUCCESS;
        while (n < count && (rc = launch_kind(kind ? kind : "plain", grid)) == CUDA_SUCCESS)
            n++;
        printf("launch rc=%d n=%d\n", rc, n);
    } else if (strcmp(cmd, "churn") == 0) {
        /* churn:<size>:<ms> - allocate and free <size> over and over for <ms>; count grants and refusals */
        uint64_t n = size_arg(strtok(arg, ":"));
        double end = now_ms() + atof(strtok(NULL, ":"));
        long ok = 0, oom = 0, other = 0;
        while (now_ms() < end) {
            unsigned long long p = 0;
            rc = fn.alloc(&p, n);
            if (rc == CUDA_SUCCESS)
                ok += fn.free(p) == CUDA_SUCCESS;
            else if (rc == CUDA_ERROR_OUT_OF_MEMORY)
                oom++;
            else
                other++;
        }
        printf("churn ok=%ld oom=%ld other=%ld\n", ok, oom, other);
    } else if (strcmp(cmd, "fill") == 0) {
        /* fill:<size> - allocate <size> until refused, keeping everything; report how many were granted */
        uint64_t n = size_arg(arg);
        long granted = 0;
        unsigned long long p = 0;
        while ((rc = fn.alloc(&p, n)) == CUDA_SUCCESS) {
            push(K_PTR, p);
            granted++;
        }
        printf("fill rc=%d granted=%ld\n", rc, granted);
    } else if (strcmp(cmd, "ctx") == 0 || strcmp(cmd, "ctx3") == 0 || strcmp(cmd, "ctx4") == 0) {
        /* ctx:<dev> - cuCtxCreate (through --via), ctx3/ctx4:<dev> - the _v3/_v4 entry points, linked */
        rc = create_context(cmd, arg ? atoi(arg) : 0);
        printf("%s rc=%d\n", cmd, rc);
    } else if (strcmp(cmd, "ctxmany") == 0) {
        /* ctxmany:<dev> - create contexts until one is refused, keeping them all */
        long granted = 0;
        while (n_contexts < 1024 && (rc = create_context("ctx", arg ? atoi(arg) : 0)) == CUDA_SUCCESS)
            granted++;
        printf("ctxmany rc=%d granted=%ld\n", rc, granted);
    } else if (strcmp(cmd, "ctxdestroy") == 0) {
        rc = n_contexts > 0 ? fn.ctx_destroy(contexts[--n_contexts]) : CUDA_ERROR_INVALID_CONTEXT;
        printf("ctxdestroy rc=%d\n", rc);
    } else if (strcmp(cmd, "retain") == 0) {
        CUcontext c = NULL;
        rc = fn.retain(&c, arg ? atoi(arg) : 0);
        printf("retain rc=%d\n", rc);
    } else if (strcmp(cmd, "release") == 0) {
        printf("release rc=%d\n", fn.release_primary(arg ? atoi(arg) : 0));
    } else if (strcmp(cmd, "procmem") == 0) {
        process_memory(arg);
    } else if (strcmp(cmd, "windows") == 0) {
        launch_windows(arg);
    } else if (strcmp(cmd, "wait") == 0) {
        char line[64];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            printf("eof\n");
    } else if (strcmp(cmd, "catch-usr2") == 0) { /* the application's own SIGUSR2 handler */
        struct sigaction sa = {.sa_handler = on_usr2, .sa_flags = SA_RESTART};
        sigemptyset(&sa.sa_mask);
        printf("catch-usr2 rc=%d\n", sigaction(SIGUSR2, &sa, NULL));
    } else if (strcmp(cmd, "caught") == 0) {
        printf("caught rc=0 n=%d\n", (int)usr2_caught);
    } else if (strcmp(cmd, "whois") == 0) {
        const char *sym;
        const char *obj = object_of(dlsym(libcuda, arg), &sym);
        printf("whois name=%s object=%s symbol=%s\n", arg, obj, sym);
    } else if (strcmp(cmd, "next") == 0) {
        void *a = dlsym(RTLD_NEXT, arg), *b = dlsym(RTLD_NEXT, arg);
        const char *sym;
        const char *obj = object_of(a, &sym);
        printf("next name=%s object=%s symbol=%s same=%d\n", arg, obj, sym, a == b && a != NULL);
    } else if (strcmp(cmd, "procaddr") == 0) {
        /* procaddr:name:version:flags */
        char *name = strtok(arg, ":");
        int ver = atoi(strtok(NULL, ":"));
        cuuint64_t flags = (cuuint64_t)atoi(strtok(NULL, ":"));
        void *p = NULL;
        CUdriverProcAddressQueryResult st = -1;
        rc = cuGetProcAddress_v2(name, &p, ver, flags, &st);
        const char *sym;
        const char *obj = object_of(p, &sym);
        printf("procaddr rc=%d status=%d object=%s symbol=%s\n", rc, (int)st, obj, sym);
    } else if (strcmp(cmd, "procaddr1") == 0) {
        char *name = strtok(arg, ":");
        int ver = atoi(strtok(NULL, ":"));
        void *p = NULL;
        rc = cuGetProcAddress(name, &p, ver, 0);
        const char *sym;
        const char *obj = object_of(p, &sym);
        printf("procaddr1 rc=%d object=%s symbol=%s\n", rc, obj, sym);
    } else if (strcmp(cmd, "forkinit") == 0) {
        /* a child calls cuInit and reports its own slot's hostpid at once; the parent reports it */
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            CUresult crc = cuInit(0);
            printf("forkinit rc=%d pid=%d hostpid=%ld\n", crc, (int)getpid(), slot_hostpid());
            fflush(stdout);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
    } else if (strcmp(cmd, "fork") == 0) {
        /* fork:<size> - a child allocates <size> and exits; the parent reports the child's result */
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            unsigned long long p = 0;
            CUresult crc = fn.alloc(&p, size_arg(arg));
            _exit(crc);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("fork child_rc=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    } else {
        printf("unknown command %s\n", cmd);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--via=dlsym") == 0)
            via = VIA_DLSYM;
        else if (strcmp(argv[i], "--via=procaddr") == 0)
            via = VIA_PROCADDR;
        else if (strncmp(argv[i], "--cuda-version=", 15) == 0)
            cuda_version = atoi(argv[i] + 15);
        else if (strcmp(argv[i], "--ptsz") == 0)
            proc_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    }
    resolve_all();
    for (; i < argc; i++)
        run(argv[i]);
    return 0;
}
