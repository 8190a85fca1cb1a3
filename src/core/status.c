/* status.c - messages and HTTP codes for the status table in status.h. */
#include "sampan/status.h"

#include <stdio.h>

const char *
sp_status_str(sp_status_t st)
{
    switch (st) {
#define XX(name, val, http, msg) case SP_##name: return msg;
        SP_STATUS_MAP(XX)
#undef XX
    }
    return "unknown status";
}

const char *
sp_status_name(sp_status_t st)
{
    switch (st) {
#define XX(name, val, http, msg) case SP_##name: return #name;
        SP_STATUS_MAP(XX)
#undef XX
    }
    return "UNKNOWN";
}

int
sp_status_http(sp_status_t st)
{
    switch (st) {
#define XX(name, val, http, msg) case SP_##name: return http;
        SP_STATUS_MAP(XX)
#undef XX
    }
    return 500;
}

sp_status_t
sp_errf(char *err, size_t err_len, sp_status_t st, const char *fmt, ...)
{
    if (err != NULL && err_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return st;
}
