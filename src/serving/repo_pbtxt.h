/*
 * repo_pbtxt.h - a model's config.pbtxt (Triton's ModelConfig in the protobuf
 * text format, proto/model_config.proto) and the ModelConfig that Triton's
 * tooling reads back (GET /v2/models/{m}/config, gRPC ModelConfig).
 *
 * config.pbtxt is read into the JSON that config.json holds, then both go
 * through the same checks (sp_repo_config_from_json): one config struct, two
 * readers. Errors of the text itself name file, line, column and field; a
 * failed check of the JSON names the field path, which sp_repo_pbtxt_locate
 * turns into the line and column where that field was written.
 *
 * Threads: none. Memory: the caller owns every result.
 */
#ifndef SP_SERVING_REPO_PBTXT_H
#define SP_SERVING_REPO_PBTXT_H

#include <stddef.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "serving/pbtxt.h"
#include "serving/repo_config.h"
#include "sampan/status.h"

/* Parse config.pbtxt text (at most SP_REPO_CONFIG_MAX bytes) as an
 * inference.ModelConfig into config.json's JSON. `label` names the file. */
sp_status_t sp_repo_pbtxt_parse(const char *text, size_t len, const char *label, json_t **out,
                                sp_pbtxt_posmap_t *pos, char *err, size_t err_len);

/* err holds "LABEL: FIELD PATH: what" from the JSON checks: rewrite it as
 * "LABEL:LINE:COL: FIELD PATH: what" when pos knows where the field (or its
 * nearest parent) was written; otherwise leave it. */
void sp_repo_pbtxt_locate(const sp_pbtxt_posmap_t *pos, const char *label, char *err,
                          size_t err_len);

/* A valid config (its JSON text, sp_repo_config_t.json; NULL for a --model
 * model, which is an llm model) as the ModelConfig message (free with
 * sp_pbtxt_msg_free), and as Triton's JSON for it (every scalar field
 * printed, enums by name). name: the served model's name, used when the file
 * leaves `name` out. */
sp_status_t sp_repo_config_to_msg(const char *config_json, const char *name,
                                  ProtobufCMessage **out, char *err, size_t err_len);
json_t *sp_repo_config_triton_json(const char *config_json, const char *name, char *err,
                                   size_t err_len);

/* inference.ModelConfig's descriptor (for callers that pack the message). */
const ProtobufCMessageDescriptor *sp_repo_model_config_descriptor(void);

#endif /* SP_SERVING_REPO_PBTXT_H */
