/*
 * tests/optim/test-optim.c — the optimizers against PyTorch (every config of the
 * fixture, 20 steps, parameters compared after every step), state export and import
 * (a run saved mid-way and restored into a fresh optimizer continues exactly as the
 * uninterrupted run), gradient accumulation, gradient clipping against
 * clip_grad_norm_, and bad inputs (a NaN or negative lr set after creation among them).
 */
#include <unistd.h>

#include "fixture.h"

#define RTOL 1e-5
#define ATOL 1e-6

static kiln_optim_config config_of(const cJSON *c)
{
    int kind = kiln_optim_kind_from_name(jstr(c, "kind"));
    assert_true(kind >= 0);
    kiln_optim_config cfg = kiln_optim_config_default((kiln_optim_kind)kind);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(c, "config");
    cfg.lr = jnum(o, "lr", cfg.lr);
    cfg.weight_decay = jnum(o, "weight_decay", cfg.weight_decay);
    cfg.momentum = jnum(o, "momentum", cfg.momentum);
    cfg.dampening = jnum(o, "dampening", cfg.dampening);
    cfg.nesterov = jnum(o, "nesterov", cfg.nesterov) != 0;
    cfg.beta1 = jnum(o, "beta1", cfg.beta1);
    cfg.beta2 = jnum(o, "beta2", cfg.beta2);
    cfg.eps = jnum(o, "eps", cfg.eps);
    cfg.amsgrad = jnum(o, "amsgrad", cfg.amsgrad) != 0;
    cfg.alpha = jnum(o, "alpha", cfg.alpha);
    cfg.centered = jnum(o, "centered", cfg.centered) != 0;
    cfg.lr_decay = jnum(o, "lr_decay", cfg.lr_decay);
    cfg.initial_accumulator_value = jnum(o, "initial_accumulator_value", cfg.initial_accumulator_value);
    cfg.maximize = jnum(o, "maximize", cfg.maximize) != 0;
    return cfg;
}

static const cJSON *opt_section(void) { return cJSON_GetObjectItemCaseSensitive(ref_doc, "optimizers"); }

static bool skipped(const char *param, int step)
{
    const cJSON *skip = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(opt_section(), "skip"),
                                                         param);
    const cJSON *s;
    cJSON_ArrayForEach(s, skip) if ((int)s->valuedouble == step) return true;
    return false;
}

/* Step s's gradients (b has none at the fixture's skip steps). */
static void grads_at(int s, kiln_tensor *gw_all, kiln_tensor *gb_all, kiln_tensor **g)
{
    g[0] = kiln_squeeze(kiln_narrow(gw_all, 0, s, 1), 0);
    g[1] = skipped("b", s) ? NULL : kiln_squeeze(kiln_narrow(gb_all, 0, s, 1), 0);
}

/* Fresh copies of the fixture's starting parameters (owned by the caller). */
static void fresh_params(kiln_tensor **p)
{
    kiln_scope_begin();
    p[0] = kiln_keep(kiln_clone(ref_tensor("opt.init.w")));
    p[1] = kiln_keep(kiln_clone(ref_tensor("opt.init.b")));
    kiln_scope_end();
}

static const char *const pnames[] = {"w", "b"};

static void test_optimizers_match_pytorch(void **state)
{
    (void)state;
    const cJSON *c;
    int steps = (int)jnum(opt_section(), "steps", 0);
    int ncases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(opt_section(), "cases"))
    {
        const char *name = jstr(c, "name");
        kiln_optim_config cfg = config_of(c);
        kiln_tensor *p[2];
        fresh_params(p);
        kiln_optim *opt = kiln_optim_create(&cfg, 2, p, pnames);
        if (!opt)
            fail_msg("%s: %s", name, kiln_error());
        kiln_scope_begin();
        kiln_tensor *gw = ref_tensor("opt.grads.w"), *gb = ref_tensor("opt.grads.b");
        kiln_tensor *tw = ref_tensor("opt.%s.w", name), *tb = ref_tensor("opt.%s.b", name);
        for (int s = 0; s < steps; s++) {
            kiln_scope_begin();
            kiln_tensor *g[2];
            grads_at(s, gw, gb, g);
            if (kiln_optim_step_grads(opt, g) != 1)
                fail_msg("%s step %d: %s", name, s, kiln_error());
            char what[128];
            snprintf(what, sizeof what, "%s step %d w", name, s + 1);
            expect_close(p[0], kiln_squeeze(kiln_narrow(tw, 0, s, 1), 0), RTOL, ATOL, what);
            snprintf(what, sizeof what, "%s step %d b", name, s + 1);
            expect_close(p[1], kiln_squeeze(kiln_narrow(tb, 0, s, 1), 0), RTOL, ATOL, what);
            kiln_scope_end();
        }
        kiln_scope_end();
        assert_int_equal(kiln_optim_steps(opt), steps);
        kiln_optim_free(opt);
        kiln_tensor_release(p[0]);
        kiln_tensor_release(p[1]);
        ncases++;
    }
    assert_true(ncases >= 15);
}

/* Run `total` steps of config c, saving after `cut` steps and continuing in a fresh
 * optimizer restored from the file (or from an in-memory export); the result must
 * equal the uninterrupted run exactly. */
static void run_resumed(const cJSON *c, int cut, int total, bool via_file, int accumulate)
{
    const char *name = jstr(c, "name");
    kiln_optim_config cfg = config_of(c);
    cfg.accumulate_steps = accumulate;
    kiln_tensor *a[2], *b[2];
    fresh_params(a);
    fresh_params(b);
    kiln_optim *oa = kiln_optim_create(&cfg, 2, a, pnames);
    kiln_optim *ob = kiln_optim_create(&cfg, 2, b, pnames);
    assert_non_null(oa);
    assert_non_null(ob);
    kiln_scope_begin();
    kiln_tensor *gw = ref_tensor("opt.grads.w"), *gb = ref_tensor("opt.grads.b");
    char path[] = "/tmp/kiln-optim-state-XXXXXX";
    for (int s = 0; s < total; s++) {
        kiln_scope_begin();
        kiln_tensor *g[2];
        grads_at(s, gw, gb, g);
        assert_true(kiln_optim_step_grads(oa, g) >= 0);
        assert_true(kiln_optim_step_grads(ob, g) >= 0);
        kiln_scope_end();
        if (s + 1 != cut)
            continue;
        /* Replace ob by a fresh optimizer over fresh tensors holding b's values. */
        kiln_tensor *nb[2];
        kiln_scope_begin();
        nb[0] = kiln_keep(kiln_clone(b[0]));
        nb[1] = kiln_keep(kiln_clone(b[1]));
        kiln_scope_end();
        kiln_optim_config other = kiln_optim_config_default(cfg.kind); /* import restores cfg */
        other.accumulate_steps = accumulate;
        kiln_optim *fresh = kiln_optim_create(&other, 2, nb, pnames);
        assert_non_null(fresh);
        if (via_file) {
            int fd = mkstemp(path);
            assert_true(fd >= 0);
            close(fd);
            if (kiln_optim_state_save(ob, path) < 0 || kiln_optim_state_load(fresh, path) < 0)
                fail_msg("%s: save/load: %s", name, kiln_error());
            unlink(path);
        } else {
            kiln_optim_state st;
            assert_int_equal(kiln_optim_state_export(ob, &st), 0);
            if (kiln_optim_state_import(fresh, st.n, (const char *const *)st.names, st.tensors, st.json) < 0)
                fail_msg("%s: import: %s", name, kiln_error());
            kiln_optim_state_free(&st);
        }
        assert_int_equal(kiln_optim_steps(fresh), kiln_optim_steps(ob));
        kiln_optim_free(ob);
        kiln_tensor_release(b[0]);
        kiln_tensor_release(b[1]);
        ob = fresh;
        b[0] = nb[0];
        b[1] = nb[1];
    }
    for (int i = 0; i < 2; i++) {
        int64_t n = kiln_tensor_numel(a[i]);
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        assert_int_equal(kiln_to_data(a[i], x, sizeof(float) * (size_t)n), 0);
        assert_int_equal(kiln_to_data(b[i], y, sizeof(float) * (size_t)n), 0);
        if (memcmp(x, y, sizeof(float) * (size_t)n) != 0)
            fail_msg("%s: resumed run differs from the uninterrupted one (param %s)", name, pnames[i]);
        free(x);
        free(y);
    }
    kiln_scope_end();
    kiln_optim_free(oa);
    kiln_optim_free(ob);
    for (int i = 0; i < 2; i++) {
        kiln_tensor_release(a[i]);
        kiln_tensor_release(b[i]);
    }
}

static void test_state_resume_exact(void **state)
{
    (void)state;
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(opt_section(), "cases"))
    {
        run_resumed(c, 7, 14, k % 2 == 0, 1);
        k++;
    }
    /* Saved in the middle of an accumulation window (7 = 2 * 3 + 1). */
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(opt_section(), "cases"), 5);
    run_resumed(first, 7, 15, true, 3);
    run_resumed(first, 7, 15, false, 3);
}

static void test_state_contents(void **state)
{
    (void)state;
    kiln_tensor *p[2];
    fresh_params(p);
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    cfg.amsgrad = true;
    kiln_optim *opt = kiln_optim_create(&cfg, 2, p, pnames);
    kiln_scope_begin();
    kiln_tensor *g[2] = {kiln_ones_like(p[0]), NULL};
    assert_int_equal(kiln_optim_step_grads(opt, g), 1);
    kiln_scope_end();
    kiln_optim_state st;
    assert_int_equal(kiln_optim_state_export(opt, &st), 0);
    /* b never had a gradient: no state for it, as PyTorch keeps none. */
    assert_int_equal(st.n, 3);
    assert_string_equal(st.names[0], "w.exp_avg");
    assert_string_equal(st.names[1], "w.exp_avg_sq");
    assert_string_equal(st.names[2], "w.max_exp_avg_sq");
    assert_non_null(strstr(st.json, "\"kind\":\"adam\""));
    assert_non_null(strstr(st.json, "\"step\":1"));
    /* The export is a copy: a later step does not change it. */
    float before[12], after[12];
    assert_int_equal(kiln_to_data(st.tensors[0], before, sizeof before), 0);
    kiln_scope_begin();
    g[0] = kiln_ones_like(p[0]);
    assert_int_equal(kiln_optim_step_grads(opt, g), 1);
    kiln_scope_end();
    assert_int_equal(kiln_to_data(st.tensors[0], after, sizeof after), 0);
    assert_memory_equal(before, after, sizeof before);

    /* Wrong kind, wrong names, wrong shapes, garbage: refused, optimizer untouched. */
    kiln_optim_config sgd = kiln_optim_config_default(KILN_OPTIM_SGD);
    kiln_optim *o2 = kiln_optim_create(&sgd, 2, p, pnames);
    assert_true(kiln_optim_state_import(o2, st.n, (const char *const *)st.names, st.tensors, st.json) < 0);
    assert_non_null(strstr(kiln_error(), "adam"));
    kiln_optim_free(o2);
    const char *other[] = {"x", "y"};
    kiln_optim *o3 = kiln_optim_create(&cfg, 2, p, other);
    assert_true(kiln_optim_state_import(o3, st.n, (const char *const *)st.names, st.tensors, st.json) < 0);
    assert_non_null(strstr(kiln_error(), "\"w\""));
    assert_true(kiln_optim_state_import(o3, 0, NULL, NULL, "{not json") < 0);
    assert_true(kiln_optim_state_import(o3, 0, NULL, NULL, "{\"format\":\"kiln-optim-1\"}") < 0);
    kiln_optim_free(o3);
    kiln_scope_begin();
    kiln_tensor *wrong = kiln_zeros(dev, KILN_F32, KILN_SHAPE(3, 4));
    kiln_tensor *ts[3] = {wrong, st.tensors[1], st.tensors[2]};
    assert_true(kiln_optim_state_import(opt, 3, (const char *const *)st.names, ts, st.json) < 0);
    assert_non_null(strstr(kiln_error(), "w.exp_avg"));
    kiln_scope_end();
    assert_int_equal(kiln_optim_steps(opt), 2);
    assert_true(kiln_optim_state_load(opt, "/nonexistent/state.safetensors") < 0);
    kiln_optim_state_free(&st);
    kiln_optim_free(opt);
    kiln_tensor_release(p[0]);
    kiln_tensor_release(p[1]);
}

/* accumulate_steps = 3: two calls only accumulate; the third updates with the mean,
 * exactly as one step with the averaged gradient. */
static void test_accumulation(void **state)
{
    (void)state;
    kiln_tensor *a[2], *b[2];
    fresh_params(a);
    fresh_params(b);
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    cfg.lr = 0.05;
    kiln_optim *plain = kiln_optim_create(&cfg, 2, a, pnames);
    cfg.accumulate_steps = 3;
    kiln_optim *acc = kiln_optim_create(&cfg, 2, b, pnames);
    kiln_scope_begin();
    kiln_tensor *gw = ref_tensor("opt.grads.w"), *gb = ref_tensor("opt.grads.b");
    for (int round = 0; round < 2; round++) {
        kiln_tensor *sum[2] = {kiln_zeros_like(a[0]), kiln_zeros_like(a[1])};
        for (int k = 0; k < 3; k++) {
            kiln_tensor *g[2] = {kiln_squeeze(kiln_narrow(gw, 0, round * 3 + k, 1), 0),
                                 kiln_squeeze(kiln_narrow(gb, 0, round * 3 + k, 1), 0)};
            assert_int_equal(kiln_optim_step_grads(acc, g), k == 2 ? 1 : 0);
            sum[0] = kiln_add(sum[0], g[0]);
            sum[1] = kiln_add(sum[1], g[1]);
        }
        kiln_tensor *mean[2] = {kiln_mul_scalar(sum[0], 1.0 / 3), kiln_mul_scalar(sum[1], 1.0 / 3)};
        assert_int_equal(kiln_optim_step_grads(plain, mean), 1);
        expect_close(b[0], a[0], 1e-6, 1e-7, "accumulated w");
        expect_close(b[1], a[1], 1e-6, 1e-7, "accumulated b");
    }
    kiln_scope_end();
    assert_int_equal(kiln_optim_steps(acc), 2);
    kiln_optim_free(plain);
    kiln_optim_free(acc);
    for (int i = 0; i < 2; i++) {
        kiln_tensor_release(a[i]);
        kiln_tensor_release(b[i]);
    }
}

static void test_clip_matches_pytorch(void **state)
{
    (void)state;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(ref_doc, "clipping"))
    {
        const char *name = jstr(c, "name");
        const char *nt = jstr(c, "norm_type");
        double norm_type = nt ? INFINITY : jnum(c, "norm_type", 2);
        kiln_scope_begin();
        kiln_tensor *g[3] = {kiln_clone(ref_tensor("clip.grad0")), NULL, kiln_clone(ref_tensor("clip.grad1"))};
        double norm = kiln_grads_clip_norm(3, g, jnum(c, "max_norm", 1), norm_type);
        if (norm < 0)
            fail_msg("%s: %s", name, kiln_error());
        double want = jnum(c, "norm", 0);
        if (fabs(norm - want) > 1e-5 * want)
            fail_msg("%s: norm %.9g, PyTorch %.9g", name, norm, want);
        expect_close(g[0], ref_tensor("clip.%s.grad0", name), RTOL, ATOL, name);
        expect_close(g[2], ref_tensor("clip.%s.grad1", name), RTOL, ATOL, name);
        kiln_scope_end();
    }
    kiln_scope_begin();
    kiln_tensor *g[1] = {kiln_clone(ref_tensor("clip.grad0"))};
    assert_int_equal(kiln_grads_clip_value(1, g, 0.5), 0);
    expect_close(g[0], kiln_clamp(ref_tensor("clip.grad0"), -0.5, 0.5), 0, 0, "clip by value");
    assert_true(kiln_grads_clip_value(1, g, -1) < 0);
    assert_true(kiln_grads_clip_norm(1, g, 1, 0) < 0);
    kiln_tensor *ig[1] = {kiln_zeros(dev, KILN_I64, KILN_SHAPE(3))};
    assert_true(kiln_grads_clip_norm(1, ig, 1, 2) < 0);
    /* An infinite gradient under the inf norm: the norm is inf, as PyTorch's, and the
     * clip coefficient 1 / inf = 0 leaves [0, 0] and [inf * 0, 0] = [NaN, 0]; before, the
     * running max turned inf into NaN and every gradient became NaN. */
    kiln_tensor *fg[2] = {kiln_from_data(dev, KILN_F32, KILN_SHAPE(2), (float[]){3, 4}, 2 * sizeof(float)),
                          kiln_from_data(dev, KILN_F32, KILN_SHAPE(2), (float[]){INFINITY, 1}, 2 * sizeof(float))};
    assert_true(isinf(kiln_grads_clip_norm(2, fg, 1, INFINITY)));
    float got[4];
    assert_int_equal(kiln_to_data(fg[0], got, 2 * sizeof(float)), 0);
    assert_int_equal(kiln_to_data(fg[1], got + 2, 2 * sizeof(float)), 0);
    assert_true(got[0] == 0 && got[1] == 0 && isnan(got[2]) && got[3] == 0);
    kiln_scope_end();
}

static void test_bad_inputs(void **state)
{
    (void)state;
    kiln_tensor *p[2];
    fresh_params(p);
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_SGD);
    cfg.nesterov = true;
    assert_null(kiln_optim_create(&cfg, 2, p, pnames));
    assert_non_null(strstr(kiln_error(), "nesterov"));
    cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    cfg.beta2 = 1.0;
    assert_null(kiln_optim_create(&cfg, 2, p, pnames));
    assert_non_null(strstr(kiln_error(), "betas"));
    cfg = kiln_optim_config_default(KILN_OPTIM_RMSPROP);
    cfg.lr = -1;
    assert_null(kiln_optim_create(&cfg, 2, p, pnames));
    cfg = kiln_optim_config_default(KILN_OPTIM_ADAGRAD);
    kiln_tensor *dup[2] = {p[0], p[0]};
    assert_null(kiln_optim_create(&cfg, 2, dup, NULL));
    const char *same[] = {"a", "a"};
    assert_null(kiln_optim_create(&cfg, 2, p, same));
    kiln_scope_begin();
    kiln_tensor *ip[1] = {kiln_zeros(dev, KILN_I32, KILN_SHAPE(2))};
    assert_null(kiln_optim_create(&cfg, 1, ip, NULL));
    assert_non_null(strstr(kiln_error(), "not floating"));
    kiln_scope_end();

    /* A gradient of the wrong shape: an error naming both, and nothing changes. */
    kiln_optim *opt = kiln_optim_create(&cfg, 2, p, pnames);
    assert_non_null(opt);
    kiln_scope_begin();
    kiln_tensor *before = kiln_clone(p[1]);
    kiln_tensor *g[2] = {kiln_ones(dev, KILN_F32, KILN_SHAPE(3, 4)), kiln_ones_like(p[1])};
    assert_true(kiln_optim_step_grads(opt, g) < 0);
    assert_non_null(strstr(kiln_error(), "f32[3, 4]"));
    assert_non_null(strstr(kiln_error(), "\"w\""));
    expect_close(p[1], before, 0, 0, "untouched after a failed step");
    assert_int_equal(kiln_optim_steps(opt), 0);
    /* All gradients NULL: nothing is updated, so 0 (optim.h: 1 means updated) and the
     * step is not counted; it used to return 1 and count one update. */
    kiln_tensor *none[2] = {NULL, NULL};
    assert_int_equal(kiln_optim_step_grads(opt, none), 0);
    assert_int_equal(kiln_optim_steps(opt), 0);
    expect_close(p[1], before, 0, 0, "untouched by a step without gradients");
    kiln_scope_end();
    assert_true(kiln_optim_step_grads(NULL, NULL) < 0);
    assert_int_equal(kiln_optim_set_lr(opt, 0.5), 0);
    assert_true(kiln_optim_lr(opt) == 0.5);
    assert_string_equal(kiln_optim_param_name(opt, 1), "b");
    assert_ptr_equal(kiln_optim_param(opt, 0), p[0]);
    assert_null(kiln_optim_param(opt, 2));
    kiln_optim_free(opt);
    kiln_optim_free(NULL);
    kiln_tensor_release(p[0]);
    kiln_tensor_release(p[1]);
}

/* An empty parameter list and a non-leaf parameter are refused (both were accepted), and
 * kiln_optim_step before any backward updates nothing: 0, not counted, no state made. */
static void test_create_and_step_edges(void **state)
{
    (void)state;
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    assert_null(kiln_optim_create(&cfg, 0, NULL, NULL));
    assert_non_null(strstr(kiln_error(), "optim_create: adam: empty parameter list"));
    kiln_tensor *w = kiln_requires_grad(kiln_ones(dev, KILN_F32, KILN_SHAPE(3)), true);
    kiln_tensor *nl = kiln_mul_scalar(w, 2);
    assert_null(kiln_optim_create(&cfg, 1, &nl, (const char *[]){"twice"}));
    assert_non_null(strstr(kiln_error(), "can't optimize a non-leaf tensor: parameter 0 \"twice\" (f32[3])"));
    kiln_tensor *both[2] = {w, nl};
    assert_null(kiln_optim_create(&cfg, 2, both, NULL));
    assert_non_null(strstr(kiln_error(), "can't optimize a non-leaf tensor: parameter 1 (f32[3])"));

    kiln_optim *opt = kiln_optim_create(&cfg, 1, &w, (const char *[]){"w"});
    assert_non_null(opt);
    assert_int_equal(kiln_optim_step(opt), 0);
    assert_int_equal(kiln_optim_steps(opt), 0);
    kiln_optim_state st;
    assert_int_equal(kiln_optim_state_export(opt, &st), 0);
    assert_int_equal(st.n, 0); /* no Adam state was created */
    kiln_optim_state_free(&st);
    float v[3];
    assert_int_equal(kiln_to_data(w, v, sizeof v), 0);
    assert_true(v[0] == 1 && v[1] == 1 && v[2] == 1);
    /* with a gradient it updates, and counts */
    kiln_scope_begin();
    assert_int_equal(kiln_backward(kiln_sum(kiln_mul_scalar(w, 3), KILN_ALL_DIMS, false), NULL), 0);
    kiln_scope_end();
    assert_int_equal(kiln_optim_step(opt), 1);
    assert_int_equal(kiln_optim_steps(opt), 1);
    kiln_optim_free(opt);
    kiln_tensor_release(nl);
    kiln_tensor_release(w);
}

/* The parameter shapes the state records must be the optimizer's, also when no state
 * tensor exists yet (SGD without momentum, Adam before its first step): a state of w[3]
 * loaded into w[5] without a word. */
static void test_state_shape_checked(void **state)
{
    (void)state;
    kiln_tensor *w3 = kiln_requires_grad(kiln_ones(dev, KILN_F32, KILN_SHAPE(3)), true);
    kiln_tensor *w5 = kiln_requires_grad(kiln_ones(dev, KILN_F32, KILN_SHAPE(5)), true);
    kiln_tensor *w23 = kiln_requires_grad(kiln_ones(dev, KILN_F32, KILN_SHAPE(2, 3)), true);
    const char *nm[] = {"w"};
    const kiln_optim_kind kinds[] = {KILN_OPTIM_SGD, KILN_OPTIM_ADAM};
    for (int k = 0; k < 2; k++) {
        kiln_optim_config cfg = kiln_optim_config_default(kinds[k]);
        kiln_optim *a = kiln_optim_create(&cfg, 1, &w3, nm);
        kiln_optim *b = kiln_optim_create(&cfg, 1, &w5, nm);
        kiln_optim *c = kiln_optim_create(&cfg, 1, &w23, nm);
        char path[] = "/tmp/kiln-optim-shape-XXXXXX";
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        close(fd);
        assert_int_equal(kiln_optim_state_save(a, path), 0);
        assert_int_equal(kiln_optim_state_load(b, path), -1);
        assert_non_null(strstr(kiln_error(), "parameter \"w\" has shape [3] in the state but [5] here"));
        kiln_optim_state st;
        assert_int_equal(kiln_optim_state_export(a, &st), 0);
        assert_int_equal(kiln_optim_state_import(c, st.n, (const char *const *)st.names, st.tensors, st.json), -1);
        assert_non_null(strstr(kiln_error(), "has shape [3] in the state but [2, 3] here"));
        assert_int_equal(kiln_optim_state_import(a, st.n, (const char *const *)st.names, st.tensors, st.json), 0);
        kiln_optim_state_free(&st);
        assert_int_equal(kiln_optim_state_load(a, path), 0);
        unlink(path);
        kiln_optim_free(a);
        kiln_optim_free(b);
        kiln_optim_free(c);
    }
    /* A state whose shape entry is missing or malformed is refused too. */
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_SGD);
    kiln_optim *a = kiln_optim_create(&cfg, 1, &w3, nm);
    kiln_optim_state st;
    assert_int_equal(kiln_optim_state_export(a, &st), 0);
    char *json = strdup(st.json), *at = strstr(json, "\"shape\":[3]");
    assert_non_null(at);
    memcpy(at, "\"shape\":\"3\"", strlen("\"shape\":[3]"));
    assert_int_equal(kiln_optim_state_import(a, 0, NULL, NULL, json), -1);
    assert_non_null(strstr(kiln_error(), "parameter \"w\": missing or invalid shape"));
    free(json);
    kiln_optim_state_free(&st);
    kiln_optim_free(a);
    kiln_tensor_release(w3);
    kiln_tensor_release(w5);
    kiln_tensor_release(w23);
}

/* kiln_optim_set_lr and _set_momentum refuse what kiln_optim_create refuses (a NaN lr
 * would reach every parameter on the next step) and change nothing then; valid values
 * still drive the update. */
static void test_set_lr_refuses_non_finite(void **state)
{
    (void)state;
    kiln_tensor *p = kiln_requires_grad(kiln_ones(dev, KILN_F32, KILN_SHAPE(2)), true);
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_SGD);
    cfg.lr = 0.1;
    kiln_optim *opt = kiln_optim_create(&cfg, 1, &p, NULL);
    assert_non_null(opt);
    const double bad[] = {NAN, INFINITY, -INFINITY, -0.5};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(kiln_optim_set_lr(opt, bad[i]), -1);
        assert_non_null(strstr(kiln_error(), "optim_set_lr"));
        assert_non_null(strstr(kiln_error(), "learning rate"));
        assert_true(kiln_optim_lr(opt) == 0.1);
    }
    assert_int_equal(kiln_optim_set_lr(NULL, 0.1), -1);
    cfg.lr = INFINITY;
    assert_null(kiln_optim_create(&cfg, 1, &p, NULL));
    assert_int_equal(kiln_optim_set_momentum(opt, NAN), -1);
    assert_int_equal(kiln_optim_set_momentum(opt, -1), -1);
    assert_true(kiln_optim_get_config(opt).momentum == 0);
    /* p - lr * g with lr 0.25 and g = 2: 1 - 0.5. */
    assert_int_equal(kiln_optim_set_lr(opt, 0.25), 0);
    kiln_scope_begin();
    kiln_tensor *g[1] = {kiln_full(dev, KILN_F32, KILN_SHAPE(2), 2.0)};
    assert_int_equal(kiln_optim_step_grads(opt, g), 1);
    kiln_scope_end();
    float v[2];
    assert_int_equal(kiln_to_data(p, v, sizeof v), 0);
    assert_true(v[0] == 0.5f && v[1] == 0.5f);
    kiln_optim_free(opt);

    /* Adam: beta1 must stay in [0, 1). */
    cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    opt = kiln_optim_create(&cfg, 1, &p, NULL);
    assert_int_equal(kiln_optim_set_momentum(opt, 1.0), -1);
    assert_non_null(strstr(kiln_error(), "betas"));
    assert_true(kiln_optim_get_config(opt).beta1 == 0.9);
    assert_int_equal(kiln_optim_set_momentum(opt, 0.8), 0);
    assert_true(kiln_optim_get_config(opt).beta1 == 0.8);
    kiln_optim_free(opt);
    kiln_tensor_release(p);
}

int main(int argc, char **argv);

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_optimizers_match_pytorch),
    cmocka_unit_test(test_state_resume_exact),
    cmocka_unit_test(test_state_contents),
    cmocka_unit_test(test_accumulation),
    cmocka_unit_test(test_clip_matches_pytorch),
    cmocka_unit_test(test_bad_inputs),
    cmocka_unit_test(test_set_lr_refuses_non_finite),
    cmocka_unit_test(test_create_and_step_edges),
    cmocka_unit_test(test_state_shape_checked),
};

FIXTURE_MAIN(tests)
