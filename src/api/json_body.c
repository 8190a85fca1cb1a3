/*
 * json_body.c - an OpenAI-shaped request's JSON body, parsed inline when
 * small and on a preparation worker when large (json_body.h).
 *
 * Threads: sp_api_json_body and the job's done/drop run on the request's
 * loop, the parse on a worker (offload.h). Memory: a large body's job (its
 * copy of the body and the parsed tree) lives until the handler's second
 * run takes the tree; the tree is then the caller's (json_decref).
 */
#include "api/json_body.h"

#include "api/offload.h"
#include "core/alloc.h"

typedef struct body_job {
    sp_offload_body_t b;
    int json_depth;
    json_t *root;
    char err[512];
} body_job_t;

void
sp_api_refuse(sp_http_req_t *r, int status, const char *message)
{
    if (status == 429) {
        sp_api_error(r, 429, "server_overloaded", NULL, "queue_full", "%s", message);
    } else {
        sp_api_error(r, status, NULL, NULL, NULL, "%s", message);
    }
}

static void
body_work(sp_offload_t *job)
{
    body_job_t *j = SP_OFFLOAD_HOLDER(job, body_job_t, b.job);
    if (sp_json_parse(j->b.copy, j->b.len, j->json_depth, &j->root, j->err, sizeof j->err) != SP_OK) {
        j->root = NULL;
    }
    sp_offload_body_drop(&j->b);
}

static void
body_free(sp_offload_t *job)
{
    body_job_t *j = SP_OFFLOAD_HOLDER(job, body_job_t, b.job);
    json_decref(j->root); /* NULL when the handler took it */
    sp_offload_body_drop(&j->b);
    sp_free(j);
}

/* Loop thread: the parsed body (or why not); run the handler with it. */
static void
body_done(sp_offload_t *job, sp_http_req_t *r)
{
    body_job_t *j = SP_OFFLOAD_HOLDER(job, body_job_t, b.job);
    if (j->root == NULL) {
        sp_api_error(r, 400, NULL, NULL, NULL, "%s", j->err);
    } else if (!json_is_object(j->root)) {
        sp_api_error(r, 400, NULL, NULL, NULL, "the request body must be a JSON object");
    } else {
        sp_offload_body_rerun(&j->b); /* sp_api_json_body takes j->root */
    }
    body_free(job);
}

static const sp_offload_ops_t body_ops = {
    .stage = "parse", .work = body_work, .done = body_done, .drop = body_free,
    .refuse = sp_api_refuse,
};

json_t *
sp_api_json_body(sp_serving_t *s, sp_http_req_t *r, sp_route_fn handler,
                 const sp_route_params_t *p)
{
    sp_offload_body_t *redo = sp_offload_body_redo(r);
    body_job_t *parsed = redo != NULL ? SP_OFFLOAD_HOLDER(redo, body_job_t, b) : NULL;
    if (parsed != NULL && parsed->root != NULL) {
        json_t *root = parsed->root;
        parsed->root = NULL;
        return root;
    }
    sp_str_t body = sp_http_req_body(r);
    if (body.len == 0) {
        sp_api_error(r, 400, NULL, NULL, NULL,
                     "the request body is empty (a JSON object is expected)");
        return NULL;
    }
    if (body.len > SP_API_INLINE_BODY && s->prep != NULL) {
        body_job_t *j = sp_calloc(1, sizeof *j);
        if (j == NULL) {
            sp_api_error(r, 503, NULL, NULL, NULL, "out of memory");
            return NULL;
        }
        j->json_depth = s->cfg.json_depth;
        if (!sp_offload_body_start(&j->b, &body_ops, s->prep, r, handler, p, s)) {
            sp_free(j);
        }
        return NULL;
    }
    json_t *root;
    char err[512];
    if (sp_json_parse(body.ptr, body.len, s->cfg.json_depth, &root, err, sizeof err) != SP_OK) {
        sp_api_error(r, 400, NULL, NULL, NULL, "%s", err);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        sp_api_error(r, 400, NULL, NULL, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}
