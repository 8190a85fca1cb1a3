/*
 * test_hub.c - the pure parts of the Hugging Face client (serving/hub.h):
 * hf:// references, safe repository paths, split-file names and the rule that
 * picks a model file. The network half is tests/py/test_hf_hub.py.
 */
#include <stdlib.h>

#include "serving/hub.h"
#include "test.h"

TEST(hub_parse_forms)
{
    sp_hub_ref_t r;
    ASSERT_OK(sp_hub_parse("hf://org/repo", &r, NULL, 0));
    ASSERT_STR_EQ(r.repo, "org/repo");
    ASSERT_STR_EQ(r.file, "");
    ASSERT_STR_EQ(r.quant, "");
    ASSERT_OK(sp_hub_parse("hf://TheOrg/Model-7B.v2_GGUF:q4_k_m", &r, NULL, 0));
    ASSERT_STR_EQ(r.repo, "TheOrg/Model-7B.v2_GGUF");
    ASSERT_STR_EQ(r.quant, "q4_k_m");
    ASSERT_OK(sp_hub_parse("hf://org/repo/sub/dir/m-Q8_0.gguf", &r, NULL, 0));
    ASSERT_STR_EQ(r.repo, "org/repo");
    ASSERT_STR_EQ(r.file, "sub/dir/m-Q8_0.gguf");
    ASSERT_OK(sp_hub_parse("hf://org/repo/", &r, NULL, 0));
    ASSERT_STR_EQ(r.file, "");
}

TEST(hub_parse_refuses)
{
    static const char *const bad[] = {
        "org/repo", "hf://org", "hf:///repo", "hf://org/", "hf://.org/repo", "hf://org/..",
        "hf://org/re po", "hf://o--rg/repo", "hf://org/repo:", "hf://org/repo:Q4-K",
        "hf://org/repo/../x.gguf", "hf://org/repo//x.gguf", "hf://org/repo/a/./x.gguf",
        "hf://org/repo/a\\b.gguf", "hf://org/repo/x\n.gguf", "hf://org/repo:Q4:Q8",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sp_hub_ref_t r;
        char err[256] = "";
        if (sp_hub_parse(bad[i], &r, err, sizeof err) != SP_ERR_INVALID || err[0] == '\0') {
            SP_TEST_FAIL("'%s' was accepted", bad[i]);
        }
    }
}

TEST(hub_valid_path)
{
    ASSERT(sp_hub_valid_path("a.gguf"));
    ASSERT(sp_hub_valid_path("dir/sub/a..b.gguf"));
    ASSERT(sp_hub_valid_path(".hidden/x"));
    ASSERT(!sp_hub_valid_path(""));
    ASSERT(!sp_hub_valid_path("/etc/passwd"));
    ASSERT(!sp_hub_valid_path("../x"));
    ASSERT(!sp_hub_valid_path("a/../../x"));
    ASSERT(!sp_hub_valid_path("a/.."));
    ASSERT(!sp_hub_valid_path("a/."));
    ASSERT(!sp_hub_valid_path("a//b"));
    ASSERT(!sp_hub_valid_path("a/"));
    ASSERT(!sp_hub_valid_path("a\\b"));
    ASSERT(!sp_hub_valid_path("a\x01" "b"));
    char longp[600];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    ASSERT(!sp_hub_valid_path(longp));
}

TEST(hub_split_names)
{
    int k = 0, c = 0;
    size_t pl = 0;
    ASSERT(sp_hub_split("m-Q4_K_M-00002-of-00003.gguf", &k, &c, &pl));
    ASSERT_EQ(k, 2);
    ASSERT_EQ(c, 3);
    ASSERT_EQ(pl, strlen("m-Q4_K_M"));
    ASSERT(!sp_hub_split("m-Q4_K_M.gguf", &k, &c, &pl));
    ASSERT(!sp_hub_split("m-00004-of-00003.gguf", &k, &c, &pl));
    ASSERT(!sp_hub_split("m-00000-of-00003.gguf", &k, &c, &pl));
    ASSERT(!sp_hub_split("m-0000a-of-00003.gguf", &k, &c, &pl));
    ASSERT(!sp_hub_split("-00001-of-00003.gguf", &k, &c, &pl));
}

TEST(hub_pick_rule)
{
    const char *const files[] = {
        "README.md",
        "a/m-IQ2_XS.gguf",
        "m-Q2_K.gguf",
        "m-Q4_K_M-00002-of-00002.gguf",
        "m-Q4_K_M-00001-of-00002.gguf",
        "m-Q4_K_S.gguf",
        "m-Q8_0.gguf",
        "mmproj-m-Q5_K.gguf",
        "m.imatrix.gguf",
    };
    size_t n = sizeof files / sizeof files[0];
    /* Default: Q4_K_M (part 1 of the split one), then Q8_0, then the first model file. */
    ASSERT_EQ(sp_hub_pick(files, n, ""), 4);
    ASSERT_EQ(sp_hub_pick(files, n, NULL), 4);
    ASSERT_EQ(sp_hub_pick(files + 5, n - 5, ""), 1);  /* Q8_0 */
    ASSERT_EQ(sp_hub_pick(files, 3, ""), 1);          /* the first GGUF model file */
    /* A tag: case-insensitive, followed by '.' or '-', never a prefix of a longer tag. */
    ASSERT_EQ(sp_hub_pick(files, n, "q8_0"), 6);
    ASSERT_EQ(sp_hub_pick(files, n, "Q4_K"), -1);     /* Q4_K_M and Q4_K_S are other tags */
    ASSERT_EQ(sp_hub_pick(files, n, "Q4_K_S"), 5);
    ASSERT_EQ(sp_hub_pick(files, n, "IQ2_XS"), 1);
    ASSERT_EQ(sp_hub_pick(files, n, "Q5_K"), -1);     /* only an mmproj has it */
    ASSERT_EQ(sp_hub_pick(files, 1, ""), -1);         /* no GGUF at all */
}
