/*
 * devices.c - `sampan devices`: the devices Sampan can place models on.
 *
 *   sampan devices [--json] [--budget F]
 *
 * One line per device (the CPU, each GPU, each MIG instance) with its total,
 * budget (F x total, default 0.8), used and free memory, then a note when there
 * are no GPUs and why (no NVML, init failure, CUDA_VISIBLE_DEVICES). --json prints
 * the same as one object: {"budget_fraction", "devices": [...], "note"}.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "tools/tools.h"

static const char devices_usage[] =
    "usage: sampan devices [--json] [--budget F]\n"
    "  --json      one JSON object instead of the table\n"
    "  --budget F  share of each device's memory Sampan may use, in (0, 1] (default 0.8)\n"
    "Environment: CUDA_VISIBLE_DEVICES selects GPUs (indices, GPU-/MIG- UUIDs);\n"
    "SAMPAN_NVML_LIB names the NVML library (default libnvidia-ml.so.1).\n";

static void
human(char *buf, size_t len, uint64_t b)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
}

/* Strings here are printable ASCII already (device.c); escape what JSON needs. */
static void
put_json_str(const char *s)
{
    putchar('"');
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\') {
            putchar('\\');
        }
        putchar(*s);
    }
    putchar('"');
}

static void
label(const sp_device_info_t *d, char *buf, size_t len)
{
    if (d->kind == SP_DEVICE_CPU) {
        snprintf(buf, len, "cpu");
    } else if (d->ordinal >= 0) {
        snprintf(buf, len, "cuda:%d", d->ordinal);
    } else if (d->kind == SP_DEVICE_MIG) {
        /* a MIG instance after the first: a CUDA process opens one (device.h) */
        snprintf(buf, len, "mig%d.%d", d->nvml_index, d->mig_slot);
    } else {
        snprintf(buf, len, "gpu%d", d->nvml_index); /* split by MIG: not a CUDA device */
    }
}

static void
print_table(const sp_devices_t *devs)
{
    printf("%-8s %-4s %-11s %-11s %-11s %-11s %-5s %-34s %s\n", "DEVICE", "KIND", "TOTAL",
           "BUDGET", "USED", "FREE", "UTIL", "NAME", "ID");
    for (int i = 0; i < sp_devices_count(devs); i++) {
        const sp_device_info_t *d = sp_devices_get(devs, i);
        char lb[32], t[24], b[24], u[24], f[24], ut[16];
        label(d, lb, sizeof lb);
        human(t, sizeof t, d->total_bytes);
        human(b, sizeof b, d->budget_bytes);
        human(u, sizeof u, d->used_bytes);
        human(f, sizeof f, d->free_bytes);
        if (d->util_percent >= 0) {
            snprintf(ut, sizeof ut, "%d%%", d->util_percent);
        } else {
            snprintf(ut, sizeof ut, "-");
        }
        printf("%-8s %-4s %-11s %-11s %-11s %-11s %-5s %-34s %s", lb, sp_device_kind_name(d->kind),
               t, d->mig_enabled ? "-" : b, u, f, ut, d->name, d->id);
        if (d->kind == SP_DEVICE_CPU) {
            printf(" (%s)", d->source);
        } else if (d->mig_enabled) {
            printf(" (MIG mode: runs on its instances)");
        }
        putchar('\n');
    }
    if (sp_devices_note(devs)[0] != '\0') {
        printf("note: %s\n", sp_devices_note(devs));
    }
}

static void
print_json(const sp_devices_t *devs)
{
    printf("{\"budget_fraction\": %.4g, \"devices\": [", sp_devices_budget_fraction(devs));
    for (int i = 0; i < sp_devices_count(devs); i++) {
        const sp_device_info_t *d = sp_devices_get(devs, i);
        char lb[32];
        label(d, lb, sizeof lb);
        printf("%s\n  {\"index\": %d, \"device\": ", i == 0 ? "" : ",", d->index);
        put_json_str(lb);
        printf(", \"kind\": \"%s\", \"id\": ", sp_device_kind_name(d->kind));
        put_json_str(d->id);
        printf(", \"name\": ");
        put_json_str(d->name);
        printf(", \"ordinal\": %d, \"nvml_index\": %d, \"mig_slot\": %d, \"parent\": %d, "
               "\"mig_enabled\": %s, \"source\": ",
               d->ordinal, d->nvml_index, d->mig_slot, d->parent, d->mig_enabled ? "true" : "false");
        put_json_str(d->source);
        printf(", \"total_bytes\": %" PRIu64 ", \"budget_bytes\": %" PRIu64
               ", \"used_bytes\": %" PRIu64 ", \"free_bytes\": %" PRIu64 ", \"utilization\": ",
               d->total_bytes, d->budget_bytes, d->used_bytes, d->free_bytes);
        if (d->util_percent >= 0) {
            printf("%d}", d->util_percent);
        } else {
            printf("null}");
        }
    }
    printf("\n], \"note\": ");
    if (sp_devices_note(devs)[0] != '\0') {
        put_json_str(sp_devices_note(devs));
    } else {
        printf("null");
    }
    printf("}\n");
}

int
sp_cmd_devices(int argc, char **argv)
{
    sp_device_opts_t opts = {0};
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--budget") == 0 && i + 1 == argc) {
            fprintf(stderr, "sampan devices: --budget needs a value\n%s", devices_usage);
            return 2;
        } else if (strcmp(argv[i], "--budget") == 0) {
            char *end;
            errno = 0;
            double v = strtod(argv[++i], &end);
            if (errno != 0 || end == argv[i] || *end != '\0' || !(v > 0 && v <= 1)) {
                fprintf(stderr, "sampan devices: --budget '%s' is not a number in (0, 1]\n",
                        argv[i]);
                return 2;
            }
            opts.budget_fraction = v;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(devices_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "sampan devices: unknown option '%s'\n%s", argv[i], devices_usage);
            return 2;
        }
    }
    char err[256];
    sp_devices_t *devs;
    if (sp_devices_open(&opts, &devs, err, sizeof err) != SP_OK) {
        fprintf(stderr, "sampan devices: %s\n", err);
        return 1;
    }
    if (json) {
        print_json(devs);
    } else {
        print_table(devs);
    }
    sp_devices_close(devs);
    return 0;
}
