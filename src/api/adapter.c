/*
 * adapter.c - the LoRA adapter a request's model name selects
 * ("<model>:<adapter>", serving/adapters.h), with the OpenAI-shaped 404 when
 * the model serves no adapter of that name.
 *
 * Threads: loop threads; the model's adapter set is read under the
 * registry's lock. Memory: the selected adapter carries a reference the
 * request releases (sp_req_adapter_release).
 */
#include <string.h>

#include "api/api.h"
#include "serving/adapters.h"

bool
sp_adapter_for(sp_serving_t *s, sp_http_req_t *r, sp_served_model_t *m, const char *name,
               size_t len, sp_req_adapter_t *out)
{
    if (sp_adapters_find(&m->adapters, &s->reg.mu, m->name, name, len, out)) {
        return true;
    }
    sp_jbuf_t nm;
    sp_jbuf_init(&nm);
    sp_jbuf_str(&nm, name, len > 200 ? 200 : len);
    sp_api_error(r, 404, "invalid_request_error", "model", "model_not_found",
                 "The model %s does not exist: '%s' serves no adapter of that name (load it "
                 "with POST /v2/repository/models/<model>:<adapter>/load)",
                 nm.p ? nm.p : "\"\"", m->name);
    sp_jbuf_free(&nm);
    return false;
}
