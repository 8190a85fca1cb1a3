/* test_cors.c - the --cors-origins matcher (http/cors.c); the headers
 * themselves are checked against the real server in tests/py/test_tls.py. */
#include "test.h"

#include "http/cors.h"

static bool
allowed(const char *list, const char *origin, bool *wild)
{
    return sp_cors_origin_allowed(list, sp_str_c(origin), wild);
}

TEST(cors_exact_entries)
{
    bool w = true;
    const char *list = "https://app.example.com, http://localhost:3000 ,https://b.example";
    ASSERT(allowed(list, "https://app.example.com", &w));
    ASSERT(!w);
    ASSERT(allowed(list, "http://localhost:3000", &w));
    ASSERT(allowed(list, "https://b.example", &w));
    /* exact bytes only: no prefix, suffix, case folding, port or path games */
    ASSERT(!allowed(list, "https://app.example.com.evil.net", &w));
    ASSERT(!allowed(list, "https://app.example.co", &w));
    ASSERT(!allowed(list, "HTTPS://APP.EXAMPLE.COM", &w));
    ASSERT(!allowed(list, "http://localhost:30000", &w));
    ASSERT(!allowed(list, "http://localhost", &w));
    ASSERT(!allowed(list, "https://b.example/", &w));
    ASSERT(!allowed(list, "", &w));
    ASSERT(!allowed(list, "null", &w));
    ASSERT(!w);
}

TEST(cors_off_and_empty_entries)
{
    bool w = true;
    ASSERT(!allowed("", "https://a.example", &w));
    ASSERT(!w);
    ASSERT(!allowed(" , ,", "https://a.example", &w));
    ASSERT(!allowed(",,", "", &w));
    ASSERT(!sp_cors_origin_allowed(NULL, sp_str_c("https://a.example"), &w));
    sp_str_t none = {NULL, 0};
    ASSERT(!sp_cors_origin_allowed("https://a.example", none, &w));
}

TEST(cors_wildcard)
{
    bool w = false;
    ASSERT(allowed("*", "https://anything.example", &w));
    ASSERT(w);
    /* an exact entry is echoed even when "*" is listed too */
    ASSERT(allowed("*, https://a.example", "https://a.example", &w));
    ASSERT(!w);
    ASSERT(allowed("https://a.example,*", "https://z.example", &w));
    ASSERT(w);
    /* "*" only as a whole entry */
    ASSERT(!allowed("https://*.example", "https://a.example", &w));
    ASSERT(!allowed("**", "https://a.example", &w));
}

TEST(cors_has_wildcard)
{
    ASSERT(sp_cors_has_wildcard("*"));
    ASSERT(sp_cors_has_wildcard("https://a.example, * "));
    ASSERT(!sp_cors_has_wildcard("https://a.example"));
    ASSERT(!sp_cors_has_wildcard("https://*.example"));
    ASSERT(!sp_cors_has_wildcard(""));
}
