/*
 * Micro-benchmark for benchmarks/vgpu_overhead.py: run with and without LD_PRELOAD=libvgpu.so over the
 * stub driver. Modes:
 *   alloc <n>   ns per cuMemAlloc_v2 + cuMemFree_v2 pair (median of 5 rounds of n)
 *   launch <n>  ns per cuLaunchKernel (median of 5 rounds of n)
 *   first <n>   ns per cuLaunchKernel over the process's first n launches (one round: with an SM limit set,
 *               the limiter's slow start)
 *   init        ms from cuInit to the first successful cuMemAlloc_v2, measured in this process
 *   init wait   the same, after printing "ready" and waiting for stdin to close: a parent releases many
 *               processes at once (a crowded start) by closing the one pipe they all read
 * init prints "<ms> <voluntary> <involuntary>": the context switches of the measured span. Voluntary ones
 * are waits (a lock, I/O); involuntary ones are the scheduler giving the CPU to another task, which on a
 * crowded machine is where a slow start's time goes when there are no waits.
 */
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vgpu_cuda.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void setup(void) {
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "driver init failed\n");
        exit(1);
    }
}

static double round_alloc(long n) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 4096) || cuMemFree_v2(p))
            exit(1);
    }
    return (now_ns() - t0) / (double)n;
}

static double round_launch(long n) {
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        if (cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL))
            exit(1);
    return (now_ns() - t0) / (double)n;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "init") == 0) {
        if (argc >= 3 && strcmp(argv[2], "wait") == 0) {
            char buf[64];
            printf("ready\n");
            fflush(stdout);
            while (fread(buf, 1, sizeof buf, stdin) > 0) {
            }
        }
        struct rusage r0, r1;
        getrusage(RUSAGE_THREAD, &r0);
        double t0 = now_ns();
        setup();
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 1 << 20))
            return 1;
        double ms = (now_ns() - t0) / 1e6;
        getrusage(RUSAGE_THREAD, &r1);
        printf("%.4f %ld %ld\n", ms, r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw);
        return 0;
    }
    if (argc < 3)
        return 2;
    long n = atol(argv[2]);
    setup();
    if (strcmp(argv[1], "first") == 0) {
        printf("%.2f\n", round_launch(n));
        return 0;
    }
    double r[5];
    for (int k = 0; k < 5; k++)
        r[k] = strcmp(argv[1], "alloc") == 0 ? round_alloc(n) : round_launch(n);
    qsort(r, 5, sizeof r[0], cmp);
    printf("%.2f\n", r[2]);
    return 0;
}
