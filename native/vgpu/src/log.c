/* One-line log records on stderr, each written with a single write(2) so lines from several processes
 * and threads never interleave. Levels follow HAMi-core's LIBCUDA_LOG_LEVEL: errors always, 2 (default)
 * adds warnings, 3 info, 4 debug. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "config.h"

int vgpu_log_level = VGPU_LOG_WARN;

static const char *level_name(int level) {
    switch (level) {
    case VGPU_LOG_ERROR: return "ERROR";
    case VGPU_LOG_WARN: return "WARN";
    case VGPU_LOG_INFO: return "INFO";
    default: return "DEBUG";
    }
}

void vgpu_log(int level, const char *fmt, ...) {
    if (level > vgpu_log_level && level != VGPU_LOG_ERROR)
        return;
    char line[512];
    int n = snprintf(line, sizeof line, "[vgpu %s pid=%d] ", level_name(level), (int)getpid());
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
}
