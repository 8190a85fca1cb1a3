/*
 * fuzz_pbtxt.c - libFuzzer target for config.pbtxt (src/serving/pbtxt.c,
 * src/serving/repo_pbtxt.c): the protobuf text format read over the
 * ModelConfig descriptors, the config checks behind it, and the ModelConfig
 * printed back.
 *
 * Input: the text of a config.pbtxt, copied into an exact-size heap buffer so
 * ASan sees any read past its end.
 *
 * Checks: a parse error names the file, a line and a column ("LABEL:L:C: ");
 * a parsed file is JSON that the ModelConfig descriptor takes back as a
 * message (the parser produced only schema fields), and that message prints;
 * a failed config check of a parsed file still names the file; every
 * position recorded is in the text (line and column >= 1); nothing leaks
 * (LeakSanitizer).
 *
 * Seeds: tests/fuzz/corpus/pbtxt (Triton's documented configs and the bad
 * files of tests/unit/test_pbtxt.c). Dictionary: tests/fuzz/pbtxt.dict.
 *
 *   make fuzz
 *   ./build-fuzz/fuzz_pbtxt -dict=tests/fuzz/pbtxt.dict \
 *       tests/fuzz/corpus-work/pbtxt tests/fuzz/corpus/pbtxt
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "serving/pbtxt.h"
#include "serving/repo_config.h"
#include "serving/repo_pbtxt.h"

#define LABEL "models/m/config.pbtxt"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
need(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_pbtxt: %s\n", what);
        abort();
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sp_json_init();
    char *text = malloc(size ? size : 1);
    if (text == NULL) return 0;
    if (size) memcpy(text, data, size);
    char err[1024] = "";
    json_t *j = NULL;
    sp_pbtxt_posmap_t pos = {0};
    sp_status_t st = sp_repo_pbtxt_parse(text, size, LABEL, &j, &pos, err, sizeof err);
    if (st != SP_OK) {
        need(j == NULL, "a failed parse returned a value");
        int line = 0, col = 0;
        need(strncmp(err, LABEL ":", sizeof LABEL) == 0 || st == SP_ERR_NOMEM,
             "a parse error does not name the file");
        need(st == SP_ERR_NOMEM || sscanf(err + sizeof LABEL, "%d:%d: ", &line, &col) == 2,
             "a parse error does not name line and column");
        need(st == SP_ERR_NOMEM || (line >= 1 && col >= 1), "line or column below 1");
        goto done;
    }
    for (int32_t i = 0; i < pos.n; i++) {
        need(pos.v[i].line >= 1 && pos.v[i].col >= 1 && pos.v[i].path != NULL, "a position");
    }
    ProtobufCMessage *m = NULL;
    st = sp_pbtxt_json_to_msg(j, sp_repo_model_config_descriptor(), &m, err, sizeof err);
    need(st == SP_OK || st == SP_ERR_NOMEM, "parsed JSON that the descriptor does not take back");
    if (m) {
        json_t *back = sp_pbtxt_msg_to_json(m);
        need(back != NULL, "a message that does not print");
        json_decref(back);
        sp_pbtxt_msg_free(m);
    }
    sp_repo_config_t cfg;
    err[0] = '\0';
    st = sp_repo_config_from_json(j, LABEL, &cfg, err, sizeof err);
    if (st != SP_OK) {
        sp_repo_pbtxt_locate(&pos, LABEL, err, sizeof err);
        need(strncmp(err, LABEL, strlen(LABEL)) == 0, "a config error does not name the file");
    }
    sp_repo_config_free(&cfg);
done:
    sp_pbtxt_posmap_free(&pos);
    json_decref(j);
    free(text);
    return 0;
}
