/*
 * pbtxt.h - protobuf messages as text: the protobuf text format (config.pbtxt)
 * read into JSON, and JSON to and from protobuf-c messages, all driven by the
 * protobuf-c descriptors of the message (so any message of a .proto compiled
 * with protoc-c works, not a hand-written list of keys).
 *
 * The text format read: `field: value` scalars (integers in decimal, hex or
 * octal, floats, inf/nan, true/false, enum values by name, strings in single
 * or double quotes with C escapes, adjacent strings joined), repeated fields
 * as repeated `field: v` and as `field: [a, b]`, messages as `field { }` or
 * `field < >` (the colon optional), lists of messages `field [ {..}, {..} ]`,
 * maps as repeated `{key: K value: V}` entries, `#` comments, and `,` or `;`
 * after a field. The JSON produced follows the proto3 JSON mapping with the
 * proto field names (as Triton prints a ModelConfig): a map is an object
 * keyed by the key's text, 64-bit integers are JSON numbers.
 *
 * Untrusted input: the text is bounded by the caller, nesting by
 * SP_PBTXT_MAX_DEPTH and the number of values by SP_PBTXT_MAX_NODES; every
 * error is one line "FILE:LINE:COLUMN: FIELD PATH: what". Positions of the
 * fields read are kept (sp_pbtxt_pos_t) so that a later check of the JSON,
 * which names a field path, can name the line too.
 *
 * Threads: none; everything is owned by the caller. Memory: jansson values
 * and sp_malloc'ed position tables; messages from sp_pbtxt_json_to_msg are
 * freed with sp_pbtxt_msg_free.
 */
#ifndef SP_SERVING_PBTXT_H
#define SP_SERVING_PBTXT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

#include "sampan/status.h"

#define SP_PBTXT_MAX_DEPTH 32
#define SP_PBTXT_MAX_NODES 65536

/* Where a field (path as in the JSON checks' errors: "input[0].dims",
 * "parameters.KEY.string_value") was written. */
typedef struct sp_pbtxt_pos {
    char *path;
    int32_t line, col;
} sp_pbtxt_pos_t;

typedef struct sp_pbtxt_posmap {
    sp_pbtxt_pos_t *v;
    int32_t n, cap;
} sp_pbtxt_posmap_t;

/* A field the schema knows of but the caller refuses, with why (top-level
 * fields of the message: e.g. {"sequence_batching", "Sampan has ..."}). */
typedef struct sp_pbtxt_refusal {
    const char *field;
    const char *why;
} sp_pbtxt_refusal_t;

/* Parse text as message `desc` into a JSON object (*out, caller decrefs).
 * refused: NULL or a table ended by {NULL, NULL}. pos: NULL or filled (free
 * with sp_pbtxt_posmap_free even on error). `file` labels errors. */
sp_status_t sp_pbtxt_parse(const char *text, size_t len, const ProtobufCMessageDescriptor *desc,
                           const sp_pbtxt_refusal_t *refused, const char *file, json_t **out,
                           sp_pbtxt_posmap_t *pos, char *err, size_t err_len);

void sp_pbtxt_posmap_free(sp_pbtxt_posmap_t *m);

/* The position of path, or of its nearest written parent ("a.b[2].c" ->
 * "a.b[2]" -> "a.b" -> "a"); NULL when none. */
const sp_pbtxt_pos_t *sp_pbtxt_posmap_find(const sp_pbtxt_posmap_t *m, const char *path);

/* A JSON object (proto3 JSON mapping, proto field names) into a new message
 * of type desc. Unknown fields and wrong types are errors naming the path. */
sp_status_t sp_pbtxt_json_to_msg(const json_t *j, const ProtobufCMessageDescriptor *desc,
                                 ProtobufCMessage **out, char *err, size_t err_len);
void sp_pbtxt_msg_free(ProtobufCMessage *m);

/* A message as JSON the way Triton prints one: every scalar field (defaults
 * too), enums by name, 64-bit integers as numbers, set messages only, maps as
 * objects. NULL on allocation failure. */
json_t *sp_pbtxt_msg_to_json(const ProtobufCMessage *m);

#endif /* SP_SERVING_PBTXT_H */
