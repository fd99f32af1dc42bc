/*
 * onnx-ops-index.c — ONNX's index-driven operators: ScatterND, GatherND, NonZero and
 * Einsum.
 *
 * ScatterND, GatherND and NonZero have data-dependent behaviour, so their indices are read
 * to the host, where every index is checked against its dim before anything is read or
 * written (an out-of-range index fails the node, naming it, instead of reaching outside
 * the data). GatherND then picks rows of the data with kiln_index_select, so gradients
 * flow through it.
 * ScatterND without a reduction, or with "add", then runs as kiln_scatter /
 * kiln_scatter_add over the rows of the data, so gradients flow through it; "mul", "max"
 * and "min" have no engine op and are computed on the host (inference only).
 *
 * Einsum is rewritten into the engine's permute / reshape / matmul / sum, so it runs on
 * every device and is differentiable: each operand first takes its diagonals (a label
 * repeated within it) and sums out labels nobody else needs; operands are then
 * contracted left to right, each pair as one batched matmul [batch..., M, K] x
 * [batch..., K, N] whose batch dims broadcast; the result is permuted to the output.
 */
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-impl.h"

/* Integer tensor to a malloc'd host array of numel i64 (NULL + message on failure). */
static int64_t *host_i64(kiln_tensor *t, int64_t numel) {
    int64_t *v = malloc((size_t)(numel > 0 ? numel : 1) * sizeof *v);
    if (!v) { kiln__error_set("onnx: out of memory"); return NULL; }
    kiln_tensor *c = kiln_tensor_dtype(t) == KILN_I64 ? t : kiln_cast(t, KILN_I64);
    if (!c || kiln_to_data(c, v, (size_t)numel * sizeof *v)) { free(v); return NULL; }
    return v;
}

/* ---------------------------------------------------------------- ScatterND */

enum { RED_NONE, RED_ADD, RED_MUL, RED_MAX, RED_MIN };

static int op_scatter_nd(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(3);
    kiln_tensor *data = in[0], *idx = in[1], *upd = in[2];
    const char *rs = kiln__onnx_attr_str(n, "reduction", "none");
    int red = !strcmp(rs, "none") ? RED_NONE : !strcmp(rs, "add") ? RED_ADD : !strcmp(rs, "mul") ? RED_MUL
            : !strcmp(rs, "max") ? RED_MAX : !strcmp(rs, "min") ? RED_MIN : -1;
    if (red < 0) return kiln__onnx_fail(n, "reduction '%s' not supported", rs);
    if (kiln_dtype_is_float(kiln_tensor_dtype(idx)) || kiln_tensor_dtype(idx) == KILN_BOOL)
        return kiln__onnx_fail(n, "indices must be integers");
    int r = kiln_tensor_ndim(data), q = kiln_tensor_ndim(idx), ru = kiln_tensor_ndim(upd);
    if (q < 1) return kiln__onnx_fail(n, "indices must have rank >= 1");
    int64_t k = kiln_tensor_dim(idx, q - 1);
    if (k > r) return kiln__onnx_fail(n, "index depth %lld exceeds the data rank %d", (long long)k, r);
    if (ru != q - 1 + r - (int)k)
        return kiln__onnx_fail(n, "updates have rank %d; indices and data need %d", ru, q - 1 + r - (int)k);
    int64_t nupd = 1, rows = 1, row = 1;
    for (int i = 0; i < q - 1; i++) {
        if (kiln_tensor_dim(upd, i) != kiln_tensor_dim(idx, i))
            return kiln__onnx_fail(n, "updates dim %d is %lld, indices have %lld", i, (long long)kiln_tensor_dim(upd, i),
                                   (long long)kiln_tensor_dim(idx, i));
        nupd *= kiln_tensor_dim(idx, i);
    }
    for (int i = 0; i < r; i++) {
        if (i < k) { rows *= kiln_tensor_dim(data, i); continue; }
        row *= kiln_tensor_dim(data, i);
        if (kiln_tensor_dim(upd, q - 1 + i - (int)k) != kiln_tensor_dim(data, i))
            return kiln__onnx_fail(n, "updates dim %d does not match data dim %d", q - 1 + i - (int)k, i);
    }
    if (nupd == 0) { out[0] = data; return 0; }
    int64_t *iv = host_i64(idx, nupd * k), *rowidx = malloc((size_t)nupd * sizeof *rowidx);
    if (!iv || !rowidx) {
        free(iv); free(rowidx);
        return iv ? kiln__onnx_fail(n, "out of memory") : -1;
    }
    int rc = 0;
    for (int64_t u = 0; u < nupd && !rc; u++) {
        int64_t at = 0;
        for (int j = 0; j < k; j++) {
            int64_t d = kiln_tensor_dim(data, j), v = iv[u * k + j];
            if (v < -d || v >= d) {
                rc = kiln__onnx_fail(n, "index %lld out of range for data dim %d of size %lld (update %lld)",
                                     (long long)v, j, (long long)d, (long long)u);
                break;
            }
            at = at * d + (v < 0 ? v + d : v);
        }
        rowidx[u] = at;
    }
    free(iv);
    if (rc) { free(rowidx); return -1; }
    kiln_tensor *d2 = kiln_reshape(data, 2, (const int64_t[]){rows, row});
    kiln_tensor *u2 = kiln_reshape(upd, 2, (const int64_t[]){nupd, row});
    if (red == RED_NONE || red == RED_ADD) {
        kiln_tensor *ri = kiln_from_data(n->dev, KILN_I64, 2, (const int64_t[]){nupd, 1}, rowidx,
                                         (size_t)nupd * sizeof *rowidx);
        free(rowidx);
        kiln_tensor *ix = kiln_contiguous(kiln_expand(ri, 2, (const int64_t[]){nupd, row}));
        u2 = kiln_cast(u2, kiln_tensor_dtype(data));
        kiln_tensor *y = red == RED_NONE ? kiln_scatter(d2, 0, ix, u2) : kiln_scatter_add(d2, 0, ix, u2);
        out[0] = y ? kiln_reshape(y, r, kiln_tensor_shape(data)) : NULL;
        return out[0] ? 0 : -1;
    }
    /* mul / max / min on the host, in f64 (exact for every f32 and for |ints| < 2^53) */
    int64_t total = rows * row;
    double *dv = malloc((size_t)(total > 0 ? total : 1) * sizeof *dv), *uv = malloc((size_t)(nupd * row) * sizeof *uv);
    kiln_tensor *df = kiln_cast(d2, KILN_F64), *uf = kiln_cast(u2, KILN_F64);
    if (!dv || !uv || !df || !uf || kiln_to_data(df, dv, (size_t)total * sizeof *dv) ||
        kiln_to_data(uf, uv, (size_t)(nupd * row) * sizeof *uv)) {
        free(dv); free(uv); free(rowidx);
        return dv && uv ? -1 : kiln__onnx_fail(n, "out of memory");
    }
    for (int64_t u = 0; u < nupd; u++) {
        double *dst = dv + rowidx[u] * row;
        const double *src = uv + u * row;
        for (int64_t e = 0; e < row; e++)
            dst[e] = red == RED_MUL ? dst[e] * src[e] : red == RED_MAX ? (src[e] > dst[e] ? src[e] : dst[e])
                                                                     : (src[e] < dst[e] ? src[e] : dst[e]);
    }
    kiln_tensor *y = kiln_from_data(n->dev, KILN_F64, r, kiln_tensor_shape(data), dv, (size_t)total * sizeof *dv);
    free(dv); free(uv); free(rowidx);
    out[0] = y ? kiln_cast(y, kiln_tensor_dtype(data)) : NULL;
    return out[0] ? 0 : -1;
}

/* ----------------------------------------------------------------- GatherND */

/* data [batch..., K dims..., row...], indices [batch..., n..., k]: the output is
 * [batch..., n..., row...], each index tuple naming one row within its batch. With the
 * data seen as rows [B * K, R], every tuple becomes one row number (b * K + its place in
 * the K dims), checked on the host, and the rows are picked in one index_select. */
static int op_gather_nd(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    kiln_tensor *data = in[0], *idx = in[1];
    if (kiln_dtype_is_float(kiln_tensor_dtype(idx)) || kiln_tensor_dtype(idx) == KILN_BOOL)
        return kiln__onnx_fail(n, "indices must be integers");
    int r = kiln_tensor_ndim(data), q = kiln_tensor_ndim(idx);
    int64_t b = kiln__onnx_attr_int(n, "batch_dims", 0);
    if (q < 1 || r < 1) return kiln__onnx_fail(n, "data and indices must have rank >= 1");
    int64_t k = kiln_tensor_dim(idx, q - 1);
    if (b < 0 || b >= q || b >= r) return kiln__onnx_fail(n, "batch_dims %lld out of range", (long long)b);
    if (k < 1 || k > r - b)
        return kiln__onnx_fail(n, "index depth %lld must be in 1..%lld (data rank %d, batch_dims %lld)", (long long)k,
                               (long long)(r - b), r, (long long)b);
    int64_t nb = 1, kk = 1, row = 1, per = 1, shape[KILN_MAX_DIMS];
    int ro = 0;
    for (int i = 0; i < b; i++) {
        if (kiln_tensor_dim(idx, i) != kiln_tensor_dim(data, i))
            return kiln__onnx_fail(n, "indices dim %d is %lld, data has %lld (a batch dim)", i,
                                   (long long)kiln_tensor_dim(idx, i), (long long)kiln_tensor_dim(data, i));
        nb *= kiln_tensor_dim(data, i);
    }
    for (int i = 0; i < q - 1; i++) {
        shape[ro++] = kiln_tensor_dim(idx, i);
        if (i >= b) per *= kiln_tensor_dim(idx, i);
    }
    for (int i = (int)b; i < r; i++) {
        if (i < b + k) { kk *= kiln_tensor_dim(data, i); continue; }
        row *= kiln_tensor_dim(data, i);
        if (ro >= KILN_MAX_DIMS) return kiln__onnx_fail(n, "output rank exceeds %d", KILN_MAX_DIMS);
        shape[ro++] = kiln_tensor_dim(data, i);
    }
    int64_t total = nb * per;
    int64_t *iv = host_i64(idx, total * k), *rowidx = malloc((size_t)(total > 0 ? total : 1) * sizeof *rowidx);
    if (!iv || !rowidx) {
        free(iv); free(rowidx);
        return iv ? kiln__onnx_fail(n, "out of memory") : -1;
    }
    int rc = 0;
    for (int64_t t = 0; t < total && !rc; t++) {
        int64_t at = 0;
        for (int j = 0; j < k; j++) {
            int64_t d = kiln_tensor_dim(data, (int)b + j), v = iv[t * k + j];
            if (v < -d || v >= d) {
                rc = kiln__onnx_fail(n, "index %lld out of range for data dim %lld of size %lld (tuple %lld)",
                                     (long long)v, (long long)(b + j), (long long)d, (long long)t);
                break;
            }
            at = at * d + (v < 0 ? v + d : v);
        }
        rowidx[t] = (t / (per > 0 ? per : 1)) * kk + at;
    }
    free(iv);
    if (rc) { free(rowidx); return -1; }
    kiln_tensor *ri = kiln_from_data(n->dev, KILN_I64, 1, &total, rowidx, (size_t)total * sizeof *rowidx);
    free(rowidx);
    kiln_tensor *rows = kiln_index_select(kiln_reshape(data, 2, (const int64_t[]){nb * kk, row}), 0, ri);
    out[0] = rows ? kiln_reshape(rows, ro, shape) : NULL;
    return out[0] ? 0 : -1;
}

/* ----------------------------------------------------------------- NonZero */

/* Indices of the non-zero elements, [rank, count] in row-major order. */
static int op_nonzero(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    int r = kiln_tensor_ndim(x);
    if (r == 0) return kiln__onnx_fail(n, "a scalar input is not supported");
    int64_t numel = kiln_tensor_numel(x);
    kiln_tensor *b = kiln_cast(x, KILN_BOOL);
    uint8_t *bv = malloc((size_t)(numel > 0 ? numel : 1));
    if (!b || !bv || kiln_to_data(b, bv, (size_t)numel)) {
        free(bv);
        return b && !bv ? kiln__onnx_fail(n, "out of memory") : -1;
    }
    int64_t cnt = 0;
    for (int64_t i = 0; i < numel; i++) cnt += bv[i] != 0;
    int64_t *res = malloc((size_t)(cnt * r > 0 ? cnt * r : 1) * sizeof *res);
    if (!res) { free(bv); return kiln__onnx_fail(n, "out of memory"); }
    int64_t j = 0;
    for (int64_t i = 0; i < numel; i++) {
        if (!bv[i]) continue;
        int64_t rest = i;
        for (int d = r - 1; d >= 0; d--) {
            int64_t dim = kiln_tensor_dim(x, d);
            res[(int64_t)d * cnt + j] = rest % dim;
            rest /= dim;
        }
        j++;
    }
    out[0] = kiln_from_data(n->dev, KILN_I64, 2, (const int64_t[]){r, cnt}, res, (size_t)(cnt * r) * sizeof *res);
    free(bv);
    free(res);
    return out[0] ? 0 : -1;
}

/* ------------------------------------------------------------------ Einsum */

/* Labels: A-Z are 0..25, a-z 26..51 (so label order is ASCII order, which the implicit
 * output form sorts by); the dims an ellipsis stands for are 52.., right-aligned. */
#define EIN_LETTERS 52
#define EIN_LABELS (EIN_LETTERS + KILN_MAX_DIMS)
#define EIN_MAXOPS 16

typedef struct eterm {
    int n;
    int lab[KILN_MAX_DIMS];
} eterm;

typedef struct einsum {
    const kiln__onnx_node *node;
    const char *eq;
    int64_t size[EIN_LABELS];
} einsum;

static int ein_fail(const einsum *e, const char *why) {
    return kiln__onnx_fail(e->node, "equation '%s': %s", e->eq, why);
}

/* Parses one term of s[0..len) (no spaces) into t; rank is the operand's rank, or -1 for
 * the output (whose ellipsis stands for all nell dims). */
static int ein_term(const einsum *e, const char *s, size_t len, int rank, int nell, eterm *t) {
    int letters = 0, ell = -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            if (ell >= 0 || i + 2 >= len || s[i + 1] != '.' || s[i + 2] != '.') return ein_fail(e, "bad ellipsis");
            ell = letters;
            i += 2;
        } else if ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')) {
            letters++;
        } else {
            return ein_fail(e, "labels must be letters");
        }
    }
    int ne = ell < 0 ? 0 : rank < 0 ? nell : rank - letters;
    if (rank >= 0 && (ne < 0 || (ell < 0 && letters != rank))) return ein_fail(e, "a term does not match its operand's rank");
    if (letters + ne > KILN_MAX_DIMS) return ein_fail(e, "too many dims");
    t->n = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            for (int j = 0; j < ne; j++) t->lab[t->n++] = EIN_LETTERS + nell - ne + j;
            i += 2;
        } else {
            t->lab[t->n++] = s[i] <= 'Z' ? s[i] - 'A' : 26 + s[i] - 'a';
        }
    }
    return 0;
}

static int find_lab(const eterm *t, int lab) {
    for (int i = 0; i < t->n; i++)
        if (t->lab[i] == lab) return i;
    return -1;
}

/* Takes the diagonal of every label repeated within x: the two dims go last, merge into
 * one of n*n, and every (n+1)-th element of it is the diagonal. */
static kiln_tensor *ein_diagonals(const einsum *e, kiln_tensor *x, eterm *t) {
    for (;;) {
        int a = -1, b = -1;
        for (int i = 0; i < t->n && a < 0; i++)
            for (int j = i + 1; j < t->n; j++)
                if (t->lab[i] == t->lab[j]) { a = i; b = j; break; }
        if (a < 0) return x;
        int64_t d = kiln_tensor_dim(x, a);
        if (kiln_tensor_dim(x, b) != d) { ein_fail(e, "a repeated label has different sizes"); return NULL; }
        int order[KILN_MAX_DIMS], m = 0;
        eterm nt = {0};
        for (int i = 0; i < t->n; i++)
            if (i != a && i != b) { order[m++] = i; nt.lab[nt.n++] = t->lab[i]; }
        order[m++] = a;
        order[m++] = b;
        int64_t shape[KILN_MAX_DIMS];
        for (int i = 0; i < m - 2; i++) shape[i] = kiln_tensor_dim(x, order[i]);
        shape[m - 2] = d * d;
        x = kiln_reshape(kiln_permute(x, t->n, order), m - 1, shape);
        x = kiln_slice(x, m - 2, 0, d * d, d + 1);
        nt.lab[nt.n++] = t->lab[a];
        *t = nt;
        if (!x) return NULL;
    }
}

/* Sums out the labels of x that are not in keep[]. */
static kiln_tensor *ein_reduce(kiln_tensor *x, eterm *t, const bool *keep) {
    int dims[KILN_MAX_DIMS], nd = 0;
    eterm nt = {0};
    for (int i = 0; i < t->n; i++) {
        if (keep[t->lab[i]]) nt.lab[nt.n++] = t->lab[i];
        else dims[nd++] = i;
    }
    if (!nd) return x;
    *t = nt;
    return kiln_sum(x, nd, dims, false);
}

static int64_t group_size(const kiln_tensor *x, const eterm *t, const int *labs, int nl) {
    int64_t p = 1;
    for (int i = 0; i < nl; i++) p *= kiln_tensor_dim(x, find_lab(t, labs[i]));
    return p;
}

/* One pairwise contraction: labels in both and kept are batch dims, in both and not
 * kept are summed by the matmul, the rest are the M and N sides. */
static kiln_tensor *ein_pair(const einsum *e, kiln_tensor *a, eterm *ta, kiln_tensor *b, const eterm *tb,
                             const bool *keep) {
    int bl[KILN_MAX_DIMS], al[KILN_MAX_DIMS], cl[KILN_MAX_DIMS], nl[KILN_MAX_DIMS], nb = 0, na = 0, nc = 0, nn = 0;
    for (int i = 0; i < ta->n; i++) {
        int l = ta->lab[i];
        if (find_lab(tb, l) < 0) al[na++] = l;
        else if (keep[l]) bl[nb++] = l;
        else cl[nc++] = l;
    }
    for (int i = 0; i < tb->n; i++)
        if (find_lab(ta, tb->lab[i]) < 0) nl[nn++] = tb->lab[i];
    for (int i = 0; i < nc; i++)
        if (kiln_tensor_dim(a, find_lab(ta, cl[i])) != kiln_tensor_dim(b, find_lab(tb, cl[i]))) {
            ein_fail(e, "a summed label has different sizes in two operands");
            return NULL;
        }
    if (nb + 2 > KILN_MAX_DIMS || nb + na + nn > KILN_MAX_DIMS) { ein_fail(e, "too many dims"); return NULL; }
    int oa[KILN_MAX_DIMS], ob[KILN_MAX_DIMS], m = 0;
    int64_t sa[KILN_MAX_DIMS], sb[KILN_MAX_DIMS], so[KILN_MAX_DIMS];
    for (int i = 0; i < nb; i++) {
        oa[i] = find_lab(ta, bl[i]);
        ob[i] = find_lab(tb, bl[i]);
        sa[i] = kiln_tensor_dim(a, oa[i]);
        sb[i] = kiln_tensor_dim(b, ob[i]);
        if (sa[i] != sb[i] && sa[i] != 1 && sb[i] != 1) { ein_fail(e, "batch dims do not broadcast"); return NULL; }
        so[i] = sa[i] > sb[i] ? sa[i] : sb[i];
    }
    m = nb;
    for (int i = 0; i < na; i++) oa[m++] = find_lab(ta, al[i]);
    for (int i = 0; i < nc; i++) oa[m++] = find_lab(ta, cl[i]);
    m = nb;
    for (int i = 0; i < nc; i++) ob[m++] = find_lab(tb, cl[i]);
    for (int i = 0; i < nn; i++) ob[m++] = find_lab(tb, nl[i]);
    int64_t M = group_size(a, ta, al, na), K = group_size(a, ta, cl, nc), N = group_size(b, tb, nl, nn);
    sa[nb] = M; sa[nb + 1] = K;
    sb[nb] = K; sb[nb + 1] = N;
    kiln_tensor *a3 = kiln_reshape(kiln_permute(a, ta->n, oa), nb + 2, sa);
    kiln_tensor *b3 = kiln_reshape(kiln_permute(b, tb->n, ob), nb + 2, sb);
    kiln_tensor *y = kiln_matmul(a3, b3);
    eterm to = {0};
    for (int i = 0; i < nb; i++) to.lab[to.n++] = bl[i];
    for (int i = 0; i < na; i++) { so[to.n] = kiln_tensor_dim(a, find_lab(ta, al[i])); to.lab[to.n++] = al[i]; }
    for (int i = 0; i < nn; i++) { so[to.n] = kiln_tensor_dim(b, find_lab(tb, nl[i])); to.lab[to.n++] = nl[i]; }
    *ta = to;
    return y ? kiln_reshape(y, to.n, so) : NULL;
}

static int op_einsum(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    const char *eq0 = kiln__onnx_attr_str(n, "equation", NULL);
    if (!eq0) return kiln__onnx_fail(n, "no equation");
    if (nin > EIN_MAXOPS) return kiln__onnx_fail(n, "more than %d operands", EIN_MAXOPS);
    char eq[256];
    size_t len = 0;
    for (const char *c = eq0; *c; c++) {
        if (*c == ' ') continue;
        if (len + 1 >= sizeof eq) return kiln__onnx_fail(n, "equation too long");
        eq[len++] = *c;
    }
    eq[len] = 0;
    einsum e = {.node = n, .eq = eq0};
    const char *arrow = strstr(eq, "->");
    size_t lhs = arrow ? (size_t)(arrow - eq) : len;
    /* split the inputs at commas; find the ellipsis width over all operands */
    size_t start[EIN_MAXOPS + 1], tlen[EIN_MAXOPS + 1];
    int nterms = 0;
    for (size_t i = 0, s = 0; i <= lhs; i++)
        if (i == lhs || eq[i] == ',') {
            if (nterms == EIN_MAXOPS) return ein_fail(&e, "too many terms");
            start[nterms] = s;
            tlen[nterms++] = i - s;
            s = i + 1;
        }
    if (nterms != nin) return ein_fail(&e, "the number of terms differs from the number of inputs");
    eterm t[EIN_MAXOPS], to;
    int nell = 0;
    for (int i = 0; i < nin; i++) {
        if (!in[i]) return ein_fail(&e, "an input is missing");
        int letters = 0;
        bool has = false;
        for (size_t j = 0; j < tlen[i]; j++) {
            char c = eq[start[i] + j];
            letters += c != '.';
            has = has || c == '.';
        }
        int w = kiln_tensor_ndim(in[i]) - letters;
        if (has && w > nell) nell = w;
    }
    for (int i = 0; i < nin; i++)
        if (ein_term(&e, eq + start[i], tlen[i], kiln_tensor_ndim(in[i]), nell, &t[i])) return -1;
    int count[EIN_LABELS] = {0};
    for (int l = 0; l < EIN_LABELS; l++) e.size[l] = -1;
    for (int i = 0; i < nin; i++)
        for (int d = 0; d < t[i].n; d++) {
            int l = t[i].lab[d];
            int64_t s = kiln_tensor_dim(in[i], d);
            count[l]++;
            if (e.size[l] >= 0 && e.size[l] != s && s != 1 && e.size[l] != 1)
                return ein_fail(&e, "a label has different sizes");
            if (e.size[l] < s) e.size[l] = s;
        }
    if (arrow) {
        if (ein_term(&e, arrow + 2, strlen(arrow + 2), -1, nell, &to)) return -1;
        for (int i = 0; i < to.n; i++) {
            if (!count[to.lab[i]]) return ein_fail(&e, "an output label is not in any input");
            for (int j = i + 1; j < to.n; j++)
                if (to.lab[i] == to.lab[j]) return ein_fail(&e, "an output label is repeated");
        }
    } else {
        /* implicit output: the ellipsis dims, then the labels used once, in ASCII order */
        to.n = 0;
        for (int l = EIN_LETTERS; l < EIN_LETTERS + nell; l++) to.lab[to.n++] = l;
        for (int l = 0; l < EIN_LETTERS; l++)
            if (count[l] == 1) {
                if (to.n == KILN_MAX_DIMS) return ein_fail(&e, "too many dims");
                to.lab[to.n++] = l;
            }
    }
    /* keep[l]: needed by the output or by an operand not yet folded in */
    bool keep[EIN_LABELS];
    kiln_tensor *x[EIN_MAXOPS] = {0};
    for (int i = 0; i < nin; i++) {
        memset(keep, 0, sizeof keep);
        for (int j = 0; j < to.n; j++) keep[to.lab[j]] = true;
        for (int o = 0; o < nin; o++)
            for (int j = 0; o != i && j < t[o].n; j++) keep[t[o].lab[j]] = true;
        x[i] = ein_diagonals(&e, in[i], &t[i]);
        if (!x[i]) return -1;
        x[i] = ein_reduce(x[i], &t[i], keep);
        if (!x[i]) return -1;
    }
    kiln_tensor *acc = x[0];
    eterm ta = t[0];
    for (int i = 1; i < nin; i++) {
        memset(keep, 0, sizeof keep);
        for (int j = 0; j < to.n; j++) keep[to.lab[j]] = true;
        for (int o = i + 1; o < nin; o++)
            for (int j = 0; j < t[o].n; j++) keep[t[o].lab[j]] = true;
        bool keep2[EIN_LABELS];
        memcpy(keep2, keep, sizeof keep2);
        for (int j = 0; j < t[i].n; j++) keep2[t[i].lab[j]] = true;
        acc = ein_reduce(acc, &ta, keep2);   /* what only earlier operands had */
        if (!acc) return -1;
        acc = ein_pair(&e, acc, &ta, x[i], &t[i], keep);
        if (!acc) return -1;
    }
    memset(keep, 0, sizeof keep);
    for (int j = 0; j < to.n; j++) keep[to.lab[j]] = true;
    acc = ein_reduce(acc, &ta, keep);
    if (!acc) return -1;
    /* size-1 dims broadcast in a single operand's batch labels may be left: expand them */
    int order[KILN_MAX_DIMS];
    int64_t shape[KILN_MAX_DIMS];
    for (int i = 0; i < to.n; i++) {
        order[i] = find_lab(&ta, to.lab[i]);
        if (order[i] < 0) return ein_fail(&e, "an output label was lost");
        shape[i] = e.size[to.lab[i]];
    }
    acc = kiln_permute(acc, to.n, order);
    bool same = true;
    for (int i = 0; acc && i < to.n; i++) same = same && kiln_tensor_dim(acc, i) == shape[i];
    if (acc && !same) acc = kiln_expand(acc, to.n, shape);
    out[0] = kiln_contiguous(acc);
    return out[0] ? 0 : -1;
}

const kiln__onnx_op kiln__onnx_ops_index[] = {
    {"ScatterND", op_scatter_nd}, {"GatherND", op_gather_nd}, {"NonZero", op_nonzero}, {"Einsum", op_einsum},
    {NULL, NULL},
};
