/*
 * Layer 1, config: the settings a process runs under (limits.c) and its log (log.c). The bottom layer: it
 * includes no other header of src/. The layers, bottom to top, are config, driver, shared cache, memory,
 * throttle, hooks and init (README.md); tests/native/test_layers.py checks that no file includes a header
 * of a layer above its own. Every non-static symbol starts with vgpu_.
 */
#ifndef VGPU_CONFIG_H
#define VGPU_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#define VGPU_LIKELY(x) __builtin_expect(!!(x), 1)
#define VGPU_UNLIKELY(x) __builtin_expect(!!(x), 0)

enum { VGPU_MAX_DEVICES = 16 };

/* ---- log.c ---- */
enum { VGPU_LOG_ERROR = 0, VGPU_LOG_WARN = 2, VGPU_LOG_INFO = 3, VGPU_LOG_DEBUG = 4 };
extern int vgpu_log_level;
void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- limits.c ---- */
enum vgpu_policy { VGPU_POLICY_DEFAULT = 0, VGPU_POLICY_FORCE = 1, VGPU_POLICY_DISABLE = 2 };
/* VGPU_CONTEXT_MEMORY: charge what the driver holds for each context (HAMi-core, the default) or not. */
enum vgpu_context_memory { VGPU_CONTEXT_CHARGE = 0, VGPU_CONTEXT_IGNORE = 1 };
struct vgpu_config {
    uint64_t mem_limit[VGPU_MAX_DEVICES]; /* bytes, 0 = unlimited */
    uint64_t sm_limit[VGPU_MAX_DEVICES];  /* percent 1..100, 100 = no throttling */
    int priority;
    enum vgpu_policy policy;
    enum vgpu_context_memory context_memory;
    char cache_path[512];
};
extern struct vgpu_config vgpu_config;
void vgpu_config_load(struct vgpu_config *cfg);
bool vgpu_parse_size(const char *text, uint64_t *out);

#endif
