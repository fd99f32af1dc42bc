/*
 * tests/unit/test_log.c — kilnd's log lines (daemon/log.c) when a message carries bytes of its
 * own (a model folder's name can hold any byte but '/' and NUL):
 *   - a text line escapes newlines, tabs, backslashes, other control characters and bytes
 *     that are not well-formed UTF-8, so a name cannot start a forged line of its own (it did);
 *   - a JSON line stays one valid JSON object in valid UTF-8: a stray byte becomes U+FFFD
 *     (it was copied as it was, and strict shippers refused the line), well-formed UTF-8 is
 *     kept as it is;
 *   - a message cut at the log's length limit is not cut inside a character.
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

#include <cjson/cJSON.h>

#include "common/utf8.h"
#include "daemon/log.h"

static char dir[64];
static char path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-log-XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, sizeof path, "%s/kilnd.log", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    rmdir(dir);
    return 0;
}

/* Writes msg at warn through a fresh log of the format; the file's bytes, NUL-ended. */
static char *write_one(enum kd_log_format format, const char *msg, size_t *len)
{
    unlink(path);
    struct kd_log log;
    char err[256];
    assert_int_equal(kd_log_open(&log, path, KD_LOG_INFO, format, err, sizeof err), 0);
    kd_log_write(&log, KD_LOG_WARN, "model %s not loaded", msg);
    kd_log_close(&log);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[8192];
    *len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[*len] = '\0';
    return buf;
}

static const char FORGED[] = "nl\n2026-11-28T00:00:00.000Z error FORGED\tx\\y \xff\xc3\xa9 \x01";

static void test_text_line_escapes_what_would_forge_a_line(void **state)
{
    (void)state;
    size_t n;
    char *line = write_one(KD_LOG_TEXT, FORGED, &n);
    /* one line: the only newline ends it */
    assert_ptr_equal(strchr(line, '\n'), line + n - 1);
    assert_null(strchr(line, '\t'));
    assert_non_null(strstr(line,
                           " warn  model nl\\n2026-11-28T00:00:00.000Z error FORGED\\tx\\\\y \\xFF\xc3\xa9 \\x01 "
                           "not loaded\n"));
    assert_int_equal(kiln_utf8_invalid_at((const unsigned char *)line, n), -1);
}

static void test_json_line_is_valid_json_in_utf8(void **state)
{
    (void)state;
    size_t n;
    char *line = write_one(KD_LOG_JSON, FORGED, &n);
    assert_ptr_equal(strchr(line, '\n'), line + n - 1);
    assert_int_equal(kiln_utf8_invalid_at((const unsigned char *)line, n), -1);
    cJSON *j = cJSON_Parse(line);
    assert_non_null(j);
    const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(j, "msg"));
    assert_non_null(msg);
    /* the stray 0xff is U+FFFD (EF BF BD); the well-formed e-acute stays */
    assert_string_equal(
        msg, "model nl\n2026-11-28T00:00:00.000Z error FORGED\tx\\y \xef\xbf\xbd\xc3\xa9 \x01 not loaded");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(j, "level")), "warn");
    cJSON_Delete(j);
}

static void test_long_message_is_not_cut_inside_a_character(void **state)
{
    (void)state;
    /* 3000 bytes of two-byte characters, past the message limit, cut somewhere inside */
    char *big = malloc(3001);
    assert_non_null(big);
    for (int i = 0; i < 1500; i++)
        memcpy(big + 2 * i, "\xc3\xa9", 2);
    big[3000] = '\0';
    for (int shift = 0; shift < 2; shift++) {
        for (enum kd_log_format f = KD_LOG_TEXT; f <= KD_LOG_JSON; f++) {
            size_t n;
            char *line = write_one(f, big + shift, &n);
            assert_true(n > 1000);
            assert_ptr_equal(strchr(line, '\n'), line + n - 1);
            assert_int_equal(kiln_utf8_invalid_at((const unsigned char *)line, n), -1);
            if (f == KD_LOG_JSON) {
                cJSON *j = cJSON_Parse(line);
                assert_non_null(j);
                cJSON_Delete(j);
            }
        }
    }
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_line_escapes_what_would_forge_a_line),
        cmocka_unit_test(test_json_line_is_valid_json_in_utf8),
        cmocka_unit_test(test_long_message_is_not_cut_inside_a_character),
    };
    return cmocka_run_group_tests_name("log", tests, setup, teardown);
}
