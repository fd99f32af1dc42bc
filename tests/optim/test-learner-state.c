/*
 * tests/optim/test-learner-state.c — the Learner's checks and its resume (suite
 * 'training'): a model with dropout (a Dropout layer and attention dropout) resumed from
 * an epoch checkpoint and from a mid-epoch one ends with the same weights, bit for bit,
 * as the uninterrupted run; a checkpoint written before module generators were saved
 * still resumes (with a notice); a resume that fails (another optimizer kind, another
 * scheduler, a model with other modules) changes nothing; bad configs and an optimizer
 * over another model are refused at creation; one-cycle running past its total_steps
 * stops fit with an error instead of training on a NaN lr.
 *
 *     learner-state [device]   (default "cpu?threads=1")
 */
#include <math.h>
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

#include "kiln/kiln.h"
#include "kiln/record.h"

#include "learner-fixture.h"

/* Linear, ReLU, Dropout, then self-attention with dropout on [N, 4, 4]: two modules with
 * their own random streams. */
static const char DROP_NET[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 16}, "
    "\"inputs\": [\"x\"]},"
    "{\"name\": \"a\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"drop\", \"layer\": \"Dropout\", \"config\": {\"p\": 0.2}, \"inputs\": [\"a\"]},"
    "{\"name\": \"seq\", \"op\": \"reshape\", \"shape\": [-1, 4, 4], \"inputs\": [\"drop\"]},"
    "{\"name\": \"attn\", \"layer\": \"MultiheadAttention\", \"config\": {\"embed_dim\": 4, \"num_heads\": 1, "
    "\"dropout\": 0.3, \"batch_first\": true}, \"inputs\": [\"seq\"]},"
    "{\"name\": \"flat\", \"op\": \"flatten\", \"inputs\": [\"attn\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 16, \"out_features\": 3}, "
    "\"inputs\": [\"flat\"]}"
    "], \"outputs\": [\"fc2\"]}";

/* The same parameters without any dropout module. */
static const char PLAIN_NET[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 16}, "
    "\"inputs\": [\"x\"]},"
    "{\"name\": \"a\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"seq\", \"op\": \"reshape\", \"shape\": [-1, 4, 4], \"inputs\": [\"a\"]},"
    "{\"name\": \"attn\", \"layer\": \"MultiheadAttention\", \"config\": {\"embed_dim\": 4, \"num_heads\": 1, "
    "\"batch_first\": true}, \"inputs\": [\"seq\"]},"
    "{\"name\": \"flat\", \"op\": \"flatten\", \"inputs\": [\"attn\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 16, \"out_features\": 3}, "
    "\"inputs\": [\"flat\"]}"
    "], \"outputs\": [\"fc2\"]}";

static int setup(void **state)
{
    (void)state;
    return learner_fixture_open(160, 48, "learner-state");
}

/* ------------------------------------------------------------------- one run */

typedef struct run {
    kiln_module *m;
    kiln_optim *o;
    kiln_sched *s;
    kiln_loader *tl, *vl;
    kiln_learner *L;
    int64_t cancel_at; /* cancel after this many optimizer steps (0: never) */
    FILE *progress;
} run;

typedef struct run_opts {
    const char *net;
    uint64_t init_seed;
    kiln_optim_kind optim;
    kiln_sched_kind sched;
    const char *ckdir;
    int64_t epochs, every_steps, cancel_at;
    FILE *progress;
} run_opts;

static void on_step(void *ud, const kiln_train_event *ev)
{
    run *r = ud;
    if (ev->kind == KILN_EVENT_STEP && r->cancel_at > 0 && ev->step >= r->cancel_at)
        kiln_learner_cancel(r->L);
}

static void make_run(run *r, const run_opts *o)
{
    memset(r, 0, sizeof *r);
    kiln_generator g = kiln_generator_make(o->init_seed);
    r->m = kiln_model_from_json(o->net, dev, &g);
    assert_non_null(r->m);
    kiln_optim_config oc = kiln_optim_config_default(o->optim);
    oc.lr = 0.01;
    r->o = kiln_optim_create_module(&oc, r->m);
    kiln_sched_config sc = kiln_sched_config_default(o->sched);
    sc.t_max = 100;
    sc.warmup_steps = 5;
    sc.warmup_start_factor = 0.1;
    r->s = kiln_sched_create(&sc, r->o);
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = 16;
    lc.seed = 3;
    r->tl = kiln_loader_create(train_ds, &lc, dev);
    lc.shuffle = false;
    r->vl = kiln_loader_create(valid_ds, &lc, dev);
    kiln_learner_config c = kiln_learner_config_default();
    c.epochs = o->epochs;
    c.num_classes = 3;
    c.topk = 2;
    c.seed = 99;
    c.checkpoint_dir = o->ckdir;
    c.checkpoint_every_steps = o->every_steps;
    c.keep_last = 10;
    c.progress = o->progress;
    r->cancel_at = o->cancel_at;
    r->L = kiln_learner_create(&c, r->m, r->o, r->s, r->tl, r->vl);
    if (!r->L)
        fail_msg("learner_create: %s", kiln_error());
    assert_int_equal(kiln_learner_subscribe(r->L, on_step, r), 0);
}

static void free_run(run *r)
{
    kiln_learner_free(r->L);
    kiln_loader_free(r->tl);
    kiln_loader_free(r->vl);
    kiln_sched_free(r->s);
    kiln_optim_free(r->o);
    kiln_module_free(r->m);
}

/* Every parameter and buffer of m, flattened, into a malloc'd array of *n floats. */
static float *weights(kiln_module *m, size_t *n)
{
    int k = kiln_module_state_dict(m, NULL, 0);
    kiln_named_tensor *sd = calloc((size_t)k, sizeof *sd);
    kiln_module_state_dict(m, sd, k);
    size_t total = 0;
    for (int i = 0; i < k; i++)
        total += (size_t)kiln_tensor_numel(sd[i].tensor);
    float *w = malloc(total * sizeof *w), *p = w;
    for (int i = 0; i < k; i++) {
        size_t e = (size_t)kiln_tensor_numel(sd[i].tensor);
        assert_int_equal(kiln_to_data(sd[i].tensor, p, e * sizeof *w), 0);
        p += e;
    }
    free(sd);
    *n = total;
    return w;
}

static void expect_same_weights(const float *a, const float *b, size_t n, const char *what)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
    if (memcmp(a, b, n * sizeof *a) != 0)
        fail_msg("%s: weights differ from the uninterrupted run (max |diff| %g)", what, worst);
}

static void path_in_root(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", root, name);
}

/* ---------------------------------------------------------------- the tests */

/* Three epochs straight, against one epoch then a resume into a freshly built model (other
 * initial weights and streams), and against a cancel at step 15 then a resume from the
 * step-12 checkpoint: the same weights, bit for bit. Without the module generators in the
 * checkpoint the resumed runs drew other dropout masks (the trial saw 0.038 apart). */
static void test_dropout_resume_exact(void **state)
{
    (void)state;
    char a_dir[300], b_dir[300], b2_dir[300], c_dir[300];
    path_in_root(a_dir, sizeof a_dir, "drop-a");
    path_in_root(b_dir, sizeof b_dir, "drop-b");
    path_in_root(b2_dir, sizeof b2_dir, "drop-b2");
    path_in_root(c_dir, sizeof c_dir, "drop-c");
    run r;
    run_opts o = {.net = DROP_NET,
                  .init_seed = 11,
                  .optim = KILN_OPTIM_ADAMW,
                  .sched = KILN_SCHED_COSINE,
                  .ckdir = a_dir,
                  .epochs = 3};
    make_run(&r, &o);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    assert_int_equal(kiln_learner_step(r.L), 30);
    size_t n;
    float *wa = weights(r.m, &n);
    free_run(&r);

    o.ckdir = b_dir;
    o.epochs = 1;
    make_run(&r, &o);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    free_run(&r);
    o.ckdir = b2_dir;
    o.epochs = 3;
    o.init_seed = 12;
    make_run(&r, &o);
    if (kiln_learner_resume(r.L, b_dir) < 0)
        fail_msg("resume: %s", kiln_error());
    assert_int_equal(kiln_learner_epoch(r.L), 1);
    assert_int_equal(kiln_learner_step(r.L), 10);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    size_t nb;
    float *wb = weights(r.m, &nb);
    assert_int_equal(nb, n);
    expect_same_weights(wa, wb, n, "epoch-boundary resume");
    free_run(&r);

    o.ckdir = c_dir;
    o.init_seed = 11;
    o.every_steps = 3;
    o.cancel_at = 15;
    make_run(&r, &o);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    assert_string_equal(kiln_learner_stop_reason(r.L), "cancelled");
    free_run(&r);
    o.cancel_at = 0;
    o.init_seed = 13;
    make_run(&r, &o);
    if (kiln_learner_resume(r.L, c_dir) < 0)
        fail_msg("resume: %s", kiln_error());
    assert_int_equal(kiln_learner_step(r.L), 15);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    float *wc = weights(r.m, &nb);
    expect_same_weights(wa, wc, n, "mid-epoch resume");
    free_run(&r);
    free(wa);
    free(wb);
    free(wc);
}

/* Rewrite checkpoint src as the learner wrote it before module generators were saved:
 * the learner's generator only, and no "generators" in metrics.json. */
static void write_old_format(const char *src, const char *dst_root)
{
    kiln_ckpt *ck = kiln_ckpt_open(src);
    assert_non_null(ck);
    const kiln_record *recs[2] = {kiln_ckpt_model(ck), kiln_ckpt_optimizer(ck)};
    char **names[2];
    kiln_tensor **ts[2];
    int counts[2];
    for (int r = 0; r < 2; r++) {
        const kiln_safetensors *st = kiln_record_tensors(recs[r]);
        counts[r] = kiln_safetensors_count(st);
        names[r] = calloc((size_t)counts[r] + 1, sizeof *names[r]);
        ts[r] = calloc((size_t)counts[r] + 1, sizeof *ts[r]);
        for (int i = 0; i < counts[r]; i++) {
            names[r][i] = strdup(kiln_safetensors_name(st, i));
            ts[r][i] = kiln_safetensors_load(st, names[r][i], dev);
            assert_non_null(ts[r][i]);
        }
    }
    cJSON *pos = cJSON_Parse(kiln_ckpt_metrics_history(ck));
    assert_non_null(cJSON_GetObjectItemCaseSensitive(pos, "generators"));
    cJSON_DeleteItemFromObjectCaseSensitive(pos, "generators");
    char *pos_text = cJSON_PrintUnformatted(pos);
    kiln_generator g[8];
    assert_true(kiln_ckpt_rng(ck, g, 8) > 1);
    kiln_ckpt_state s = {
        .step = kiln_ckpt_step(ck),
        .epoch = kiln_ckpt_epoch(ck),
        .model_n = counts[0],
        .model_names = (const char *const *)names[0],
        .model_tensors = ts[0],
        .optim_n = counts[1],
        .optim_names = (const char *const *)names[1],
        .optim_tensors = ts[1],
        .optim_config = kiln_record_config(recs[1]),
        .scheduler_json = kiln_ckpt_scheduler(ck),
        .rng_n = 1,
        .rng = g,
        .metrics_json = pos_text,
    };
    assert_int_equal(kiln_ckpt_save(dst_root, &s, NULL, 0), 0);
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < counts[r]; i++) {
            free(names[r][i]);
            kiln_tensor_release(ts[r][i]);
        }
        free(names[r]);
        free(ts[r]);
    }
    free(pos_text);
    cJSON_Delete(pos);
    kiln_ckpt_close(ck);
}

/* A checkpoint without module generators resumes as before: with no dropout in the model
 * exactly; with dropout it runs (the modules keep their own streams) and says so. */
static void test_old_checkpoint_resumes(void **state)
{
    (void)state;
    char a_dir[300], b_dir[300], old_dir[300];
    path_in_root(a_dir, sizeof a_dir, "old-a");
    path_in_root(b_dir, sizeof b_dir, "old-b");
    path_in_root(old_dir, sizeof old_dir, "old-converted");
    run r;
    run_opts o = {.net = PLAIN_NET,
                  .init_seed = 5,
                  .optim = KILN_OPTIM_ADAM,
                  .sched = KILN_SCHED_COSINE,
                  .ckdir = a_dir,
                  .epochs = 2};
    make_run(&r, &o);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    size_t n;
    float *wa = weights(r.m, &n);
    free_run(&r);
    o.ckdir = b_dir;
    o.epochs = 1;
    make_run(&r, &o);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    free_run(&r);
    char src[400];
    snprintf(src, sizeof src, "%s/step-000000010", b_dir);
    write_old_format(src, old_dir);

    FILE *note = tmpfile();
    assert_non_null(note);
    o.ckdir = NULL;
    o.epochs = 2;
    o.init_seed = 6;
    o.progress = note;
    make_run(&r, &o);
    if (kiln_learner_resume(r.L, old_dir) < 0)
        fail_msg("resume of an old checkpoint: %s", kiln_error());
    assert_int_equal(kiln_learner_step(r.L), 10);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    float *wb = weights(r.m, &n);
    expect_same_weights(wa, wb, n, "old-format resume without dropout");
    char text[4096] = {0};
    rewind(note);
    size_t got = fread(text, 1, sizeof text - 1, note);
    text[got] = 0;
    assert_non_null(strstr(text, "predates saved module generators"));
    free_run(&r);
    fclose(note);
    free(wa);
    free(wb);

    /* With dropout: resumes, the modules' streams untouched by the resume. */
    char d_dir[300], dold_dir[300];
    path_in_root(d_dir, sizeof d_dir, "old-drop");
    path_in_root(dold_dir, sizeof dold_dir, "old-drop-converted");
    o = (run_opts){.net = DROP_NET,
                   .init_seed = 5,
                   .optim = KILN_OPTIM_ADAM,
                   .sched = KILN_SCHED_COSINE,
                   .ckdir = d_dir,
                   .epochs = 1};
    make_run(&r, &o);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    free_run(&r);
    snprintf(src, sizeof src, "%s/step-000000010", d_dir);
    write_old_format(src, dold_dir);
    note = tmpfile();
    o.ckdir = NULL;
    o.epochs = 2;
    o.progress = note;
    make_run(&r, &o);
    kiln_generator *g[16];
    const char *paths[16];
    /* the model, fc1, drop, attn, attn.out_proj, fc2 */
    assert_int_equal(kiln_module_generators(r.m, g, paths, 16), 6);
    assert_string_equal(paths[2], "drop");
    assert_string_equal(paths[4], "attn.out_proj");
    kiln_generator drop_before = *g[2], attn_before = *g[3];
    assert_int_equal(kiln_learner_resume(r.L, dold_dir), 0);
    assert_memory_equal(g[2], &drop_before, sizeof drop_before);
    assert_memory_equal(g[3], &attn_before, sizeof attn_before);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    assert_int_equal(kiln_learner_step(r.L), 20);
    free_run(&r);
    fclose(note);
}

/* A resume that cannot complete changes nothing: not the weights, the optimizer, the
 * scheduler, the module streams nor the position. */
static void test_resume_all_or_nothing(void **state)
{
    (void)state;
    char dir[300];
    path_in_root(dir, sizeof dir, "aon");
    run r;
    run_opts o = {.net = DROP_NET,
                  .init_seed = 21,
                  .optim = KILN_OPTIM_SGD,
                  .sched = KILN_SCHED_COSINE,
                  .ckdir = dir,
                  .epochs = 1};
    make_run(&r, &o);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    free_run(&r);

    struct {
        const char *net;
        kiln_optim_kind optim;
        kiln_sched_kind sched;
        const char *needle;
    } cases[] = {
        {DROP_NET, KILN_OPTIM_ADAM, KILN_SCHED_COSINE, "the state is for sgd, the optimizer is adam"},
        {DROP_NET, KILN_OPTIM_SGD, KILN_SCHED_EXPONENTIAL, "the state is for \"cosine\""},
        {PLAIN_NET, KILN_OPTIM_SGD, KILN_SCHED_COSINE, "generators of 6 modules, the model has 5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        o = (run_opts){
            .net = cases[i].net, .init_seed = 22, .optim = cases[i].optim, .sched = cases[i].sched, .epochs = 2};
        make_run(&r, &o);
        size_t n;
        float *before = weights(r.m, &n);
        kiln_generator *g[16], gens_before[16];
        int ng = kiln_module_generators(r.m, g, NULL, 16);
        for (int k = 0; k < ng; k++)
            gens_before[k] = *g[k];
        double lr = kiln_optim_lr(r.o);
        kiln_generator rng = *kiln_learner_rng(r.L);
        assert_int_equal(kiln_learner_resume(r.L, dir), -1);
        if (!strstr(kiln_error(), cases[i].needle))
            fail_msg("case %zu: error \"%s\" lacks \"%s\"", i, kiln_error(), cases[i].needle);
        float *after = weights(r.m, &n);
        assert_memory_equal(before, after, n * sizeof *before);
        for (int k = 0; k < ng; k++)
            assert_memory_equal(g[k], &gens_before[k], sizeof gens_before[k]);
        assert_true(kiln_optim_lr(r.o) == lr);
        assert_int_equal(kiln_optim_steps(r.o), 0);
        assert_int_equal(kiln_sched_last_step(r.s), 0);
        assert_memory_equal(kiln_learner_rng(r.L), &rng, sizeof rng);
        assert_int_equal(kiln_learner_epoch(r.L), 0);
        assert_int_equal(kiln_learner_step(r.L), 0);
        free(before);
        free(after);
        free_run(&r);
    }
}

/* Bad configs and an optimizer over another model's parameters are refused at creation,
 * each with a message naming what is wrong; good setups still build. */
static void test_learner_create_checks(void **state)
{
    (void)state;
    kiln_generator g = kiln_generator_make(1);
    kiln_module *m = kiln_model_from_json(PLAIN_NET, dev, &g), *other = kiln_model_from_json(PLAIN_NET, dev, &g);
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_SGD);
    kiln_optim *o = kiln_optim_create_module(&oc, m), *o_other = kiln_optim_create_module(&oc, other);
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = 16;
    kiln_loader *tl = kiln_loader_create(train_ds, &lc, dev), *vl = kiln_loader_create(valid_ds, &lc, dev);
    assert_true(m && other && o && o_other && tl && vl);
    struct {
        int what;
        bool valid;
        const char *needle; /* NULL: accepted */
    } cases[] = {
        {0, true, NULL},
        {1, true, "best_metric \"nonsense\" is not a metric the learner records"},
        {2, false, "best_metric \"valid_accuracy\" is recorded only with a validation loader"},
        {3, true, "best_metric \"train_accuracy\" is recorded only for a classifier"},
        {4, true, "num_classes -2 is negative"},
        {5, true, "checkpoint_every_steps -1 must be >= 0"},
        {6, true, "checkpoint_every_epochs -1"},
        {7, true, "early_stop_metric \"valid_top5_accuracy\" is not a metric"},
        {8, true, NULL},
        {9, true, "min_delta nan"},
        {10, false, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kiln_learner_config c = kiln_learner_config_default();
        c.num_classes = 3;
        switch (cases[i].what) {
        case 0:
            c.best_metric = "valid_accuracy";
            c.early_stop_metric = "valid_loss";
            break;
        case 1: c.best_metric = "nonsense"; break;
        case 2: c.best_metric = "valid_accuracy"; break;
        case 3:
            c.best_metric = "train_accuracy";
            c.num_classes = 0;
            break;
        case 4: c.num_classes = -2; break;
        case 5: c.checkpoint_every_steps = -1; break;
        case 6: c.checkpoint_every_epochs = -1; break;
        case 7:
            c.topk = 2;
            c.early_stop_metric = "valid_top5_accuracy";
            break;
        case 8:
            c.topk = 2;
            c.early_stop_metric = "valid_top2_accuracy";
            c.best_metric = "valid_f1";
            break;
        case 9: c.min_delta = NAN; break;
        case 10:
            c.num_classes = 0;
            c.best_metric = "train_loss";
            break;
        }
        kiln_learner *L = kiln_learner_create(&c, m, o, NULL, tl, cases[i].valid ? vl : NULL);
        if (!cases[i].needle && !L)
            fail_msg("case %zu refused: %s", i, kiln_error());
        if (cases[i].needle && L)
            fail_msg("case %zu accepted", i);
        if (cases[i].needle && !strstr(kiln_error(), cases[i].needle))
            fail_msg("case %zu: error \"%s\" lacks \"%s\"", i, kiln_error(), cases[i].needle);
        kiln_learner_free(L);
    }
    kiln_learner_config c = kiln_learner_config_default();
    assert_null(kiln_learner_create(&c, m, o_other, NULL, tl, NULL));
    assert_non_null(
        strstr(kiln_error(), "the optimizer's parameter 'fc1.weight' is not a parameter of the model"));
    /* An optimizer over part of the model (fine-tuning the head) is fine, and trains it. */
    kiln_tensor *head[2] = {kiln_module_lookup(m, "fc2.weight"), kiln_module_lookup(m, "fc2.bias")};
    oc.lr = 0.1;
    kiln_optim *o_head = kiln_optim_create(&oc, 2, head, NULL);
    kiln_learner *L = kiln_learner_create(&c, m, o_head, NULL, tl, NULL);
    assert_non_null(L);
    float b0[3], b1[3], w0[64], w1[64];
    assert_int_equal(kiln_to_data(head[1], b0, sizeof b0), 0);
    assert_int_equal(kiln_to_data(kiln_module_lookup(m, "fc1.weight"), w0, sizeof w0), 0);
    assert_int_equal(kiln_learner_fit(L), 0);
    assert_int_equal(kiln_to_data(head[1], b1, sizeof b1), 0);
    assert_int_equal(kiln_to_data(kiln_module_lookup(m, "fc1.weight"), w1, sizeof w1), 0);
    assert_memory_not_equal(b0, b1, sizeof b0);
    assert_memory_equal(w0, w1, sizeof w0);
    kiln_learner_free(L);
    kiln_optim_free(o_head);
    kiln_loader_free(tl);
    kiln_loader_free(vl);
    kiln_optim_free(o);
    kiln_optim_free(o_other);
    kiln_module_free(m);
    kiln_module_free(other);
}

/* One-cycle over 5 steps driving a 10-step epoch: the sixth scheduler step is refused, fit
 * stops with that error, and no parameter holds a NaN (it used to train on a NaN lr). */
static void test_one_cycle_overrun_stops_fit(void **state)
{
    (void)state;
    kiln_generator g = kiln_generator_make(3);
    kiln_module *m = kiln_model_from_json(PLAIN_NET, dev, &g);
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_SGD);
    kiln_optim *o = kiln_optim_create_module(&oc, m);
    kiln_sched_config sc = kiln_sched_config_default(KILN_SCHED_ONE_CYCLE);
    sc.total_steps = 5;
    kiln_sched *s = kiln_sched_create(&sc, o);
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = 16;
    kiln_loader *tl = kiln_loader_create(train_ds, &lc, dev);
    kiln_learner_config c = kiln_learner_config_default();
    c.num_classes = 3;
    kiln_learner *L = kiln_learner_create(&c, m, o, s, tl, NULL);
    assert_non_null(L);
    assert_int_equal(kiln_learner_fit(L), -1);
    assert_non_null(strstr(kiln_error(), "step 6 is past total_steps 5"));
    assert_string_equal(kiln_learner_stop_reason(L), "error");
    assert_int_equal(kiln_sched_last_step(s), 5);
    assert_true(isfinite(kiln_optim_lr(o)));
    size_t n;
    float *w = weights(m, &n);
    for (size_t i = 0; i < n; i++)
        assert_true(isfinite(w[i]));
    free(w);
    kiln_learner_free(L);
    kiln_loader_free(tl);
    kiln_sched_free(s);
    kiln_optim_free(o);
    kiln_module_free(m);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        dev_spec = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_resume_exact),        cmocka_unit_test(test_old_checkpoint_resumes),
        cmocka_unit_test(test_resume_all_or_nothing),       cmocka_unit_test(test_learner_create_checks),
        cmocka_unit_test(test_one_cycle_overrun_stops_fit),
    };
    return cmocka_run_group_tests_name("learner-state", tests, setup, learner_fixture_close);
}
