/*
 * yaml.h - YAML documents read as JSON values (jansson), for configuration files.
 *
 * One YAML document (libyaml's parser) becomes the json_t the JSON reader
 * would give for the same data, so one code path applies a configuration
 * whichever syntax it was written in. Plain scalars are typed by the YAML 1.2
 * core schema (null, true/false, integers in decimal, 0x and 0o, floats);
 * quoted scalars and those tagged !!str are strings. Refused, with the line and
 * column: aliases (no billion laughs), more than one document, non-scalar or
 * duplicate mapping keys, .inf/.nan, nesting deeper than max_depth.
 * No global state; safe from any thread.
 */
#ifndef SP_CORE_YAML_H
#define SP_CORE_YAML_H

#include <stddef.h>

#include <jansson.h>

#include "sampan/status.h"

/* Parse buf into *out (a new reference; an empty document is json null).
 * SP_ERR_INVALID with "line L, column C: ..." on error. */
sp_status_t sp_yaml_parse(const char *buf, size_t len, int max_depth, json_t **out, char *err,
                          size_t err_len);

#endif /* SP_CORE_YAML_H */
