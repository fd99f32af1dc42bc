/*
 * tests/unit/test_config.c — configuration layering (defaults < file < environment < flags)
 * and every way a configuration can be refused, each error naming the key and its origin.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"

static char path[64];

static const char *write_config(const char *json)
{
    snprintf(path, sizeof path, "/tmp/kiln-test-config-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    return path;
}

/* Loads with argv = {"kilnd", args...}; returns the action and leaves the message in err. */
static enum kd_config_action load(struct kd_config *cfg, char *const *env, char *err, const char *const *args)
{
    char *argv[32] = {"kilnd"};
    int argc = 1;
    for (; args && args[argc - 1]; argc++)
        argv[argc] = (char *)args[argc - 1];
    return kd_config_load(cfg, argc, argv, env, err, 512);
}

static void expect_error(char *const *env, const char *const *args, const char *needle1, const char *needle2)
{
    struct kd_config cfg;
    char err[512] = "";
    assert_int_equal(load(&cfg, env, err, args), KD_CONFIG_ERROR);
    if (!strstr(err, needle1) || (needle2 && !strstr(err, needle2)))
        fail_msg("error '%s' lacks '%s' / '%s'", err, needle1, needle2 ? needle2 : "");
}

static void test_defaults(void **state)
{
    (void)state;
    struct kd_config cfg;
    char err[512];
    assert_int_equal(load(&cfg, NULL, err, NULL), KD_CONFIG_RUN);
    assert_string_equal(cfg.host, "127.0.0.1");
    assert_int_equal(cfg.port, 8080);
    assert_string_equal(cfg.data_dir, "./var");
    assert_int_equal(cfg.devices.count, 1);
    assert_string_equal(cfg.devices.items[0], "cpu");
    assert_int_equal(cfg.limits.max_header_bytes, 8192);
    assert_int_equal(cfg.limits.max_connections, 1024);
    assert_int_equal(cfg.log_level, KD_LOG_INFO);
    assert_int_equal(cfg.log_format, KD_LOG_TEXT);
    assert_string_equal(cfg.log_file, "");
    assert_int_equal(cfg.api_tokens.count, 0);
    kd_config_free(&cfg);
}

static void test_precedence(void **state)
{
    (void)state;
    const char *file = write_config("{\"port\": 1111, \"host\": \"::1\", \"log_level\": \"warn\","
                                    " \"limits\": {\"idle_timeout_ms\": 500}, \"devices\": [\"cpu\", \"cuda:0\"],"
                                    " \"api_tokens\": [\"t1\", \"t2\"]}");
    char *env[] = {"KILN_PORT=2222", "KILN_LOG_LEVEL=debug", "KILN_URL=http://ignored", NULL};
    struct kd_config cfg;
    char err[512];

    /* file alone */
    assert_int_equal(load(&cfg, NULL, err, (const char *[]){"--config", file, NULL}), KD_CONFIG_RUN);
    assert_int_equal(cfg.port, 1111);
    assert_int_equal(cfg.log_level, KD_LOG_WARN);
    assert_int_equal(cfg.limits.idle_timeout_ms, 500);
    assert_int_equal(cfg.devices.count, 2);
    assert_string_equal(cfg.devices.items[1], "cuda:0");
    assert_int_equal(cfg.api_tokens.count, 2);
    assert_string_equal(cfg.api_tokens.items[1], "t2");
    kd_config_free(&cfg);

    /* env over file */
    assert_int_equal(load(&cfg, env, err, (const char *[]){"--config", file, NULL}), KD_CONFIG_RUN);
    assert_int_equal(cfg.port, 2222);
    assert_int_equal(cfg.log_level, KD_LOG_DEBUG);
    assert_string_equal(cfg.host, "::1");
    kd_config_free(&cfg);

    /* flags over env, both spellings; the flag wins wherever it sits relative to --config */
    assert_int_equal(
        load(&cfg, env, err, (const char *[]){"--port=3333", "--config", file, "--log-level", "error", NULL}),
        KD_CONFIG_RUN);
    assert_int_equal(cfg.port, 3333);
    assert_int_equal(cfg.log_level, KD_LOG_ERROR);
    assert_int_equal(cfg.limits.idle_timeout_ms, 500);
    kd_config_free(&cfg);

    /* KILN_CONFIG names the file when --config is absent */
    char kc[96];
    snprintf(kc, sizeof kc, "KILN_CONFIG=%s", file);
    char *env2[] = {kc, NULL};
    assert_int_equal(load(&cfg, env2, err, NULL), KD_CONFIG_RUN);
    assert_int_equal(cfg.port, 1111);
    kd_config_free(&cfg);
    unlink(file);
}

/* Said, not refused: a file's value the environment overrides, and a KILN_* name one or two edits
 * from a setting's; the engine's and the CLI's own variables draw no warning. */
static void test_notes(void **state)
{
    (void)state;
    const char *file = write_config("{\"port\": 1111, \"host\": \"::1\"}");
    char kc[96];
    snprintf(kc, sizeof kc, "KILN_CONFIG=%s", file);
    char *env[] = {kc,
                   "KILN_PORT=2222",
                   "KILN_HOST=::1",
                   "KILN_LOGLEVEL=debug",
                   "KILN_PROT=9000",
                   "KILN_DRAIN_TIMEOUT=30000",
                   "KILN_URL=http://127.0.0.1:8080",
                   "KILN_TOKEN=t",
                   "KILN_CPU_THREADS=2",
                   "KILN_CPU_FUSION=on",
                   "KILN_CUDA_TF32=1",
                   "KILN_VULKAN_FUSION=off",
                   "NOT_KILN_PORTS=1",
                   NULL};
    struct kd_config cfg;
    char err[512];
    assert_int_equal(load(&cfg, env, err, NULL), KD_CONFIG_RUN);
    assert_int_equal(cfg.port, 2222);
    assert_non_null(cfg.notes);
    const char *expected[] = {
        "port: the environment variable KILN_PORT (2222) overrides the value in config file",
        "host: the environment variable KILN_HOST (::1) overrides",
        "KILN_LOGLEVEL is not a kilnd setting and is ignored; did you mean KILN_LOG_LEVEL (log_level)?",
        "KILN_PROT is not a kilnd setting and is ignored; did you mean KILN_PORT (port)?",
        "KILN_DRAIN_TIMEOUT is not a kilnd setting and is ignored; did you mean KILN_DRAIN_TIMEOUT_MS",
    };
    int lines = 0;
    for (const char *c = cfg.notes; *c; c++)
        lines += *c == '\n';
    assert_int_equal(lines, 5);
    for (size_t i = 0; i < sizeof expected / sizeof *expected; i++)
        if (!strstr(cfg.notes, expected[i]))
            fail_msg("notes lack '%s':\n%s", expected[i], cfg.notes);
    kd_config_free(&cfg);

    /* without the file, the environment overrides nothing; a setting spelt right draws nothing */
    char *env2[] = {"KILN_PORT=2222", "KILN_LOG_LEVEL=debug", NULL};
    assert_int_equal(load(&cfg, env2, err, NULL), KD_CONFIG_RUN);
    assert_null(cfg.notes);
    kd_config_free(&cfg);
    unlink(file);
}

static void test_two_configs_are_independent(void **state)
{
    (void)state;
    struct kd_config a, b;
    char err[512];
    assert_int_equal(load(&a, NULL, err, (const char *[]){"--port", "1", NULL}), KD_CONFIG_RUN);
    assert_int_equal(load(&b, NULL, err, (const char *[]){"--port", "2", NULL}), KD_CONFIG_RUN);
    assert_int_equal(a.port, 1);
    assert_int_equal(b.port, 2);
    kd_config_free(&a);
    kd_config_free(&b);
}

static void test_lists_from_env_and_flags(void **state)
{
    (void)state;
    char *env[] = {"KILN_API_TOKENS=a,b,c", NULL};
    struct kd_config cfg;
    char err[512];
    assert_int_equal(load(&cfg, env, err, (const char *[]){"--devices", "cpu,vulkan:0", NULL}), KD_CONFIG_RUN);
    assert_int_equal(cfg.api_tokens.count, 3);
    assert_string_equal(cfg.api_tokens.items[2], "c");
    assert_int_equal(cfg.devices.count, 2);
    assert_string_equal(cfg.devices.items[1], "vulkan:0");
    kd_config_free(&cfg);
}

static void test_file_errors(void **state)
{
    (void)state;
    struct {
        const char *json;
        const char *key;
    } cases[] = {
        {"{\"prot\": 1}", "prot: unknown key"},
        {"{\"limits\": {\"max_headers\": 1}}", "limits.max_headers: unknown key"},
        {"{\"limits\": 5}", "limits: expected an object"},
        {"{\"port\": \"80\"}", "port: expected an integer"},
        {"{\"port\": 80.5}", "port: expected an integer"},
        {"{\"port\": 70000}", "port: 70000 is out of range"},
        {"{\"port\": -1}", "port: -1 is out of range"},
        {"{\"host\": 5}", "host: expected a string"},
        {"{\"host\": \"\"}", "host: length 0"},
        {"{\"log_level\": \"loud\"}", "log_level: 'loud' is not one of"},
        {"{\"log_format\": 1}", "log_format: expected a string"},
        {"{\"devices\": \"cpu\"}", "devices: expected an array"},
        {"{\"devices\": []}", "devices: 0 items"},
        {"{\"devices\": [\"cpu\", 3]}", "devices: expected an array of strings"},
        {"{\"api_tokens\": [\"\"]}", "api_tokens: items must be non-empty"},
        {"{\"limits\": {\"max_body_bytes\": 1e30}}", "limits.max_body_bytes: 1e+30 is out of range"},
        {"{\"limits\": {\"request_timeout_ms\": 1}}", "limits.request_timeout_ms: 1 is out of range"},
        {"{\"drain_timeout_ms\": true}", "drain_timeout_ms: expected an integer"},
        {"{\"port\": 1", "invalid JSON"},
        {"[1, 2]", "top level must be a JSON object"},
        {"{\"port\": 1} trailing", "invalid JSON"},
        {"{\"port\": 99999999999999999999}", "port: 1e+20 is out of range"},
        /* a NUL inside a string would cut it short unseen: the token would be "x" */
        {"{\"api_tokens\": [\"admin:x\\u0000the-rest-of-the-secret\"]}",
         "a string holds \\u0000 (a NUL character) at byte 24"},
        {"{\"host\": \"0.0.0.0\\u0000\"}", "a string holds \\u0000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *file = write_config(cases[i].json);
        expect_error(NULL, (const char *[]){"--config", file, NULL}, cases[i].key, file);
        unlink(file);
    }
    expect_error(NULL, (const char *[]){"--config", "/nonexistent/kiln.json", NULL}, "/nonexistent/kiln.json",
                 "No such file");
    expect_error(NULL, (const char *[]){"--config", "/tmp", NULL}, "config file /tmp: a folder, not a file", NULL);
    /* an escaped backslash before "u0000" is text, not a NUL: such a string is taken whole */
    const char *file = write_config("{\"log_file\": \"/tmp/a\\\\u0000b.log\", \"port\": 0}");
    struct kd_config cfg;
    char err[512] = "";
    assert_int_equal(load(&cfg, NULL, err, (const char *[]){"--config", file, "--check-config", NULL}),
                     KD_CONFIG_CHECK);
    unlink(file);
    kd_config_free(&cfg);
    expect_error(NULL, (const char *[]){"--config", NULL}, "--config: missing value", NULL);
}

static void test_env_errors(void **state)
{
    (void)state;
    expect_error((char *[]){"KILN_PORT=abc", NULL}, NULL, "port: 'abc' is not an integer", "KILN_PORT");
    expect_error((char *[]){"KILN_PORT=", NULL}, NULL, "port: '' is not an integer", "KILN_PORT");
    expect_error((char *[]){"KILN_PORT=99999999999999999999", NULL}, NULL,
                 "port: 99999999999999999999 is out of range", "KILN_PORT");
    /* digits only: strtoll alone read " 8081" and "+8081" as 8081 */
    expect_error((char *[]){"KILN_PORT= 8081", NULL}, NULL, "port: ' 8081' is not an integer", "KILN_PORT");
    expect_error((char *[]){"KILN_PORT=+8081", NULL}, NULL, "port: '+8081' is not an integer", "KILN_PORT");
    expect_error((char *[]){"KILN_PORT=65536", NULL}, NULL, "port: 65536 is out of range", "KILN_PORT");
    expect_error((char *[]){"KILN_LOG_FORMAT=xml", NULL}, NULL, "log_format: 'xml'", "KILN_LOG_FORMAT");
    expect_error((char *[]){"KILN_DEVICES=cpu,", NULL}, NULL, "devices: items must be non-empty", "KILN_DEVICES");
    expect_error((char *[]){"KILN_DEVICES=", NULL}, NULL, "devices: 0 items", "KILN_DEVICES");
    expect_error((char *[]){"KILN_MAX_HEADER_BYTES=10", NULL}, NULL, "limits.max_header_bytes: 10 is out of range",
                 "KILN_MAX_HEADER_BYTES");
    /* every connection refused is no limit but an outage: 0 is out of range, not "unlimited" */
    expect_error((char *[]){"KILN_MAX_CONNECTIONS=0", NULL}, NULL, "limits.max_connections: 0 is out of range",
                 "KILN_MAX_CONNECTIONS");
}

static void test_flag_errors(void **state)
{
    (void)state;
    expect_error(NULL, (const char *[]){"--port", "x", NULL}, "port: 'x' is not an integer", "flag --port");
    expect_error(NULL, (const char *[]){"--port=99999", NULL}, "port: 99999 is out of range", "flag --port");
    expect_error(NULL, (const char *[]){"--port", NULL}, "port: missing value", "--port");
    expect_error(NULL, (const char *[]){"--prot", "1", NULL}, "unknown flag '--prot'", NULL);
    expect_error(NULL, (const char *[]){"--api-tokens", "x", NULL}, "unknown flag",
                 "tokens are set only in the config file's api_tokens or KILN_API_TOKENS");
    expect_error(NULL, (const char *[]){"--port", "+80", NULL}, "port: '+80' is not an integer", "flag --port");
    expect_error(NULL, (const char *[]){"--grpc-port", "-1", "--port", " 80", NULL},
                 "port: ' 80' is not an integer", NULL);
    expect_error(NULL, (const char *[]){"serve", NULL}, "unexpected argument 'serve'", NULL);
    expect_error(NULL, (const char *[]){"--log-level", "verbose", NULL}, "log_level: 'verbose'", "--log-level");
    expect_error(NULL, (const char *[]){"--data-dir", "", NULL}, "data_dir: length 0", "--data-dir");
    expect_error(NULL, (const char *[]){"--max-connections", "1000001", NULL},
                 "limits.max_connections: 1000001 is out of range", "--max-connections");
    /* A flag error is reported even when env and file were fine. */
    expect_error((char *[]){"KILN_PORT=1", NULL}, (const char *[]){"--idle-timeout-ms", "0", NULL},
                 "limits.idle_timeout_ms: 0 is out of range", "--idle-timeout-ms");
}

/* A key the file gives twice, literally or both nested and dotted, is refused by name: neither
 * the first nor the last may win without a word. */
static void test_file_repeated_keys(void **state)
{
    (void)state;
    struct {
        const char *json;
        const char *key;
    } cases[] = {
        {"{\"port\": 1, \"port\": 2}", "port: given twice"},
        {"{\"limits\": {\"max_body_bytes\": 10, \"max_body_bytes\": 20}}", "limits.max_body_bytes: given twice"},
        {"{\"limits\": {\"max_body_bytes\": 10}, \"limits.max_body_bytes\": 1000}",
         "limits.max_body_bytes: given twice, as a nested key and as the dotted key"},
        {"{\"limits.max_body_bytes\": 1000, \"limits\": {\"max_body_bytes\": 10}}",
         "limits.max_body_bytes: given twice, as a nested key and as the dotted key"},
        {"{\"limits\": {\"max_body_bytes\": 10}, \"limits\": {\"idle_timeout_ms\": 100}}", "limits: given twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *file = write_config(cases[i].json);
        expect_error(NULL, (const char *[]){"--config", file, NULL}, cases[i].key, file);
        unlink(file);
    }
    /* one spelling each, of different keys, is fine */
    const char *file = write_config("{\"limits\": {\"max_body_bytes\": 10}, \"limits.idle_timeout_ms\": 100}");
    struct kd_config cfg;
    char err[512] = "";
    assert_int_equal(load(&cfg, NULL, err, (const char *[]){"--config", file, NULL}), KD_CONFIG_RUN);
    assert_int_equal(cfg.limits.max_body_bytes, 10);
    assert_int_equal(cfg.limits.idle_timeout_ms, 100);
    kd_config_free(&cfg);
    unlink(file);
}

/* api_tokens entries as api/auth.c reads them: a mistyped scope or a token listed twice stops
 * the load, naming the entry by position and never showing its secret. */
static void test_api_token_entries(void **state)
{
    (void)state;
    struct {
        const char *tokens;
        const char *needle;
    } cases[] = {
        {"KILN_API_TOKENS=Admin:SECRET1,read:AAA", "entry 1 starts with 'Admin:', which is not a scope"},
        {"KILN_API_TOKENS=read:AAA,write:SECRET1", "entry 2 starts with 'write:', which is not a scope"},
        {"KILN_API_TOKENS=READ:SECRET1", "entry 1 starts with 'READ:'"},
        {"KILN_API_TOKENS=read:AAA, admin:SECRET1", "entry 2 starts with ' admin:'"},
        {"KILN_API_TOKENS=:SECRET1", "entry 1 starts with ':'"},
        {"KILN_API_TOKENS=averylongsecretpartSECRET1:x", "entry 1 has 26 characters before its first ':'"},
        {"KILN_API_TOKENS=read:SECRET1,admin:SECRET1", "entries 1 and 2 are the same token"},
        {"KILN_API_TOKENS=SECRET1,x,read:SECRET1", "entries 1 and 3 are the same token"},
        {"KILN_API_TOKENS=admin:SECRET1,admin:SECRET1", "entries 1 and 2 are the same token"},
        {"KILN_API_TOKENS=read:ok,admin:", "entry 2 has an empty token"},
        {"KILN_API_TOKENS=read:SECRET1 ,admin:x", "entry 1 has blanks around its token"},
        {"KILN_API_TOKENS=read: SECRET1", "entry 1 has blanks around its token"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kd_config cfg;
        char err[512] = "";
        assert_int_equal(load(&cfg, (char *[]){(char *)cases[i].tokens, NULL}, err, NULL), KD_CONFIG_ERROR);
        if (!strstr(err, cases[i].needle) || !strstr(err, "api_tokens: ") || !strstr(err, "KILN_API_TOKENS"))
            fail_msg("%s: error '%s' lacks '%s'", cases[i].tokens, err, cases[i].needle);
        if (strstr(err, "SECRET1"))
            fail_msg("%s: error '%s' shows the secret", cases[i].tokens, err);
    }
    /* the same rule for the file's list */
    const char *file = write_config("{\"api_tokens\": [\"admin:a\", \"Read:b\"]}");
    expect_error(NULL, (const char *[]){"--config", file, NULL}, "api_tokens: entry 2 starts with 'Read:'", file);
    unlink(file);
    /* what auth.c accepts still loads: both scopes, a bare token, a ':' inside a scoped token */
    struct kd_config cfg;
    char err[512] = "";
    assert_int_equal(load(&cfg, (char *[]){"KILN_API_TOKENS=admin:a1,read:r1,bare,read:x:y", NULL}, err, NULL),
                     KD_CONFIG_RUN);
    assert_int_equal(cfg.api_tokens.count, 4);
    assert_string_equal(cfg.api_tokens.items[3], "read:x:y");
    kd_config_free(&cfg);
}

/* "admin:" followed by n bytes of token, in a static buffer (valid until the next call). */
static const char *long_token_entry(size_t n)
{
    static char entry[20000];
    assert_true(n + 7 <= sizeof entry);
    memcpy(entry, "admin:", 6);
    memset(entry + 6, 't', n);
    entry[6 + n] = '\0';
    return entry;
}

/* The file {"api_tokens": [<entry>]} plus, when limits_first/limits_last is set, a
 * limits.max_header_bytes before or after it. */
static const char *write_token_config(const char *entry, long long limits_first, long long limits_last)
{
    static char json[21000];
    char before[96] = "", after[96] = "";
    if (limits_first)
        snprintf(before, sizeof before, "\"limits\": {\"max_header_bytes\": %lld}, ", limits_first);
    if (limits_last)
        snprintf(after, sizeof after, ", \"limits\": {\"max_header_bytes\": %lld}", limits_last);
    snprintf(json, sizeof json, "{%s\"api_tokens\": [\"%s\"]%s}", before, entry, after);
    return write_config(json);
}

/* A token must fit within limits.max_header_bytes, and that is a rule over two keys: it holds of
 * the merged configuration, whichever layer set either, so a later layer may raise the limit a
 * file's long token needs; one that does not fit in the end names both keys and their origins. */
static void test_token_fits_final_header_limit(void **state)
{
    (void)state;
    struct kd_config cfg;
    char err[512] = "";
    const char *entry = long_token_entry(9000);
    /* the file's token, the environment's limit: valid in the end */
    const char *file = write_token_config(entry, 0, 0);
    if (load(&cfg, (char *[]){"KILN_MAX_HEADER_BYTES=16384", NULL}, err,
             (const char *[]){"--config", file, NULL}) != KD_CONFIG_RUN)
        fail_msg("a file's 9000-byte token with KILN_MAX_HEADER_BYTES=16384 is refused: %s", err);
    assert_int_equal(cfg.limits.max_header_bytes, 16384);
    assert_int_equal(cfg.api_tokens.count, 1);
    assert_int_equal(strlen(cfg.api_tokens.items[0]), 6 + 9000);
    kd_config_free(&cfg);
    /* the same with the limit from a flag */
    if (load(&cfg, NULL, err, (const char *[]){"--config", file, "--max-header-bytes", "9064", NULL}) !=
        KD_CONFIG_RUN)
        fail_msg("a file's 9000-byte token with --max-header-bytes 9064 is refused: %s", err);
    assert_int_equal(cfg.limits.max_header_bytes, 9064);
    kd_config_free(&cfg);
    /* one byte less and it no longer fits: the message names both keys, origins and the limit */
    expect_error(NULL, (const char *[]){"--config", file, "--max-header-bytes", "9063", NULL},
                 "api_tokens: entry 1 (from config file ", " is a 9000-byte token");
    expect_error(
        NULL, (const char *[]){"--config", file, "--max-header-bytes", "9063", NULL},
        "limits.max_header_bytes (9063, from command-line flag --max-header-bytes; a token may have up to "
        "8999 bytes)",
        file);
    /* no layer raises the limit: the default is named as such */
    expect_error(NULL, (const char *[]){"--config", file, NULL},
                 "limits.max_header_bytes (8192, the default; a token may have up to 8128 bytes)", file);
    unlink(file);

    /* within the file, the order of the two keys does not matter */
    for (int limits_first = 0; limits_first < 2; limits_first++) {
        file = write_token_config(entry, limits_first ? 16384 : 0, limits_first ? 0 : 16384);
        if (load(&cfg, NULL, err, (const char *[]){"--config", file, NULL}) != KD_CONFIG_RUN)
            fail_msg("a file with its token %s limits.max_header_bytes is refused: %s",
                     limits_first ? "after" : "before", err);
        assert_int_equal(cfg.limits.max_header_bytes, 16384);
        kd_config_free(&cfg);
        unlink(file);
    }

    /* the file raises the limit, the environment lowers it again: invalid in the end */
    file = write_token_config(entry, 16384, 0);
    expect_error(
        (char *[]){"KILN_MAX_HEADER_BYTES=8192", NULL}, (const char *[]){"--config", file, NULL},
        "api_tokens: entry 1 (from config file ",
        "limits.max_header_bytes (8192, from environment variable KILN_MAX_HEADER_BYTES; a token may have "
        "up to 8128 bytes)");
    unlink(file);

    /* the environment's tokens, the flag's limit; the secret itself is never shown */
    char tokens[700];
    snprintf(tokens, sizeof tokens, "KILN_API_TOKENS=read:ok,%s", long_token_entry(600));
    assert_int_equal(
        load(&cfg, (char *[]){tokens, NULL}, err, (const char *[]){"--max-header-bytes", "512", NULL}),
        KD_CONFIG_ERROR);
    if (!strstr(err, "api_tokens: entry 2 (from environment variable KILN_API_TOKENS) is a 600-byte token") ||
        !strstr(err,
                "limits.max_header_bytes (512, from command-line flag --max-header-bytes; a token may have up "
                "to 448 bytes)") ||
        strstr(err, "tttttttt"))
        fail_msg("error '%s' does not name both keys and their origins, or shows the token", err);
    /* the boundary: a token of max_header_bytes - 64 bytes fits */
    snprintf(tokens, sizeof tokens, "KILN_API_TOKENS=%s", long_token_entry(448));
    assert_int_equal(
        load(&cfg, (char *[]){tokens, NULL}, err, (const char *[]){"--max-header-bytes", "512", NULL}),
        KD_CONFIG_RUN);
    kd_config_free(&cfg);
}

static void test_actions(void **state)
{
    (void)state;
    struct kd_config cfg;
    char err[512];
    assert_int_equal(load(&cfg, NULL, err, (const char *[]){"--help", NULL}), KD_CONFIG_HELP);
    kd_config_free(&cfg);
    assert_int_equal(load(&cfg, NULL, err, (const char *[]){"--version", NULL}), KD_CONFIG_VERSION);
    kd_config_free(&cfg);
    assert_int_equal(load(&cfg, NULL, err, (const char *[]){"--print-config-doc", NULL}), KD_CONFIG_PRINT_DOC);
    kd_config_free(&cfg);
    assert_int_equal(load(&cfg, NULL, err, (const char *[]){"--check-config", "--port", "9", NULL}),
                     KD_CONFIG_CHECK);
    assert_int_equal(cfg.port, 9);
    kd_config_free(&cfg);
    expect_error(NULL, (const char *[]){"--check-config", "--port", "-9", NULL}, "port: -9", NULL);
}

static void test_help_and_doc_list_every_key(void **state)
{
    (void)state;
    char *text = NULL, *doc = NULL;
    size_t n = 0, m = 0;
    FILE *f = open_memstream(&text, &n);
    kd_config_print_help(f, "kilnd");
    fclose(f);
    f = open_memstream(&doc, &m);
    kd_config_print_doc(f);
    fclose(f);
    const char *keys[] = {"host", "port", "data_dir", "devices", "worker_threads", "limits.max_header_bytes",
                          "limits.max_body_bytes", "limits.idle_timeout_ms", "limits.request_timeout_ms",
                          "drain_timeout_ms", "log_level", "log_format", "log_file", "api_tokens", "KILN_PORT",
                          "--check-config", "--config"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        assert_non_null(strstr(text, keys[i]));
        assert_non_null(strstr(doc, keys[i]));
    }
    free(text);
    free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_notes),
        cmocka_unit_test(test_two_configs_are_independent),
        cmocka_unit_test(test_lists_from_env_and_flags),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_env_errors),
        cmocka_unit_test(test_flag_errors),
        cmocka_unit_test(test_file_repeated_keys),
        cmocka_unit_test(test_api_token_entries),
        cmocka_unit_test(test_token_fits_final_header_limit),
        cmocka_unit_test(test_actions),
        cmocka_unit_test(test_help_and_doc_list_every_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
