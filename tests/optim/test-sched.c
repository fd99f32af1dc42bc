/*
 * tests/optim/test-sched.c — the learning-rate schedulers against PyTorch's
 * lr_scheduler sequences (50 steps each; one-cycle's momentum too), the closed form
 * kiln_sched_lr_at against the stepped object, state export and import mid-run,
 * invalid configs, and every path to a NaN lr (one-cycle past total_steps above all).
 */
#include "fixture.h"

static int sched_kind(const char *name)
{
    for (int k = 0; k < KILN_SCHED_KIND_COUNT; k++)
        if (strcmp(kiln_sched_kind_name((kiln_sched_kind)k), name) == 0)
            return k;
    fail_msg("unknown scheduler kind %s", name);
    return -1;
}

static kiln_sched_config config_of(const cJSON *c)
{
    kiln_sched_config s = kiln_sched_config_default((kiln_sched_kind)sched_kind(jstr(c, "kind")));
    s.factor = jnum(c, "factor", s.factor);
    s.total_iters = (int64_t)jnum(c, "total_iters", (double)s.total_iters);
    s.start_factor = jnum(c, "start_factor", s.start_factor);
    s.end_factor = jnum(c, "end_factor", s.end_factor);
    s.gamma = jnum(c, "gamma", s.gamma);
    s.step_size = (int64_t)jnum(c, "step_size", (double)s.step_size);
    const cJSON *m, *ms = cJSON_GetObjectItemCaseSensitive(c, "milestones");
    cJSON_ArrayForEach(m, ms) s.milestones[s.nmilestones++] = (int64_t)m->valuedouble;
    s.t_max = (int64_t)jnum(c, "t_max", (double)s.t_max);
    s.eta_min = jnum(c, "eta_min", s.eta_min);
    s.t_0 = (int64_t)jnum(c, "t_0", (double)s.t_0);
    s.t_mult = (int64_t)jnum(c, "t_mult", (double)s.t_mult);
    s.max_lr = jnum(c, "max_lr", s.max_lr);
    s.total_steps = (int64_t)jnum(c, "total_steps", (double)s.total_steps);
    s.pct_start = jnum(c, "pct_start", s.pct_start);
    s.anneal_linear = jnum(c, "anneal_linear", s.anneal_linear) != 0;
    s.div_factor = jnum(c, "div_factor", s.div_factor);
    s.final_div_factor = jnum(c, "final_div_factor", s.final_div_factor);
    s.base_momentum = jnum(c, "base_momentum", s.base_momentum);
    s.max_momentum = jnum(c, "max_momentum", s.max_momentum);
    s.d_model = (int64_t)jnum(c, "d_model", (double)s.d_model);
    s.noam_warmup = (int64_t)jnum(c, "noam_warmup", (double)s.noam_warmup);
    s.warmup_steps = (int64_t)jnum(c, "warmup_steps", (double)s.warmup_steps);
    s.warmup_start_factor = jnum(c, "warmup_start_factor", s.warmup_start_factor);
    return s;
}

static void check_value(const char *name, const char *what, int t, double got, double want)
{
    double err = fabs(got - want);
    double rel = err / (fabs(want) + 1e-9);
    if (rel > worst_rel)
        worst_rel = rel;
    if (!(err <= 1e-9 * fabs(want) + 1e-13))
        fail_msg("%s: %s at step %d is %.17g, PyTorch %.17g", name, what, t, got, want);
}

/* A scalar parameter and an SGD optimizer with momentum, as the generator used. */
static kiln_optim *sgd_for(double lr, kiln_tensor **p)
{
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_SGD);
    oc.lr = lr;
    oc.momentum = 0.9;
    *p = kiln_zeros(dev, KILN_F32, KILN_SHAPE(1));
    kiln_optim *opt = kiln_optim_create(&oc, 1, p, NULL);
    assert_non_null(opt);
    return opt;
}

static void test_schedulers_match_pytorch(void **state)
{
    (void)state;
    const cJSON *c;
    int ncases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(ref_doc, "schedulers"))
    {
        const char *name = jstr(c, "name");
        int steps = (int)jnum(c, "steps", 0);
        double base = jnum(c, "base_lr", 0.1);
        kiln_sched_config cfg = config_of(cJSON_GetObjectItemCaseSensitive(c, "config"));
        kiln_tensor *p;
        kiln_optim *opt = sgd_for(base, &p);
        kiln_sched *s = kiln_sched_create(&cfg, opt);
        if (!s)
            fail_msg("%s: %s", name, kiln_error());
        kiln_scope_begin(); /* holds the fixture tensors */
        double *lr = host_f64(ref_tensor("sched.%s.lr", name));
        bool mom = jnum(c, "momentum", 0) != 0;
        double *m = mom ? host_f64(ref_tensor("sched.%s.momentum", name)) : NULL;
        for (int t = 0; t < steps; t++) {
            check_value(name, "lr", t, kiln_optim_lr(opt), lr[t]);
            check_value(name, "closed-form lr", t, kiln_sched_lr_at(&cfg, base, t), lr[t]);
            if (mom)
                check_value(name, "momentum", t, kiln_optim_get_config(opt).momentum, m[t]);
            kiln_sched_step(s);
        }
        kiln_scope_end();
        free(lr);
        free(m);
        kiln_sched_free(s);
        kiln_optim_free(opt);
        kiln_tensor_release(p);
        ncases++;
    }
    assert_true(ncases >= 14);
}

/* Export after 17 steps, import into a fresh scheduler driving a fresh optimizer:
 * both continue with the same lr. */
static void test_sched_state(void **state)
{
    (void)state;
    kiln_sched_config cfg = kiln_sched_config_default(KILN_SCHED_COSINE_RESTARTS);
    cfg.t_0 = 4;
    cfg.t_mult = 2;
    cfg.warmup_steps = 3;
    kiln_tensor *pa, *pb;
    kiln_optim *oa = sgd_for(0.2, &pa), *ob = sgd_for(0.2, &pb);
    kiln_sched *a = kiln_sched_create(&cfg, oa);
    for (int t = 0; t < 17; t++)
        kiln_sched_step(a);
    char *json = kiln_sched_state_export(a);
    assert_non_null(json);
    kiln_optim_set_lr(ob, 123); /* the import must not depend on the optimizer's lr */
    kiln_sched *b = kiln_sched_create(&cfg, ob);
    assert_int_equal(kiln_sched_state_import(b, json), 0);
    assert_int_equal(kiln_sched_last_step(b), 17);
    for (int t = 0; t < 20; t++) {
        assert_true(kiln_optim_lr(oa) == kiln_optim_lr(ob));
        assert_true(kiln_sched_lr(a) == kiln_sched_lr(b));
        kiln_sched_step(a);
        kiln_sched_step(b);
    }
    /* A state of another kind, or garbage, is refused. */
    kiln_sched_config other = kiln_sched_config_default(KILN_SCHED_EXPONENTIAL);
    kiln_sched *c = kiln_sched_create(&other, NULL);
    assert_true(kiln_sched_state_import(c, json) < 0);
    assert_non_null(strstr(kiln_error(), "cosine_restarts"));
    assert_true(kiln_sched_state_import(c, "[1, 2") < 0);
    assert_true(kiln_sched_state_import(c, "{\"format\":\"kiln-sched-1\",\"kind\":\"exponential\",\"step\":-4,"
                                           "\"base_lr\":1}") < 0);
    free(json);
    kiln_sched_free(a);
    kiln_sched_free(b);
    kiln_sched_free(c);
    kiln_optim_free(oa);
    kiln_optim_free(ob);
    kiln_tensor_release(pa);
    kiln_tensor_release(pb);
}

static void test_sched_adam_momentum(void **state)
{
    (void)state;
    /* One-cycle drives Adam's beta1 the way PyTorch's OneCycleLR does. */
    kiln_tensor *p = kiln_zeros(dev, KILN_F32, KILN_SHAPE(2));
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAM);
    kiln_optim *opt = kiln_optim_create(&oc, 1, &p, NULL);
    kiln_sched_config cfg = kiln_sched_config_default(KILN_SCHED_ONE_CYCLE);
    cfg.total_steps = 10;
    kiln_sched *s = kiln_sched_create(&cfg, opt);
    assert_true(fabs(kiln_optim_get_config(opt).beta1 - 0.95) < 1e-12);
    assert_true(fabs(kiln_optim_lr(opt) - 0.1 / 25) < 1e-15);
    kiln_sched_step(s);
    assert_true(kiln_optim_get_config(opt).beta1 < 0.95);
    kiln_sched_free(s);
    kiln_optim_free(opt);
    kiln_tensor_release(p);
}

static void test_sched_bad_configs(void **state)
{
    (void)state;
    kiln_sched_config c = kiln_sched_config_default(KILN_SCHED_STEP);
    c.step_size = 0;
    assert_null(kiln_sched_create(&c, NULL));
    assert_non_null(strstr(kiln_error(), "step_size"));
    c = kiln_sched_config_default(KILN_SCHED_COSINE);
    c.t_max = 0;
    assert_true(isnan(kiln_sched_lr_at(&c, 1, 3)));
    c = kiln_sched_config_default(KILN_SCHED_MULTISTEP);
    c.nmilestones = 2;
    c.milestones[0] = 5;
    c.milestones[1] = 3;
    assert_null(kiln_sched_create(&c, NULL));
    c = kiln_sched_config_default(KILN_SCHED_ONE_CYCLE);
    c.total_steps = 10;
    assert_true(isnan(kiln_sched_lr_at(&c, 1, 11)));
    assert_non_null(strstr(kiln_error(), "total_steps"));
    c = kiln_sched_config_default(KILN_SCHED_EXPONENTIAL);
    c.warmup_steps = 3;
    c.warmup_start_factor = 0;
    assert_null(kiln_sched_create(&c, NULL));
    c.warmup_start_factor = 0.5;
    assert_true(isnan(kiln_sched_lr_at(&c, 1, -1)));
    assert_null(kiln_sched_create(NULL, NULL));
    assert_true(isnan(kiln_sched_step(NULL)));
    assert_true(isnan(kiln_sched_momentum_at(&c, 2)));
}

/* One-cycle stepped past total_steps: PyTorch raises ("Tried to step 5 times"); here the
 * step is refused with a message and nothing changes, so the optimizer keeps a finite lr
 * and the next update writes finite numbers (it used to write NaN into the parameter). */
static void test_one_cycle_past_total(void **state)
{
    (void)state;
    kiln_tensor *p = kiln_ones(dev, KILN_F32, KILN_SHAPE(1));
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_SGD);
    oc.lr = 0.1;
    kiln_optim *opt = kiln_optim_create(&oc, 1, &p, NULL);
    kiln_sched_config c = kiln_sched_config_default(KILN_SCHED_ONE_CYCLE);
    c.max_lr = 1;
    c.total_steps = 4;
    c.cycle_momentum = false;
    kiln_sched *s = kiln_sched_create(&c, opt);
    assert_non_null(s);
    /* PyTorch's OneCycleLR(max_lr=1, total_steps=4): steps 1..4 (4 is still allowed). */
    const double want[4] = {0.811745653949763, 0.28306099820869923, 4e-06, 0.2830609982086991};
    for (int t = 0; t < 4; t++) {
        double lr = kiln_sched_step(s);
        assert_true(fabs(lr - want[t]) <= 1e-12);
        assert_true(kiln_optim_lr(opt) == lr);
    }
    assert_true(isnan(kiln_sched_step(s)));
    assert_non_null(strstr(kiln_error(), "step 5 is past total_steps 4"));
    assert_int_equal(kiln_sched_last_step(s), 4);
    assert_true(kiln_sched_lr(s) == kiln_optim_lr(opt));
    assert_true(fabs(kiln_optim_lr(opt) - want[3]) <= 1e-12);
    /* The next update uses the last valid lr: 1 - lr · 1. */
    kiln_scope_begin();
    kiln_tensor *g[1] = {kiln_ones(dev, KILN_F32, KILN_SHAPE(1))};
    assert_int_equal(kiln_optim_step_grads(opt, g), 1);
    kiln_scope_end();
    float v;
    assert_int_equal(kiln_to_data(p, &v, sizeof v), 0);
    assert_true(fabs((double)v - (1 - want[3])) <= 1e-6);
    /* A state past the end is refused by check and import alike; a valid one restores. */
    const char *past = "{\"format\":\"kiln-sched-1\",\"kind\":\"one_cycle\",\"step\":5,\"base_lr\":0.1}";
    const char *third = "{\"format\":\"kiln-sched-1\",\"kind\":\"one_cycle\",\"step\":3,\"base_lr\":0.1}";
    assert_int_equal(kiln_sched_state_check(s, past), -1);
    assert_non_null(strstr(kiln_error(), "total_steps"));
    assert_int_equal(kiln_sched_state_import(s, past), -1);
    assert_int_equal(kiln_sched_last_step(s), 4);
    assert_int_equal(kiln_sched_state_check(s, third), 0);
    assert_int_equal(kiln_sched_last_step(s), 4);
    assert_int_equal(kiln_sched_state_import(s, third), 0);
    assert_int_equal(kiln_sched_last_step(s), 3);
    assert_true(fabs(kiln_optim_lr(opt) - 4e-06) <= 1e-15);
    kiln_sched_free(s);
    kiln_optim_free(opt);
    kiln_tensor_release(p);
}

/* The other ways a schedule could hand the optimizer NaN or a negative lr: refused at
 * creation, or at the step that would produce it (nothing changes then). */
static void test_sched_nan_paths(void **state)
{
    (void)state;
    kiln_sched_config c = kiln_sched_config_default(KILN_SCHED_EXPONENTIAL);
    c.gamma = NAN;
    assert_null(kiln_sched_create(&c, NULL));
    assert_non_null(strstr(kiln_error(), "gamma"));
    c.gamma = -0.5;
    assert_null(kiln_sched_create(&c, NULL));
    c = kiln_sched_config_default(KILN_SCHED_COSINE);
    c.eta_min = NAN;
    assert_null(kiln_sched_create(&c, NULL));
    assert_non_null(strstr(kiln_error(), "eta_min"));
    c = kiln_sched_config_default(KILN_SCHED_ONE_CYCLE);
    c.max_lr = NAN;
    assert_null(kiln_sched_create(&c, NULL));
    assert_non_null(strstr(kiln_error(), "max_lr"));
    c = kiln_sched_config_default(KILN_SCHED_NOAM);
    c.factor = NAN;
    assert_null(kiln_sched_create(&c, NULL));
    c = kiln_sched_config_default(KILN_SCHED_STEP);
    assert_null(kiln_sched_create_base(&c, NULL, NAN));
    assert_non_null(strstr(kiln_error(), "base lr"));
    assert_null(kiln_sched_create_base(&c, NULL, -1));
    /* A one-cycle whose first phase has zero length (pct_start * total_steps = 1): 0/0 at
     * step 0, where PyTorch divides by zero and raises. */
    c = kiln_sched_config_default(KILN_SCHED_ONE_CYCLE);
    c.total_steps = 10;
    c.pct_start = 0.1;
    assert_null(kiln_sched_create(&c, NULL));
    assert_non_null(strstr(kiln_error(), "not a finite number"));
    c.pct_start = 0.3;
    kiln_sched *s = kiln_sched_create(&c, NULL);
    assert_non_null(s);
    kiln_sched_free(s);
    /* An exponential that overflows: the step to inf is refused, the last lr stays. */
    c = kiln_sched_config_default(KILN_SCHED_EXPONENTIAL);
    c.gamma = 1e300;
    s = kiln_sched_create_base(&c, NULL, 1);
    assert_non_null(s);
    assert_true(kiln_sched_step(s) == 1e300);
    assert_true(isnan(kiln_sched_step(s)));
    assert_non_null(strstr(kiln_error(), "not a finite number"));
    assert_int_equal(kiln_sched_last_step(s), 1);
    assert_true(kiln_sched_lr(s) == 1e300);
    assert_true(isnan(kiln_sched_lr_at(&c, 1, 2)));
    kiln_sched_free(s);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_schedulers_match_pytorch),
    cmocka_unit_test(test_sched_state),
    cmocka_unit_test(test_sched_adam_momentum),
    cmocka_unit_test(test_sched_bad_configs),
    /* every path to a NaN lr */
    cmocka_unit_test(test_one_cycle_past_total),
    cmocka_unit_test(test_sched_nan_paths),
};

FIXTURE_MAIN(tests)
