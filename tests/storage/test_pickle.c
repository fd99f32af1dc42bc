/*
 * tests/storage/test_pickle.c — the restricted unpickler behind the PyTorch (.pt) reader, alone:
 * hostile pickles (globals that would run code, opcodes a weights file never needs, views
 * that leave their storage, bombs) are refused with a message, tensors kiln cannot load are
 * kept with the reason, and other values read as Python's repr writes them.
 * (tests/storage/test_torch_import.c reads whole .pt files.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/kiln.h"
#include "pickle-impl.h"
#include "pickle-test.h"

static void test_pickle_hostile(void **state)
{
    (void)state;
    /* the classic: os.system via GLOBAL + REDUCE, protocol 0 */
    REJECT("cos\nsystem\n(S'echo pwned'\ntR.", "pickle: global 'os.system' is not allowed in a weights file");
    /* builtins.eval via protocol 4 STACK_GLOBAL */
    REJECT("\x80\x04\x8c\x08"
           "builtins\x8c\x04"
           "eval\x93\x8c\x01x\x85R.",
           "global 'builtins.eval' is not allowed");
    REJECT("\x80\x02"
           "ctorch\nload\n.",
           "global 'torch.load' is not allowed in a weights file");
    assert_null(strstr(kiln_error(), "state_dict")); /* a function: no hint */
    /* a class (torch.save(model) pickles the model's) gets one */
    REJECT("\x80\x02"
           "c__main__\nNet\n.",
           "global '__main__.Net' is not allowed in a weights file (a pickled object, such as a whole model from "
           "torch.save(model)? save model.state_dict() instead)");
    REJECT("\x80\x02"
           "ctorch\nUntypedStorage\n.",
           "not allowed");
    REJECT("\x80\x06.", "protocol 6");
    REJECT("", "no STOP");
    REJECT("\x80\x02]", "no STOP");
    REJECT(".", "stack underflow");
    REJECT("(.", "stack underflow"); /* a MARK hides what is below it */
    REJECT("h\x05.", "memo index 5 was never stored");
    /* text memo opcodes (protocol 0): the index line is checked byte by byte */
    REJECT("Np1x\n.", "malformed memo index");
    REJECT("Np\n.", "malformed memo index");
    REJECT("Ng123456789012345678901234\n.", "malformed memo index");
    REJECT("Ng7\n.", "memo index 7 was never stored");
    REJECT("Nr\xff\xff\x3f\x00.", "is beyond the 1 values made so far");
    REJECT("X\xff\xff\xff\x7f", "exceeds");
    REJECT("X\x10\x00\x00\x00"
           "abc",
           "truncated");
    REJECT("\x8a\x81xyz.", "truncated"); /* a LONG1 longer than the data */
    REJECT("K\x01K\x02K\x03s.", "SETITEM on something that is not a dict");
    REJECT("}(K\x01u.", "odd number");
    REJECT("\x80\x02"
           "ccollections\nOrderedDict\nK\x01R.",
           "not a tuple");
    REJECT("\x80\x02"
           "ctorch\nFloatStorage\n)R.",
           "cannot be called");
    REJECT("\xff", "opcode 0xff is not supported");
    REJECT("i__main__\nX\n.", "opcode 'i'");
    /* a persistent id that is not torch's storage tuple */
    REJECT("X\x01\x00\x00\x00"
           "aQ.",
           "5-tuple");
    /* a tensor whose view leaves its storage: 4 floats, offset 2, size (3,) */
    REJECT(REBUILD STORAGE4 "K\x02K\x03\x85K\x01\x85\x89}tR.", "reaches element 4 of storage '0', which holds 4");
    REJECT(REBUILD STORAGE4 "J\xff\xff\xff\xffK\x01\x85K\x01\x85\x89}tR.", "negative");
    REJECT(REBUILD STORAGE4 "K\x00K\x02\x85)\x89}tR.", "equal length");
    /* the seventh argument: torch._neg_view(x) (and a conjugate view) store x's values with a
     * flag; read as stored they would load with their signs flipped */
    REJECT(REBUILD STORAGE4 "K\x01K\x03\x85K\x01\x85\x89}}X\x03\x00\x00\x00neg\x88stR.", "lazily negated view");
    REJECT(REBUILD STORAGE4 "K\x01K\x03\x85K\x01\x85\x89}}X\x04\x00\x00\x00"
                            "conj\x88stR.",
           "lazily conjugated");
    REJECT(REBUILD STORAGE4 "K\x01K\x03\x85K\x01\x85\x89}}X\x03\x00\x00\x00odd\x88stR.", "metadata 'odd'");
    /* metadata that flags nothing is a plain tensor */
    static const char plain_empty[] = REBUILD STORAGE4 "K\x01K\x03\x85K\x01\x85\x89}}tR.",
                      plain_false[] = REBUILD STORAGE4 "K\x01K\x03\x85K\x01\x85\x89}}X\x03\x00\x00\x00neg\x89stR.",
                      plain_none[] = REBUILD STORAGE4 "K\x01K\x03\x85K\x01\x85\x89}NtR.";
    const struct {
        const char *p;
        size_t n;
    } plain[] = {{plain_empty, sizeof plain_empty - 1},
                 {plain_false, sizeof plain_false - 1},
                 {plain_none, sizeof plain_none - 1}};
    for (int i = 0; i < 3; i++) {
        kiln__pickle *pp = kiln__pickle_load(plain[i].p, plain[i].n, "test", NULL);
        if (!pp)
            fail_msg("plain metadata %d: %s", i, kiln_error());
        assert_int_equal(kiln__pickle_root(pp)->kind, KILN__PK_TENSOR);
        assert_int_equal(kiln__pickle_root(pp)->u.tensor->size[0], 3);
        kiln__pickle_free(pp);
    }
    /* an expanded view (stride 0, 9 elements of a 4-element storage) and a 9-d one are kept
     * with the reason, not refused: the file opens and only loading them fails (by name) */
    static const char expanded[] = REBUILD STORAGE4 "K\x00K\x03K\x03\x86K\x00K\x00\x86\x89}tR.",
                      deep9[] = REBUILD STORAGE4 "K\x00(K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x01t"
                                                 "(K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x01t\x89}tR.";
    kiln__pickle *pe = kiln__pickle_load(expanded, sizeof expanded - 1, "test", NULL);
    if (!pe)
        fail_msg("expanded view: %s", kiln_error());
    assert_string_equal(kiln__pickle_root(pe)->u.tensor->refused,
                        "is a view with 9 elements of a storage of 4 (an expand()ed tensor), which kiln does not "
                        "load; save x.contiguous() instead");
    kiln__pickle_free(pe);
    pe = kiln__pickle_load(deep9, sizeof deep9 - 1, "test", NULL);
    if (!pe)
        fail_msg("9-d view: %s", kiln_error());
    assert_true(kiln__pickle_root(pe)->u.tensor->too_many_dims);
    assert_int_equal(kiln__pickle_root(pe)->u.tensor->ndim, 0);
    assert_string_equal(kiln__pickle_root(pe)->u.tensor->refused,
                        "has 9 dimensions, more than the 8 kiln supports");
    kiln__pickle_free(pe);
    /* a 9-d view that leaves its storage is still damage: the file is refused */
    REJECT(REBUILD STORAGE4 "K\x00(K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x02t"
                            "(K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x01K\x04t\x89}tR.",
           "reaches element 4 of storage '0'");
    /* the same view inside its storage is fine */
    const char ok[] = REBUILD STORAGE4 "K\x01K\x03\x85K\x01\x85\x89}tR.";
    kiln__pickle *p = kiln__pickle_load(ok, sizeof ok - 1, "test", NULL);
    if (!p)
        fail_msg("%s", kiln_error());
    const kiln__pk_value *root = kiln__pickle_root(p);
    assert_int_equal(root->kind, KILN__PK_TENSOR);
    assert_int_equal(root->u.tensor->offset, 1);
    assert_int_equal(root->u.tensor->size[0], 3);
    kiln__pickle_free(p);

    /* limits: deep MARK nesting, long stacks, many values */
    char *deep = malloc(10000);
    memset(deep, '(', 10000);
    expect_pickle_reject(deep, 10000, "MARKs nested deeper");
    memset(deep, 'N', 10000);
    kiln__pickle_limits lim = {.max_objects = 100};
    kiln_error_clear();
    assert_null(kiln__pickle_load(deep, 10000, "test", &lim));
    assert_non_null(strstr(kiln_error(), "more than 100 values"));
    free(deep);
    /* a self-containing list: loads (it is data), flattening must bound its depth */
    const char cyc[] = "]q\x00h\x00"
                       "a.";
    p = kiln__pickle_load(cyc, sizeof cyc - 1, "test", NULL);
    assert_non_null(p);
    kiln__pickle_free(p);
}

/* Non-tensor values read as Python's repr writes them (record.h's promise): the shortest
 * float that reads back, ".0" on integral floats, exponents past 1e16 and below 1e-4, and
 * strings quoted and escaped as repr quotes and escapes them. */
static void test_other_values_as_python_prints(void **state)
{
    (void)state;
    static const struct {
        const char *pickle;
        size_t len;
        const char *want;
    } cases[] = {
        {"\x47\x3f\xb9\x99\x99\x99\x99\x99\x9a\x2e", 10, "0.1"},
        {"\x47\x40\x00\x00\x00\x00\x00\x00\x00\x2e", 10, "2.0"},
        {"\x47\x80\x00\x00\x00\x00\x00\x00\x00\x2e", 10, "-0.0"},
        {"\x47\x43\x41\xc3\x79\x37\xe0\x80\x00\x2e", 10, "1e+16"},
        {"\x47\x43\x0c\x6b\xf5\x26\x34\x00\x00\x2e", 10, "1000000000000000.0"},
        {"\x47\x3e\xe4\xf8\xb5\x88\xe3\x68\xf1\x2e", 10, "1e-05"},
        {"\x47\x3f\x1a\x36\xe2\xeb\x1c\x43\x2d\x2e", 10, "0.0001"},
        {"\x47\x40\x5e\xdd\x2f\x1a\x9f\xbe\x77\x2e", 10, "123.456"},
        {"\x47\x7e\x41\xeb\x2d\x66\x00\x58\x35\x2e", 10, "1.5e+300"},
        {"\x47\x7f\xf0\x00\x00\x00\x00\x00\x00\x2e", 10, "inf"},
        {"\x47\x7f\xf8\x00\x00\x00\x00\x00\x00\x2e", 10, "nan"},
        {"\x47\x00\x00\x00\x00\x00\x00\x00\x01\x2e", 10, "5e-324"},
        {"\x47\x3f\xd5\x55\x55\x55\x55\x55\x55\x2e", 10, "0.3333333333333333"},
        {"\x47\xbe\x90\xc6\xf7\xa0\xb5\xed\x8d\x2e", 10, "-2.5e-07"},
        {"\x47\x43\x45\xee\x2a\x2e\xb5\xa5\xc4\x2e", 10, "1.2345678901234568e+16"},
        {"\x58\x07\x00\x00\x00\x71\x27\x75\x6f\x74\x65\x0a\x2e", 13, "\"q'uote\\n\""},
        {"\x58\x04\x00\x00\x00\x61\x22\x62\x27\x2e", 10, "'a\"b\\''"},
        {"\x58\x04\x00\x00\x00\x74\x61\x62\x09\x2e", 10, "'tab\\t'"},
        {"\x58\x01\x00\x00\x00\x01\x2e", 7, "'\\x01'"},
        {"\x58\x02\x00\x00\x00\xc3\xa9\x2e", 8, "'é'"},
        {"\x58\x0a\x00\x00\x00\x62\x61\x63\x6b\x5c\x73\x6c\x61\x73\x68\x2e", 16, "'back\\\\slash'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        (void)expect_pickle_describes(cases[i].pickle, cases[i].len, cases[i].want, i);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pickle_hostile),
        cmocka_unit_test(test_other_values_as_python_prints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
