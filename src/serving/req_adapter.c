/*
 * req_adapter.c - the LoRA adapter a request selected (adapters.h): its
 * reference, released when the request ends, and the model name its
 * answers report ("<model>" or "<model>:<adapter>").
 *
 * Threads: the request's own thread.
 */
#include <stdio.h>

#include "serving/adapters.h"
#include "serving/registry.h"

void
sp_req_adapter_release(sp_req_adapter_t *a)
{
    sp_lora_release(a->lora);
    a->lora = NULL;
}

void
sp_req_adapter_model_name(const sp_served_model_t *m, const sp_req_adapter_t *a, sp_jbuf_t *b)
{
    if (a == NULL || a->lora == NULL) {
        sp_jbuf_cstr(b, m->name);
        return;
    }
    char full[sizeof m->name + SP_ADAPTER_NAME_MAX + 2];
    snprintf(full, sizeof full, "%s:%s", m->name, a->name);
    sp_jbuf_cstr(b, full);
}

