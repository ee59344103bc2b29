/*
 * Limits come from HAMi's environment variables and from a read-only limits file with the same keys
 * (KEY=VALUE per line). The file wins: when it sets a key, the environment's value for that key is
 * ignored, and when it sets any memory (or SM) limit, every memory (or SM) key of the environment is
 * ignored, so neither a scrubbed nor an extended environment can loosen what the file says. The keys
 * that decide how the SM limit and the monitor's blocking apply (GPU_CORE_UTILIZATION_POLICY) and who is
 * blocked (CUDA_TASK_PRIORITY) are pinned: when a file exists, the environment never sets them, and the
 * file's silence means the default. So is VGPU_CONTEXT_MEMORY, whose "ignore" would hand a container
 * the memory its contexts hold on top of its limit. A file that exists but cannot be read, or gives a memory limit that
 * is not a size, grants no GPU memory: a broken file must never read as "no limit".
 * Other garbage values are reported once (config is loaded once per process) and treated as if the key
 * were absent; README.md documents the resulting fallbacks.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config.h"

#ifndef VGPU_LIMITS_FILE
#define VGPU_LIMITS_FILE "/etc/vgpu/limits"
#endif
#define DEFAULT_CACHE_PATH "/tmp/cudevshr.cache"
#define MEM_KEY "CUDA_DEVICE_MEMORY_LIMIT"
#define SM_KEY "CUDA_DEVICE_SM_LIMIT"

enum { MAX_FILE_KEYS = 64, MAX_LINE = 600 };
/* The limit of a device the file failed to describe: one byte, which no real allocation fits in (0 would
 * mean "unlimited"). Recorded in the shared cache too, so the container's other processes enforce it. */
#define NO_MEMORY ((uint64_t)1)

struct file_entry {
    char key[64];
    char value[MAX_LINE];
};

struct settings {
    struct file_entry entries[MAX_FILE_KEYS];
    int count;
    bool file_present;  /* a limits file exists (read or not): the environment no longer sets pinned keys */
    bool file_broken;   /* it exists but could not be read: no GPU memory */
    bool file_has_mem, file_has_sm;
};

struct vgpu_config vgpu_config;

static char *trim(char *s) {
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* The path is fixed at build time. VGPU_LIMITS_FILE in the environment is honoured only when that
 * file does not exist (tests, hosts without the allocator), so it cannot be used to dodge the file.
 * Any other failure (a parent folder made unsearchable) counts as a file that exists: reading it will
 * fail, and that fails closed. */
static const char *limits_file_path(void) {
    if (access(VGPU_LIMITS_FILE, F_OK) == 0 || errno != ENOENT)
        return VGPU_LIMITS_FILE;
    const char *env = getenv("VGPU_LIMITS_FILE");
    return (env && *env) ? env : NULL;
}

static void add_entry(struct settings *st, const char *key, const char *value, const char *path, int lineno) {
    if (st->count == MAX_FILE_KEYS) {
        vgpu_log(VGPU_LOG_WARN, "%s:%d: more than %d keys, ignoring the rest", path, lineno, MAX_FILE_KEYS);
        return;
    }
    struct file_entry *e = &st->entries[st->count++];
    snprintf(e->key, sizeof e->key, "%s", key);
    snprintf(e->value, sizeof e->value, "%s", value);
    st->file_has_mem |= strncmp(key, MEM_KEY, strlen(MEM_KEY)) == 0;
    st->file_has_sm |= strncmp(key, SM_KEY, strlen(SM_KEY)) == 0;
}

static void file_unreadable(struct settings *st, const char *path, int err) {
    st->file_broken = true;
    st->count = 0; /* half a file is no file: nothing it said so far is trusted either */
    st->file_has_mem = st->file_has_sm = false;
    vgpu_log(VGPU_LOG_ERROR, "limits file %s exists but cannot be read (%s): no GPU memory is granted", path,
             strerror(err));
}

static void load_file(struct settings *st) {
    const char *path = limits_file_path();
    if (!path)
        return;
    FILE *f = fopen(path, "re");
    if (!f && errno == ENOENT)
        return; /* no file: the environment alone */
    st->file_present = true;
    if (!f) {
        file_unreadable(st, path, errno);
        return;
    }
    char line[MAX_LINE];
    int lineno = 0;
    while (errno = 0, fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq || eq == s || (size_t)(eq - s) >= sizeof st->entries[0].key) {
            vgpu_log(VGPU_LOG_WARN, "%s:%d: not a KEY=VALUE line, ignored", path, lineno);
            continue;
        }
        *eq = '\0';
        add_entry(st, trim(s), trim(eq + 1), path, lineno);
    }
    if (ferror(f)) /* e.g. EISDIR: a directory opens, but does not read */
        file_unreadable(st, path, errno ? errno : EIO);
    fclose(f);
}

static const char *from_file(const struct settings *st, const char *key) {
    for (int i = st->count - 1; i >= 0; i--) /* the last occurrence wins */
        if (strcmp(st->entries[i].key, key) == 0)
            return st->entries[i].value;
    return NULL;
}

/* The file's value of key; the environment's only where env_may_set (the file is silent on the key's
 * whole family, or, for a pinned key, no file exists). */
static const char *setting(const struct settings *st, const char *key, bool env_may_set) {
    const char *v = from_file(st, key);
    if (v || !env_may_set)
        return v;
    return getenv(key);
}

/* Decimal digits with one optional k/m/g suffix (powers of 1024). Rejects signs, fractions, hex,
 * trailing text and anything that overflows 64 bits. */
bool vgpu_parse_size(const char *text, uint64_t *out) {
    const char *p = text;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p))
        return false;
    uint64_t v = 0;
    for (; isdigit((unsigned char)*p); p++) {
        if (__builtin_mul_overflow(v, 10u, &v) || __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
            return false;
    }
    unsigned shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    default: break;
    }
    while (isspace((unsigned char)*p))
        p++;
    if (*p != '\0')
        return false;
    if (shift && v > (UINT64_MAX >> shift))
        return false;
    *out = v << shift;
    return true;
}

static bool parse_int(const char *text, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || errno == ERANGE || v < lo || v > hi)
        return false;
    while (isspace((unsigned char)*end))
        end++;
    if (*end != '\0')
        return false;
    *out = v;
    return true;
}

/* A size from the file or the environment. Garbage from the environment is ignored (as if absent);
 * garbage from the file is the file's own limit gone unreadable, so it becomes NO_MEMORY. */
static bool size_setting(const struct settings *st, const char *key, uint64_t *out) {
    const char *v = setting(st, key, !st->file_has_mem);
    if (!v || !*v)
        return false;
    if (vgpu_parse_size(v, out))
        return true;
    if (from_file(st, key) == v) {
        vgpu_log(VGPU_LOG_ERROR, "limits file: %s=\"%s\" is not a size: no GPU memory is granted", key, v);
        *out = NO_MEMORY;
        return true;
    }
    vgpu_log(VGPU_LOG_WARN, "ignoring %s=\"%s\": not a size (digits with optional k/m/g)", key, v);
    return false;
}

static void load_memory_limits(const struct settings *st, struct vgpu_config *cfg) {
    if (st->file_broken) {
        for (int i = 0; i < VGPU_MAX_DEVICES; i++)
            cfg->mem_limit[i] = NO_MEMORY;
        return;
    }
    uint64_t global = 0;
    if (!size_setting(st, MEM_KEY, &global))
        global = 0; /* absent or garbage: no limit unless a per-device key says otherwise */
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        char key[64];
        snprintf(key, sizeof key, MEM_KEY "_%d", i);
        uint64_t v;
        cfg->mem_limit[i] = size_setting(st, key, &v) ? v : global;
    }
}

static bool sm_setting(const struct settings *st, const char *key, uint64_t *out) {
    const char *v = setting(st, key, !st->file_has_sm);
    if (!v || !*v)
        return false;
    long pct;
    if (!parse_int(v, 0, LONG_MAX, &pct)) {
        vgpu_log(VGPU_LOG_WARN, "ignoring %s=\"%s\": not a percentage", key, v);
        return false;
    }
    if (pct > 100)
        vgpu_log(VGPU_LOG_WARN, "%s=%ld is above 100; using 100 (no SM limit)", key, pct);
    *out = (pct == 0 || pct > 100) ? 100 : (uint64_t)pct; /* 0 means "not set" in HAMi */
    return true;
}

static void load_sm_limits(const struct settings *st, struct vgpu_config *cfg) {
    uint64_t global = 100;
    if (!sm_setting(st, SM_KEY, &global))
        global = 100;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        char key[64];
        snprintf(key, sizeof key, SM_KEY "_%d", i);
        uint64_t v;
        cfg->sm_limit[i] = sm_setting(st, key, &v) ? v : global;
    }
}

static void load_misc(const struct settings *st, struct vgpu_config *cfg) {
    /* Pinned: a tenant who could pick its own priority would block every other container on its GPUs,
     * and one who could pick "disable" would run past its SM limit and ignore the monitor's blocking. */
    const char *v = setting(st, "CUDA_TASK_PRIORITY", !st->file_present);
    long prio = 1;
    if (v && *v && !parse_int(v, INT_MIN, INT_MAX, &prio)) {
        vgpu_log(VGPU_LOG_WARN, "ignoring CUDA_TASK_PRIORITY=\"%s\": not an integer; using 1", v);
        prio = 1;
    }
    cfg->priority = (int)prio;

    v = setting(st, "GPU_CORE_UTILIZATION_POLICY", !st->file_present);
    cfg->policy = VGPU_POLICY_DEFAULT;
    if (v && strcasecmp(v, "force") == 0)
        cfg->policy = VGPU_POLICY_FORCE;
    else if (v && strcasecmp(v, "disable") == 0)
        cfg->policy = VGPU_POLICY_DISABLE;
    else if (v && *v && strcasecmp(v, "default") != 0)
        vgpu_log(VGPU_LOG_WARN, "ignoring GPU_CORE_UTILIZATION_POLICY=\"%s\"; using default", v);

    /* Pinned: "ignore" widens the slice by what the driver holds for the container's contexts. */
    v = setting(st, "VGPU_CONTEXT_MEMORY", !st->file_present);
    cfg->context_memory = VGPU_CONTEXT_CHARGE;
    if (v && strcasecmp(v, "ignore") == 0)
        cfg->context_memory = VGPU_CONTEXT_IGNORE;
    else if (v && *v && strcasecmp(v, "charge") != 0)
        vgpu_log(VGPU_LOG_WARN, "ignoring VGPU_CONTEXT_MEMORY=\"%s\": expected charge or ignore; using charge", v);

    v = setting(st, "CUDA_DEVICE_MEMORY_SHARED_CACHE", true);
    if (v && *v && strlen(v) < sizeof cfg->cache_path)
        snprintf(cfg->cache_path, sizeof cfg->cache_path, "%s", v);
    else {
        if (v && *v)
            vgpu_log(VGPU_LOG_WARN, "CUDA_DEVICE_MEMORY_SHARED_CACHE is too long; using " DEFAULT_CACHE_PATH);
        snprintf(cfg->cache_path, sizeof cfg->cache_path, "%s", DEFAULT_CACHE_PATH);
    }
}

static void load_log_level(const struct settings *st) {
    const char *v = setting(st, "LIBCUDA_LOG_LEVEL", true);
    long level;
    if (!v || !*v)
        return;
    if (parse_int(v, 0, 4, &level))
        vgpu_log_level = (int)level;
    else
        vgpu_log(VGPU_LOG_WARN, "ignoring LIBCUDA_LOG_LEVEL=\"%s\": expected 0..4; using 2", v);
}

void vgpu_config_load(struct vgpu_config *cfg) {
    /* ~40 KiB: static rather than on the stack of whatever application thread got here first. */
    static struct settings st;
    memset(&st, 0, sizeof st);
    load_file(&st);
    load_log_level(&st);
    load_memory_limits(&st, cfg);
    load_sm_limits(&st, cfg);
    load_misc(&st, cfg);
}
