/*
 * Which device allocation (pointer, VMM handle or array) holds how many bytes on which device, so a
 * free can un-account exactly what was accounted. Sharded open-addressing tables: one mutex per shard,
 * never a lock over the whole process, so allocating threads rarely meet.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "memory.h"

enum { SHARDS = 64, FIRST_CAPACITY = 16 };

struct entry {
    uint64_t key; /* 0 = empty; TOMBSTONE = deleted */
    uint64_t bytes;
    int dev;
};

struct shard {
    pthread_mutex_t mu;
    struct entry *slots;
    size_t capacity, used; /* used counts live entries and tombstones */
} __attribute__((aligned(64)));

static const uint64_t TOMBSTONE = UINT64_MAX;
static struct shard tables[VGPU_TABLE_COUNT][SHARDS];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void init_tables(void) {
    for (int k = 0; k < VGPU_TABLE_COUNT; k++)
        for (int i = 0; i < SHARDS; i++)
            pthread_mutex_init(&tables[k][i].mu, NULL);
}

static uint64_t mix(uint64_t x) { /* splitmix64 finaliser: device pointers share their low bits */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static struct shard *shard_of(enum vgpu_table_kind kind, uint64_t h) {
    pthread_once(&tables_once, init_tables);
    return &tables[kind][h % SHARDS];
}

static struct entry *find(struct shard *sh, uint64_t key, uint64_t h) {
    for (size_t i = 0, pos = (h / SHARDS) & (sh->capacity - 1); i < sh->capacity;
         i++, pos = (pos + 1) & (sh->capacity - 1)) {
        if (sh->slots[pos].key == key)
            return &sh->slots[pos];
        if (sh->slots[pos].key == 0)
            return NULL;
    }
    return NULL;
}

static void insert_fresh(struct entry *slots, size_t capacity, const struct entry *e) {
    size_t pos = (mix(e->key) / SHARDS) & (capacity - 1);
    while (slots[pos].key != 0)
        pos = (pos + 1) & (capacity - 1);
    slots[pos] = *e;
}

/* Rehash, dropping tombstones; the capacity only doubles when live entries need it, so alloc/free churn
 * does not grow the table. */
static bool rehash(struct shard *sh) {
    size_t live = 0;
    for (size_t i = 0; i < sh->capacity; i++)
        live += sh->slots[i].key != 0 && sh->slots[i].key != TOMBSTONE;
    size_t cap = sh->capacity ? sh->capacity : FIRST_CAPACITY;
    while ((live + 1) * 4 > cap)
        cap *= 2;
    struct entry *fresh = calloc(cap, sizeof *fresh);
    if (!fresh)
        return false;
    for (size_t i = 0; i < sh->capacity; i++)
        if (sh->slots[i].key != 0 && sh->slots[i].key != TOMBSTONE)
            insert_fresh(fresh, cap, &sh->slots[i]);
    free(sh->slots);
    sh->slots = fresh;
    sh->capacity = cap;
    sh->used = live;
    return true;
}

bool vgpu_table_put(enum vgpu_table_kind kind, uint64_t key, uint64_t bytes, int dev) {
    if (key == 0 || key == TOMBSTONE)
        return false;
    uint64_t h = mix(key);
    struct shard *sh = shard_of(kind, h);
    pthread_mutex_lock(&sh->mu);
    bool ok = true;
    struct entry *e = sh->capacity ? find(sh, key, h) : NULL;
    if (e) { /* the driver reused an address we never saw freed: keep the newest record */
        e->bytes = bytes;
        e->dev = dev;
    } else if ((sh->used + 1) * 2 <= sh->capacity || (ok = rehash(sh))) {
        insert_fresh(sh->slots, sh->capacity, &(struct entry){.key = key, .bytes = bytes, .dev = dev});
        sh->used++;
    }
    pthread_mutex_unlock(&sh->mu);
    return ok;
}

bool vgpu_table_take(enum vgpu_table_kind kind, uint64_t key, uint64_t *bytes, int *dev) {
    if (key == 0 || key == TOMBSTONE)
        return false;
    uint64_t h = mix(key);
    struct shard *sh = shard_of(kind, h);
    pthread_mutex_lock(&sh->mu);
    struct entry *e = sh->capacity ? find(sh, key, h) : NULL;
    if (e) {
        *bytes = e->bytes;
        *dev = e->dev;
        e->key = TOMBSTONE;
    }
    pthread_mutex_unlock(&sh->mu);
    return e != NULL;
}

/* Fork: hold every shard across fork() so the child's copies are consistent; the child then forgets
 * the parent's allocations, which are not its own. */
void vgpu_table_before_fork(void) {
    pthread_once(&tables_once, init_tables);
    for (int k = 0; k < VGPU_TABLE_COUNT; k++)
        for (int i = 0; i < SHARDS; i++)
            pthread_mutex_lock(&tables[k][i].mu);
}

void vgpu_table_after_fork(bool child) {
    for (int k = 0; k < VGPU_TABLE_COUNT; k++) {
        for (int i = 0; i < SHARDS; i++) {
            struct shard *sh = &tables[k][i];
            if (child) {
                free(sh->slots);
                sh->slots = NULL;
                sh->capacity = sh->used = 0;
            }
            pthread_mutex_unlock(&sh->mu);
        }
    }
}
