/*
 * A fake libnvidia-ml.so.1 for tests and benchmarks on machines without a GPU.
 *
 * It exports the NVML entry points that warden-agent's NVML collector reaches through
 * nvml-wrapper, with the C types and constants of nvml.h that those entry points use
 * (declared here from NVML's documented ABI; only what is implemented).
 *
 * Readings come from a plain-text state file, reloaded whenever it changes (inode,
 * size or mtime; write it to a temporary name and rename it into place). The file is
 * found as:
 *   1. `fake_nvml.state` in the directory this library was loaded from, else
 *   2. the path in the environment variable FAKE_NVML_STATE, else
 *   3. none: 8 GPUs with default readings.
 * Loading copies of the library from different directories gives independent
 * instances (the dynamic loader keys loaded objects by file), one per test.
 *
 * Format: one `key=value` per line, `#` starts a comment, later lines win.
 *   gpus=8                      number of GPUs (at most 64)
 *   init_error=9                nvmlInit returns this nvmlReturn_t (0 = success)
 *   driver_version=550.54.15
 *   delay_ms=0                  every device query sleeps this long (a hung driver)
 *   gpu.<i>.<field>=<value>     one GPU; `gpu.*.<field>` sets all GPUs
 *   event.<id>=gpu:<i>,xid:<n>  a critical XID event, delivered once by
 *                               nvmlEventSetWait_v2 (ids ascending; an id is never
 *                               delivered twice, even after a reload)
 *   event.<id>=gpu:<i>,type:dbe  a double-bit ECC event (also: sbe)
 * A numeric field's value is a number, `na` (the call returns
 * NVML_ERROR_NOT_SUPPORTED) or `err:<code>` (the call returns that nvmlReturn_t).
 * Fields: uuid, name, pci (NVML bus id, e.g. 00000000:3B:00.0; strings), util_gpu,
 * util_mem, mem_total, mem_used, mem_free (default total - used - reserved),
 * mem_reserved, temp, power_mw, sm_clock, mem_clock, throttle, ecc_cor_vol,
 * ecc_unc_vol, ecc_cor_agg, ecc_unc_agg, retired_sbe, retired_dbe, retired_pending,
 * remap_cor, remap_unc, remap_pending, remap_failure, pcie_replay, link_gen,
 * link_width, nvlink_crc_flit, nvlink_crc_data, nvlink_replay, nvlink_recovery,
 * events (supported event-type mask), lost (1: every call on the GPU returns
 * NVML_ERROR_GPU_IS_LOST), gpm (1: the GPU has GPU Performance Monitoring, as Hopper
 * and newer do; default 0), and the GPM metrics a pair of samples gives, as of the
 * later sample: gpm_graphics_util, gpm_sm_util, gpm_sm_occupancy, gpm_tensor_util,
 * gpm_dram_util, gpm_fp64_util, gpm_fp32_util, gpm_fp16_util (percent), gpm_pcie_tx,
 * gpm_pcie_rx, gpm_nvlink_tx, gpm_nvlink_rx (MiB per second).
 *
 * Build: cc -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c -lpthread
 * Compile with -DOMIT_<symbol> (e.g. -DOMIT_nvmlDeviceGetPowerUsage) to leave an
 * entry point out of the library altogether, as an older driver would.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- NVML ABI: the types and constants used below -------------------------- */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct fake_device *nvmlDevice_t;
typedef struct fake_event_set *nvmlEventSet_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef union {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    unsigned short usVal;
} nvmlValue_t;

enum { NVML_VALUE_TYPE_UNSIGNED_INT = 1, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3 };

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
enum { NVML_TEMPERATURE_GPU = 0 };

#define EV_SINGLE_BIT_ECC 0x1ULL
#define EV_DOUBLE_BIT_ECC 0x2ULL
#define EV_PSTATE 0x4ULL
#define EV_XID 0x8ULL
#define EV_CLOCK 0x10ULL

/* NVML field ids (nvmlDeviceGetFieldValues). */
enum {
    FI_ECC_SBE_VOL_TOTAL = 3,
    FI_ECC_DBE_VOL_TOTAL = 4,
    FI_ECC_SBE_AGG_TOTAL = 5,
    FI_ECC_DBE_AGG_TOTAL = 6,
    FI_RETIRED_SBE = 29,
    FI_RETIRED_DBE = 30,
    FI_RETIRED_PENDING = 31,
    FI_NVLINK_CRC_FLIT_TOTAL = 38,
    FI_NVLINK_CRC_DATA_TOTAL = 45,
    FI_NVLINK_REPLAY_TOTAL = 52,
    FI_NVLINK_RECOVERY_TOTAL = 59,
    FI_PCIE_REPLAY_COUNTER = 94,
    FI_REMAPPED_COR = 142,
    FI_REMAPPED_UNC = 143,
    FI_REMAPPED_PENDING = 144,
    FI_REMAPPED_FAILURE = 145,
};

/* ---- State ------------------------------------------------------------------ */

#define MAX_GPUS 64
#define MAX_EVENTS 256
#define MAX_DELIVERED 4096
#define MAX_SETS 16

enum field {
    F_UTIL_GPU, F_UTIL_MEM, F_MEM_TOTAL, F_MEM_USED, F_MEM_FREE, F_MEM_RESERVED,
    F_TEMP, F_POWER_MW, F_SM_CLOCK, F_MEM_CLOCK, F_THROTTLE,
    F_ECC_COR_VOL, F_ECC_UNC_VOL, F_ECC_COR_AGG, F_ECC_UNC_AGG,
    F_RETIRED_SBE, F_RETIRED_DBE, F_RETIRED_PENDING,
    F_REMAP_COR, F_REMAP_UNC, F_REMAP_PENDING, F_REMAP_FAILURE,
    F_PCIE_REPLAY, F_LINK_GEN, F_LINK_WIDTH,
    F_NVLINK_CRC_FLIT, F_NVLINK_CRC_DATA, F_NVLINK_REPLAY, F_NVLINK_RECOVERY,
    F_EVENTS, F_LOST,
    F_GPM, F_GPM_GR, F_GPM_SM, F_GPM_OCC, F_GPM_TENSOR, F_GPM_DRAM,
    F_GPM_FP64, F_GPM_FP32, F_GPM_FP16, F_GPM_PCIE_TX, F_GPM_PCIE_RX,
    F_GPM_NVLINK_TX, F_GPM_NVLINK_RX,
    NUM_FIELDS
};

static const char *const FIELD_NAMES[NUM_FIELDS] = {
    "util_gpu", "util_mem", "mem_total", "mem_used", "mem_free", "mem_reserved",
    "temp", "power_mw", "sm_clock", "mem_clock", "throttle",
    "ecc_cor_vol", "ecc_unc_vol", "ecc_cor_agg", "ecc_unc_agg",
    "retired_sbe", "retired_dbe", "retired_pending",
    "remap_cor", "remap_unc", "remap_pending", "remap_failure",
    "pcie_replay", "link_gen", "link_width",
    "nvlink_crc_flit", "nvlink_crc_data", "nvlink_replay", "nvlink_recovery",
    "events", "lost",
    "gpm", "gpm_graphics_util", "gpm_sm_util", "gpm_sm_occupancy", "gpm_tensor_util",
    "gpm_dram_util", "gpm_fp64_util", "gpm_fp32_util", "gpm_fp16_util", "gpm_pcie_tx",
    "gpm_pcie_rx", "gpm_nvlink_tx", "gpm_nvlink_rx",
};

struct value {
    nvmlReturn_t rc;
    unsigned long long v;
};

struct gpu {
    char uuid[96];
    char name[96];
    char pci[32];
    struct value f[NUM_FIELDS];
    int free_set;
};

struct event {
    unsigned long long id;
    unsigned int gpu;
    unsigned long long type;
    unsigned long long data;
};

struct state {
    unsigned int gpus;
    nvmlReturn_t init_error;
    char driver_version[80];
    unsigned int delay_ms;
    struct gpu gpu[MAX_GPUS];
    struct event events[MAX_EVENTS];
    unsigned int n_events;
};

struct fake_device {
    char unused;
};

struct fake_event_set {
    int in_use;
    unsigned long long mask[MAX_GPUS];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct state st;
static struct state next_st;
static int loaded;
static struct stat loaded_stat;
static int init_count;
static struct fake_device devices[MAX_GPUS];
static struct fake_event_set sets[MAX_SETS];
static unsigned long long delivered[MAX_DELIVERED];
static unsigned int n_delivered;

/* Default PCI bus ids: those of an 8-GPU HGX H100 board. */
static const unsigned int DEFAULT_BUSES[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

static void defaults(struct state *s) {
    memset(s, 0, sizeof *s);
    s->gpus = 8;
    snprintf(s->driver_version, sizeof s->driver_version, "550.54.15");
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        struct gpu *g = &s->gpu[i];
        unsigned int bus = i < 8 ? DEFAULT_BUSES[i] : 0x10 + i;
        snprintf(g->uuid, sizeof g->uuid, "GPU-fa4e0000-0000-4000-8000-%012x", i);
        snprintf(g->name, sizeof g->name, "NVIDIA H100 80GB HBM3");
        snprintf(g->pci, sizeof g->pci, "00000000:%02X:00.0", bus);
        g->f[F_MEM_TOTAL].v = 85520809984ULL;
        g->f[F_MEM_RESERVED].v = 573833216ULL;
        g->f[F_MEM_USED].v = 4194304ULL;
        g->f[F_TEMP].v = 35;
        g->f[F_POWER_MW].v = 70000;
        g->f[F_SM_CLOCK].v = 1980;
        g->f[F_MEM_CLOCK].v = 2619;
        g->f[F_LINK_GEN].v = 5;
        g->f[F_LINK_WIDTH].v = 16;
        g->f[F_EVENTS].v = EV_SINGLE_BIT_ECC | EV_DOUBLE_BIT_ECC | EV_PSTATE | EV_XID | EV_CLOCK;
    }
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) e--;
    *e = '\0';
    return s;
}

static struct value parse_value(const char *v) {
    struct value out = {NVML_SUCCESS, 0};
    if (strcmp(v, "na") == 0) {
        out.rc = NVML_ERROR_NOT_SUPPORTED;
    } else if (strncmp(v, "err:", 4) == 0) {
        out.rc = (nvmlReturn_t)strtol(v + 4, NULL, 0);
    } else {
        out.v = strtoull(v, NULL, 0);
    }
    return out;
}

static void set_gpu_field(struct gpu *g, const char *field, const char *v) {
    if (strcmp(field, "uuid") == 0) {
        snprintf(g->uuid, sizeof g->uuid, "%s", v);
    } else if (strcmp(field, "name") == 0) {
        snprintf(g->name, sizeof g->name, "%s", v);
    } else if (strcmp(field, "pci") == 0) {
        snprintf(g->pci, sizeof g->pci, "%s", v);
    } else {
        for (int f = 0; f < NUM_FIELDS; f++) {
            if (strcmp(field, FIELD_NAMES[f]) == 0) {
                g->f[f] = parse_value(v);
                if (f == F_MEM_FREE) g->free_set = 1;
                return;
            }
        }
    }
}

static void parse_event(struct state *s, unsigned long long id, char *v) {
    if (s->n_events >= MAX_EVENTS) return;
    struct event e = {id, 0, EV_XID, 0};
    int have_gpu = 0;
    for (char *tok = strtok(v, ","); tok; tok = strtok(NULL, ",")) {
        tok = trim(tok);
        if (strncmp(tok, "gpu:", 4) == 0) {
            e.gpu = (unsigned int)strtoul(tok + 4, NULL, 0);
            have_gpu = 1;
        } else if (strncmp(tok, "xid:", 4) == 0) {
            e.type = EV_XID;
            e.data = strtoull(tok + 4, NULL, 0);
        } else if (strcmp(tok, "type:dbe") == 0) {
            e.type = EV_DOUBLE_BIT_ECC;
        } else if (strcmp(tok, "type:sbe") == 0) {
            e.type = EV_SINGLE_BIT_ECC;
        }
    }
    if (have_gpu && e.gpu < MAX_GPUS) s->events[s->n_events++] = e;
}

static void parse_line(struct state *s, char *line) {
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *eq = strchr(line, '=');
    if (!eq) return;
    *eq = '\0';
    char *key = trim(line);
    char *val = trim(eq + 1);
    if (strcmp(key, "gpus") == 0) {
        unsigned long n = strtoul(val, NULL, 0);
        s->gpus = n > MAX_GPUS ? MAX_GPUS : (unsigned int)n;
    } else if (strcmp(key, "init_error") == 0) {
        s->init_error = (nvmlReturn_t)strtol(val, NULL, 0);
    } else if (strcmp(key, "driver_version") == 0) {
        snprintf(s->driver_version, sizeof s->driver_version, "%s", val);
    } else if (strcmp(key, "delay_ms") == 0) {
        s->delay_ms = (unsigned int)strtoul(val, NULL, 0);
    } else if (strncmp(key, "gpu.", 4) == 0) {
        char *rest = key + 4;
        char *dot = strchr(rest, '.');
        if (!dot) return;
        *dot = '\0';
        const char *field = dot + 1;
        if (strcmp(rest, "*") == 0) {
            for (unsigned int i = 0; i < MAX_GPUS; i++) set_gpu_field(&s->gpu[i], field, val);
        } else {
            char *end = NULL;
            unsigned long i = strtoul(rest, &end, 10);
            if (end != rest && *end == '\0' && i < MAX_GPUS) set_gpu_field(&s->gpu[i], field, val);
        }
    } else if (strncmp(key, "event.", 6) == 0) {
        parse_event(s, strtoull(key + 6, NULL, 10), val);
    }
}

/* The state file: next to this library, else $FAKE_NVML_STATE. */
static int state_path(char *out, size_t len) {
    /* Found once next to the library, the path does not change: remember it, so a
     * query costs one stat (for changes), not a symbol lookup and two stats. */
    static char found[4096];
    if (found[0]) {
        size_t n = strlen(found);
        if (n + 1 > len) return 0;
        memcpy(out, found, n + 1);
        return 1;
    }
    Dl_info info;
    if (dladdr((void *)&state_path, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            struct stat sb;
            snprintf(out, len, "%.*s/fake_nvml.state", (int)(slash - info.dli_fname), info.dli_fname);
            if (stat(out, &sb) == 0) {
                snprintf(found, sizeof found, "%s", out);
                return 1;
            }
        }
    }
    const char *env = getenv("FAKE_NVML_STATE");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return 1;
    }
    return 0;
}

/* Reload the state if its file changed. Call with `lock` held. */
static void reload(void) {
    char path[4096];
    struct stat sb;
    if (!state_path(path, sizeof path) || stat(path, &sb) != 0) {
        if (!loaded) {
            defaults(&st);
            loaded = 1;
        }
        return;
    }
    if (loaded && sb.st_ino == loaded_stat.st_ino && sb.st_dev == loaded_stat.st_dev &&
        sb.st_size == loaded_stat.st_size && sb.st_mtim.tv_sec == loaded_stat.st_mtim.tv_sec &&
        sb.st_mtim.tv_nsec == loaded_stat.st_mtim.tv_nsec) {
        return;
    }
    FILE *f = fopen(path, "r");
    if (!f) return;
    defaults(&next_st);
    char line[1024];
    while (fgets(line, sizeof line, f)) parse_line(&next_st, line);
    fclose(f);
    for (unsigned int i = 0; i < MAX_GPUS; i++) {
        struct gpu *g = &next_st.gpu[i];
        if (!g->free_set) {
            unsigned long long t = g->f[F_MEM_TOTAL].v, u = g->f[F_MEM_USED].v,
                               r = g->f[F_MEM_RESERVED].v;
            g->f[F_MEM_FREE].v = t > u + r ? t - u - r : 0;
        }
    }
    memcpy(&st, &next_st, sizeof st);
    loaded_stat = sb;
    loaded = 1;
}

static void sleep_ms(unsigned int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/*
 * Start a device query: lock, reload, check NVML is initialised and `dev` valid and
 * not lost, then sleep `delay_ms` (with the lock released). On success *gpu is the
 * GPU and the lock is held again; on failure the lock is released.
 */
static nvmlReturn_t begin(nvmlDevice_t dev, struct gpu **gpu, unsigned int *index) {
    pthread_mutex_lock(&lock);
    reload();
    if (init_count <= 0) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    uintptr_t p = (uintptr_t)dev, base = (uintptr_t)devices;
    if (p < base || p >= base + st.gpus * sizeof devices[0]) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned int i = (unsigned int)((p - base) / sizeof devices[0]);
    unsigned int delay = st.delay_ms;
    if (delay) {
        pthread_mutex_unlock(&lock);
        sleep_ms(delay);
        pthread_mutex_lock(&lock);
        reload();
        if (i >= st.gpus) {
            pthread_mutex_unlock(&lock);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
    }
    if (st.gpu[i].f[F_LOST].v) {
        pthread_mutex_unlock(&lock);
        return NVML_ERROR_GPU_IS_LOST;
    }
    *gpu = &st.gpu[i];
    if (index) *index = i;
    return NVML_SUCCESS;
}

static nvmlReturn_t end(nvmlReturn_t rc) {
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Read one numeric field into *out (any width). */
#define READ_FIELD(dev, field, out)                                  \
    do {                                                             \
        struct gpu *g_;                                              \
        nvmlReturn_t rc_ = begin((dev), &g_, NULL);                  \
        if (rc_ != NVML_SUCCESS) return rc_;                         \
        if (!(out)) return end(NVML_ERROR_INVALID_ARGUMENT);         \
        if (g_->f[field].rc != NVML_SUCCESS) return end(g_->f[field].rc); \
        *(out) = g_->f[field].v;                                     \
        return end(NVML_SUCCESS);                                    \
    } while (0)

static nvmlReturn_t copy_string(const char *src, char *out, unsigned int len) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- Library ------------------------------------------------------------- */

#ifndef OMIT_nvmlInit_v2
EXPORT nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&lock);
    reload();
    nvmlReturn_t rc = st.init_error;
    if (rc == NVML_SUCCESS) init_count++;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}
#endif

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count > 0) init_count--;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&lock);
    reload();
    nvmlReturn_t rc = init_count > 0 ? copy_string(st.driver_version, version, length)
                                     : NVML_ERROR_UNINITIALIZED;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&lock);
    reload();
    nvmlReturn_t rc = NVML_SUCCESS;
    if (init_count <= 0) rc = NVML_ERROR_UNINITIALIZED;
    else if (!count) rc = NVML_ERROR_INVALID_ARGUMENT;
    else *count = st.gpus;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    reload();
    nvmlReturn_t rc = NVML_SUCCESS;
    if (init_count <= 0) rc = NVML_ERROR_UNINITIALIZED;
    else if (!device || index >= st.gpus) rc = NVML_ERROR_INVALID_ARGUMENT;
    else *device = &devices[index];
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- Identity -------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    struct gpu *g;
    unsigned int i;
    nvmlReturn_t rc = begin(device, &g, &i);
    if (rc != NVML_SUCCESS) return rc;
    if (!index) return end(NVML_ERROR_INVALID_ARGUMENT);
    *index = i;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct gpu *g;
    nvmlReturn_t rc = begin(device, &g, NULL);
    if (rc != NVML_SUCCESS) return rc;
    return end(copy_string(g->uuid, uuid, length));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct gpu *g;
    nvmlReturn_t rc = begin(device, &g, NULL);
    if (rc != NVML_SUCCESS) return rc;
    return end(copy_string(g->name, name, length));
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct gpu *g;
    nvmlReturn_t rc = begin(device, &g, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!pci) return end(NVML_ERROR_INVALID_ARGUMENT);
    memset(pci, 0, sizeof *pci);
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(g->pci, "%x:%x:%x.%x", &domain, &bus, &dev, &fn) < 3) return end(NVML_ERROR_UNKNOWN);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x233010de;
    pci->pciSubSystemId = 0x16c110de;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", domain & 0xffff, bus, dev);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->pci);
    return end(NVML_SUCCESS);
}

/* ---- Readings -------------------------------------------------------------- */

#ifndef OMIT_nvmlDeviceGetUtilizationRates
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    struct gpu *g;
    nvmlReturn_t rc = begin(device, &g, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!util) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (g->f[F_UTIL_GPU].rc != NVML_SUCCESS) return end(g->f[F_UTIL_GPU].rc);
    if (g->f[F_UTIL_MEM].rc != NVML_SUCCESS) return end(g->f[F_UTIL_MEM].rc);
    util->gpu = (unsigned int)g->f[F_UTIL_GPU].v;
    util->memory = (unsigned int)g->f[F_UTIL_MEM].v;
    return end(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryInfo_v2
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *mem) {
    struct gpu *g;
    nvmlReturn_t rc = begin(device, &g, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!mem) return end(NVML_ERROR_INVALID_ARGUMENT);
    /* NVML_STRUCT_VERSION(Memory, 2): the struct size with the version in bits 24+. */
    if (mem->version != ((unsigned int)sizeof(nvmlMemory_v2_t) | (2u << 24)))
        return end(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (g->f[F_MEM_TOTAL].rc != NVML_SUCCESS) return end(g->f[F_MEM_TOTAL].rc);
    if (g->f[F_MEM_USED].rc != NVML_SUCCESS) return end(g->f[F_MEM_USED].rc);
    mem->total = g->f[F_MEM_TOTAL].v;
    mem->reserved = g->f[F_MEM_RESERVED].v;
    mem->used = g->f[F_MEM_USED].v;
    mem->free = g->f[F_MEM_FREE].v;
    return end(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetTemperature
EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp) {
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    READ_FIELD(device, F_TEMP, temp);
}
#endif

#ifndef OMIT_nvmlDeviceGetPowerUsage
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    READ_FIELD(device, F_POWER_MW, power);
}
#endif

#ifndef OMIT_nvmlDeviceGetClockInfo
EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock) {
    if (type == NVML_CLOCK_SM || type == NVML_CLOCK_GRAPHICS) READ_FIELD(device, F_SM_CLOCK, clock);
    if (type == NVML_CLOCK_MEM) READ_FIELD(device, F_MEM_CLOCK, clock);
    return NVML_ERROR_NOT_SUPPORTED;
}
#endif

#ifndef OMIT_nvmlDeviceGetCurrentClocksThrottleReasons
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *reasons) {
    READ_FIELD(device, F_THROTTLE, reasons);
}
#endif

#ifndef OMIT_nvmlDeviceGetTotalEccErrors
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type,
                                                int counter_type, unsigned long long *count) {
    int corrected = error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED;
    int volatile_ = counter_type == NVML_VOLATILE_ECC;
    if ((!corrected && error_type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED) ||
        (!volatile_ && counter_type != NVML_AGGREGATE_ECC))
        return NVML_ERROR_INVALID_ARGUMENT;
    enum field f = corrected ? (volatile_ ? F_ECC_COR_VOL : F_ECC_COR_AGG)
                             : (volatile_ ? F_ECC_UNC_VOL : F_ECC_UNC_AGG);
    READ_FIELD(device, f, count);
}
#endif

#ifndef OMIT_nvmlDeviceGetPcieReplayCounter
EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value) {
    READ_FIELD(device, F_PCIE_REPLAY, value);
}
#endif

#ifndef OMIT_nvmlDeviceGetCurrPcieLinkGeneration
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen) {
    READ_FIELD(device, F_LINK_GEN, gen);
}
#endif

#ifndef OMIT_nvmlDeviceGetCurrPcieLinkWidth
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width) {
    READ_FIELD(device, F_LINK_WIDTH, width);
}
#endif

#ifndef OMIT_nvmlDeviceGetFieldValues
static int field_for_id(unsigned int id) {
    switch (id) {
    case FI_ECC_SBE_VOL_TOTAL: return F_ECC_COR_VOL;
    case FI_ECC_DBE_VOL_TOTAL: return F_ECC_UNC_VOL;
    case FI_ECC_SBE_AGG_TOTAL: return F_ECC_COR_AGG;
    case FI_ECC_DBE_AGG_TOTAL: return F_ECC_UNC_AGG;
    case FI_RETIRED_SBE: return F_RETIRED_SBE;
    case FI_RETIRED_DBE: return F_RETIRED_DBE;
    case FI_RETIRED_PENDING: return F_RETIRED_PENDING;
    case FI_NVLINK_CRC_FLIT_TOTAL: return F_NVLINK_CRC_FLIT;
    case FI_NVLINK_CRC_DATA_TOTAL: return F_NVLINK_CRC_DATA;
    case FI_NVLINK_REPLAY_TOTAL: return F_NVLINK_REPLAY;
    case FI_NVLINK_RECOVERY_TOTAL: return F_NVLINK_RECOVERY;
    case FI_PCIE_REPLAY_COUNTER: return F_PCIE_REPLAY;
    case FI_REMAPPED_COR: return F_REMAP_COR;
    case FI_REMAPPED_UNC: return F_REMAP_UNC;
    case FI_REMAPPED_PENDING: return F_REMAP_PENDING;
    case FI_REMAPPED_FAILURE: return F_REMAP_FAILURE;
    default: return -1;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values) {
    struct gpu *g;
    nvmlReturn_t rc = begin(device, &g, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!values || count <= 0) return end(NVML_ERROR_INVALID_ARGUMENT);
    long long ts = now_us();
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *fv = &values[i];
        int f = field_for_id(fv->fieldId);
        fv->timestamp = ts;
        fv->latencyUsec = 0;
        if (f < 0) {
            fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            continue;
        }
        fv->nvmlReturn = g->f[f].rc;
        if (f == F_RETIRED_PENDING || f == F_REMAP_PENDING || f == F_REMAP_FAILURE) {
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            fv->value.uiVal = (unsigned int)g->f[f].v;
        } else {
            fv->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            fv->value.ullVal = g->f[f].v;
        }
    }
    return end(NVML_SUCCESS);
}
#endif

/* ---- Events ---------------------------------------------------------------- */

#ifndef OMIT_nvmlEventSetCreate
EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = NVML_ERROR_UNKNOWN;
    if (init_count <= 0) {
        rc = NVML_ERROR_UNINITIALIZED;
    } else {
        for (int i = 0; i < MAX_SETS; i++) {
            if (!sets[i].in_use) {
                memset(&sets[i], 0, sizeof sets[i]);
                sets[i].in_use = 1;
                *set = &sets[i];
                rc = NVML_SUCCESS;
                break;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
#endif

static int valid_set(nvmlEventSet_t set) {
    uintptr_t p = (uintptr_t)set, base = (uintptr_t)sets;
    return p >= base && p < base + sizeof sets && (p - base) % sizeof sets[0] == 0 && set->in_use;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = NVML_ERROR_INVALID_ARGUMENT;
    if (valid_set(set)) {
        set->in_use = 0;
        rc = NVML_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    READ_FIELD(device, F_EVENTS, types);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                             nvmlEventSet_t set) {
    struct gpu *g;
    unsigned int i;
    nvmlReturn_t rc = begin(device, &g, &i);
    if (rc != NVML_SUCCESS) return rc;
    if (!valid_set(set)) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (g->f[F_EVENTS].rc != NVML_SUCCESS) return end(g->f[F_EVENTS].rc);
    if (types & ~g->f[F_EVENTS].v) return end(NVML_ERROR_NOT_SUPPORTED);
    set->mask[i] |= types;
    return end(NVML_SUCCESS);
}

static int was_delivered(unsigned long long id) {
    for (unsigned int i = 0; i < n_delivered; i++)
        if (delivered[i] == id) return 1;
    return 0;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    long long deadline = now_us() + (long long)timeoutms * 1000LL;
    for (;;) {
        pthread_mutex_lock(&lock);
        if (!valid_set(set)) {
            pthread_mutex_unlock(&lock);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        reload();
        const struct event *best = NULL;
        for (unsigned int i = 0; i < st.n_events; i++) {
            const struct event *e = &st.events[i];
            if (e->gpu >= st.gpus || !(set->mask[e->gpu] & e->type) || was_delivered(e->id)) continue;
            if (!best || e->id < best->id) best = e;
        }
        if (best && n_delivered < MAX_DELIVERED) {
            delivered[n_delivered++] = best->id;
            memset(data, 0, sizeof *data);
            data->device = &devices[best->gpu];
            data->eventType = best->type;
            data->eventData = best->type == EV_XID ? best->data : 0;
            data->gpuInstanceId = 0xFFFFFFFFu;
            data->computeInstanceId = 0xFFFFFFFFu;
            pthread_mutex_unlock(&lock);
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&lock);
        long long left = deadline - now_us();
        if (left <= 0) return NVML_ERROR_TIMEOUT;
        /* The real library blocks in the kernel; poll the state file at 4 Hz so the
         * fake costs about as little CPU while a caller waits. */
        sleep_ms(left > 250000 ? 250 : (unsigned int)((left + 999) / 1000));
    }
}

/* ---- GPU Performance Monitoring (nvmlGpm*) --------------------------------- */

typedef struct fake_gpm_sample *nvmlGpmSample_t;

typedef struct {
    unsigned int version;
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct {
        char *shortName;
        char *longName;
        char *unit;
    } metricInfo;
} nvmlGpmMetric_t;

/* The caller's array may be longer; NVML touches only the first numMetrics. */
#define FAKE_GPM_METRICS 210

typedef struct {
    unsigned int version;
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[FAKE_GPM_METRICS];
} nvmlGpmMetricsGet_t;

enum { GPM_VERSION = 1 };

/* NVML's metric ids, their state fields and names. */
static const struct {
    unsigned int id;
    int field;
    const char *name;
    const char *unit;
} GPM_METRICS[] = {
    {1, F_GPM_GR, "GR_UTIL", "%"},
    {2, F_GPM_SM, "SM_UTIL", "%"},
    {3, F_GPM_OCC, "SM_OCCUP", "%"},
    {5, F_GPM_TENSOR, "TENSOR_UTIL", "%"},
    {10, F_GPM_DRAM, "DRAM_BW_UTIL", "%"},
    {11, F_GPM_FP64, "FP64_UTIL", "%"},
    {12, F_GPM_FP32, "FP32_UTIL", "%"},
    {13, F_GPM_FP16, "FP16_UTIL", "%"},
    {20, F_GPM_PCIE_TX, "PCIE_TX", "MiB/sec"},
    {21, F_GPM_PCIE_RX, "PCIE_RX", "MiB/sec"},
    {60, F_GPM_NVLINK_RX, "NVLINK_RX", "MiB/sec"},
    {61, F_GPM_NVLINK_TX, "NVLINK_TX", "MiB/sec"},
};
#define N_GPM (sizeof GPM_METRICS / sizeof GPM_METRICS[0])

struct fake_gpm_sample {
    int taken;
    unsigned int gpu;
    long long at_us;
    struct value v[N_GPM];
};

#ifndef OMIT_nvmlGpmQueryDeviceSupport
EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *support) {
    struct gpu *g;
    nvmlReturn_t rc = begin(device, &g, NULL);
    if (rc != NVML_SUCCESS) return rc;
    if (!support) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (support->version != GPM_VERSION) return end(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (g->f[F_GPM].rc != NVML_SUCCESS) return end(g->f[F_GPM].rc);
    support->isSupportedDevice = g->f[F_GPM].v != 0;
    return end(NVML_SUCCESS);
}
#endif

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    *sample = calloc(1, sizeof **sample);
    return *sample ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    free(sample);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t sample) {
    struct gpu *g;
    unsigned int index;
    nvmlReturn_t rc = begin(device, &g, &index);
    if (rc != NVML_SUCCESS) return rc;
    if (!sample) return end(NVML_ERROR_INVALID_ARGUMENT);
    if (g->f[F_GPM].rc != NVML_SUCCESS || !g->f[F_GPM].v) return end(NVML_ERROR_NOT_SUPPORTED);
    for (unsigned int m = 0; m < N_GPM; m++) sample->v[m] = g->f[GPM_METRICS[m].field];
    sample->gpu = index;
    sample->at_us = now_us();
    sample->taken = 1;
    return end(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *req) {
    if (!req) return NVML_ERROR_INVALID_ARGUMENT;
    if (req->version != GPM_VERSION) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    const struct fake_gpm_sample *a = req->sample1, *b = req->sample2;
    /* Two samples of one GPU, the second taken later. */
    if (!a || !b || !a->taken || !b->taken || a->gpu != b->gpu || b->at_us <= a->at_us ||
        req->numMetrics > FAKE_GPM_METRICS)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < req->numMetrics; i++) {
        nvmlGpmMetric_t *out = &req->metrics[i];
        out->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        out->value = 0;
        for (unsigned int m = 0; m < N_GPM; m++) {
            if (GPM_METRICS[m].id != out->metricId) continue;
            out->nvmlReturn = b->v[m].rc;
            out->value = (double)b->v[m].v;
            out->metricInfo.shortName = (char *)GPM_METRICS[m].name;
            out->metricInfo.longName = (char *)GPM_METRICS[m].name;
            out->metricInfo.unit = (char *)GPM_METRICS[m].unit;
        }
    }
    return NVML_SUCCESS;
}
