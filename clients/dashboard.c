/*
 * clients/dashboard.c — the live terminal dashboard of `kiln watch` (ncurses).
 *
 * One thread: poll() waits on the keyboard and the event stream together, so a slow or silent
 * kilnd never freezes the screen and a burst of events (a finished job's whole history) never
 * delays a key press by more than one read. The screen is rebuilt from struct kiln_watch on
 * every frame (ncurses sends only what changed), at most ten frames a second, and laid out for
 * whatever size the terminal has: parts that do not fit are left out, smallest first.
 *
 * Plots use braille characters (2x4 dots per cell) on a UTF-8 terminal and '*'/'o' otherwise.
 */
#include <errno.h>
#include <langinfo.h>
#include <locale.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <curses.h>

#include "sse.h"
#include "watch.h"

enum { PAIR_TRAIN = 1, PAIR_VALID, PAIR_GOOD, PAIR_BAD, PAIR_DIM };

struct dash {
    struct kiln_watch *w;
    bool utf8, color;
    char status[320];         /* the footer: the connection, or how the job ended */
    bool dirty;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    interrupted = sig; /* the exit status is 128 + it, as a shell reports a signal's end */
}

/* printf at (y, x), cut to MAXW columns; the text is ASCII (what is not is shown as '?'). */
static void put(int y, int x, int maxw, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void put(int y, int x, int maxw, const char *fmt, ...)
{
    if (maxw <= 0 || y < 0 || y >= LINES || x < 0 || x >= COLS)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (maxw > COLS - x)
        maxw = COLS - x;
    int n = 0;
    for (; buf[n] && n < maxw && n < (int)sizeof buf - 1; n++)
        if ((unsigned char)buf[n] < 0x20 || (unsigned char)buf[n] > 0x7e)
            buf[n] = '?';
    mvaddnstr(y, x, buf, n);
}

static void fmt_dur(char *out, size_t n, double s)
{
    if (!isfinite(s) || s < 0)
        snprintf(out, n, "--");
    else if (s < 60)
        snprintf(out, n, "%.0fs", ceil(s));
    else if (s < 3600)
        snprintf(out, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else
        snprintf(out, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

/* "Label [#####.....]  42%  SUFFIX" across the row. */
static void bar(const struct dash *d, int y, const char *label, double f, const char *suffix)
{
    int x = 0;
    put(y, x, COLS, "%-6s", label);
    x += 6;
    int sl = (int)strlen(suffix);
    int bw = COLS - x - 8 - sl - 1;
    if (bw >= 5) {
        int fill = (int)(f * bw + 0.5);
        addstr("[");
        if (d->color)
            attron(COLOR_PAIR(PAIR_GOOD));
        for (int i = 0; i < bw; i++)
            addstr(i < fill ? (d->utf8 ? "\xe2\x96\x88" : "#") : (d->utf8 ? "\xe2\x96\x91" : "."));
        if (d->color)
            attroff(COLOR_PAIR(PAIR_GOOD));
        addstr("]");
        x += bw + 2;
    }
    put(y, x, COLS - x, " %3.0f%%  %s", f * 100, suffix);
}

/* ---- plots ------------------------------------------------------------------------------------ */

struct canvas {
    int cw, ch;               /* cells */
    int dw, dh;               /* dots: 2x4 per cell for braille, 1x1 otherwise */
    uint8_t *bits[2];         /* per cell, per series */
};

static void dot(struct canvas *c, int s, int x, int y)
{
    if (x < 0 || y < 0 || x >= c->dw || y >= c->dh)
        return;
    int sx = c->dw / c->cw, sy = c->dh / c->ch;
    int cx = x / sx, cy = y / sy;
    static const uint8_t braille[4][2] = {{0x01, 0x08}, {0x02, 0x10}, {0x04, 0x20}, {0x40, 0x80}};
    c->bits[s][cy * c->cw + cx] |= sx == 2 ? braille[y % 4][x % 2] : 1;
}

static void line(struct canvas *c, int s, int x0, int y0, int x1, int y1)
{
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    for (int guard = 0; guard < 100000; guard++) {
        dot(c, s, x0, y0);
        if (x0 == x1 && y0 == y1)
            break;
        int e2 = 2 * err;
        if (e2 >= dy) {
            err += dy;
            x0 += sx;
        }
        if (e2 <= dx) {
            err += dx;
            y0 += sy;
        }
    }
}

static void plot_series(struct canvas *c, int s, const struct kiln_series *se, double x0, double x1, double y0, double y1)
{
    int px = 0, py = 0;
    for (size_t i = 0; i < se->n; i++) {
        int x = (int)lround((se->x[i] - x0) / (x1 - x0) * (c->dw - 1));
        int y = (int)lround((y1 - se->y[i]) / (y1 - y0) * (c->dh - 1));
        if (i)
            line(c, s, px, py, x, y);
        else
            dot(c, s, x, y);
        px = x;
        py = y;
    }
}

/* A plot of A (train, per step) and B (valid, per epoch) in the box at (y, x), h x w cells. */
static void plot(const struct dash *d, int y, int x, int h, int w, const char *title, const struct kiln_series *a,
                 const struct kiln_series *b, double xmax)
{
    const int lw = 8; /* the y labels */
    int ph = h - 2, pw = w - lw - 1;
    if (ph < 2 || pw < 6)
        return;
    attron(A_BOLD);
    put(y, x, w, "%s", title);
    attroff(A_BOLD);
    int tx = x + (int)strlen(title) + 2;
    if (d->color)
        attron(COLOR_PAIR(PAIR_TRAIN));
    put(y, tx, x + w - tx, "%s train", d->utf8 ? "--" : "*");
    if (d->color)
        attroff(COLOR_PAIR(PAIR_TRAIN));
    tx += 9;
    if (d->color)
        attron(COLOR_PAIR(PAIR_VALID));
    put(y, tx, x + w - tx, "%s valid", d->utf8 ? "--" : "o");
    if (d->color)
        attroff(COLOR_PAIR(PAIR_VALID));
    double lo = INFINITY, hi = -INFINITY, xlo = INFINITY, xhi = xmax;
    const struct kiln_series *all[2] = {a, b};
    for (int s = 0; s < 2; s++)
        for (size_t i = 0; i < all[s]->n; i++) {
            lo = fmin(lo, all[s]->y[i]);
            hi = fmax(hi, all[s]->y[i]);
            xlo = fmin(xlo, all[s]->x[i]);
            xhi = fmax(xhi, all[s]->x[i]);
        }
    if (!isfinite(lo)) {
        put(y + 1 + ph / 2, x + lw + 2, pw - 1, "%s",
            d->w->done ? "(the job ended before its first step)" : "(waiting for the first step)");
        return;
    }
    bool nonneg = lo >= 0;
    if (hi - lo < 1e-9) {
        double m = fmax(fabs(hi) * 0.05, 0.01);
        lo -= m;
        hi += m;
    } else {
        double m = (hi - lo) * 0.05;
        lo -= m;
        hi += m;
    }
    if (nonneg && lo < 0)
        lo = 0; /* losses and accuracies are never negative: keep the axis honest */
    if (!(xhi > xlo))
        xhi = xlo + 1;
    struct canvas c = {.cw = pw, .ch = ph, .dw = pw * (d->utf8 ? 2 : 1), .dh = ph * (d->utf8 ? 4 : 1)};
    c.bits[0] = calloc((size_t)pw * (size_t)ph, 1);
    c.bits[1] = calloc((size_t)pw * (size_t)ph, 1);
    if (c.bits[0] && c.bits[1]) {
        plot_series(&c, 0, a, xlo, xhi, lo, hi);
        plot_series(&c, 1, b, xlo, xhi, lo, hi);
        for (int r = 0; r < ph; r++) {
            for (int q = 0; q < pw; q++) {
                uint8_t ta = c.bits[0][r * pw + q], tb = c.bits[1][r * pw + q];
                if (!ta && !tb)
                    continue;
                int pair = tb ? PAIR_VALID : PAIR_TRAIN;
                if (d->color)
                    attron(COLOR_PAIR(pair));
                if (d->utf8) {
                    unsigned cp = 0x2800u + (unsigned)(ta | tb);
                    char u[4] = {(char)(0xe0 | (cp >> 12)), (char)(0x80 | ((cp >> 6) & 0x3f)), (char)(0x80 | (cp & 0x3f)), 0};
                    mvaddstr(y + 1 + r, x + lw + 1 + q, u);
                } else {
                    mvaddch(y + 1 + r, x + lw + 1 + q, tb ? 'o' : '*');
                }
                if (d->color)
                    attroff(COLOR_PAIR(pair));
            }
        }
    }
    free(c.bits[0]);
    free(c.bits[1]);
    /* The axes: the value range on the left, the step range below. */
    for (int r = 0; r < ph; r++)
        mvaddstr(y + 1 + r, x + lw, d->utf8 ? "\xe2\x94\x82" : "|");
    put(y + 1, x, lw, "%7.3g", hi);
    if (ph >= 5)
        put(y + 1 + ph / 2, x, lw, "%7.3g", (hi + lo) / 2);
    put(y + ph, x, lw, "%7.3g", lo);
    mvaddstr(y + 1 + ph, x + lw, d->utf8 ? "\xe2\x94\x94" : "+");
    for (int q = 0; q < pw; q++)
        addstr(d->utf8 ? "\xe2\x94\x80" : "-");
    char right[32];
    int rl = snprintf(right, sizeof right, "%.0f", xhi);
    put(y + 1 + ph, x + lw + 2, pw - rl - 3, "step %.0f", xlo);
    put(y + 1 + ph, x + w - rl - 1, rl, "%s", right);
}

/* ---- the screen ------------------------------------------------------------------------------- */

static void draw(struct dash *d)
{
    struct kiln_watch *w = d->w;
    erase();
    int H = LINES, W = COLS;
    bool final = !strcmp(w->state, "succeeded") || !strcmp(w->state, "failed") || !strcmp(w->state, "cancelled");
    int state_pair = !strcmp(w->state, "succeeded") ? PAIR_GOOD : final ? PAIR_BAD : 0;
    /* The header: who, what state, how to leave. */
    attron(A_REVERSE);
    mvhline(0, 0, ' ', W);
    put(0, 0, W, " kiln watch  job %lld%s%s  %s", w->id, w->name[0] ? "  " : "", w->name, w->state);
    if (W > 40)
        put(0, W - 8, 8, " q quit ");
    attroff(A_REVERSE);
    if (H < 4 || W < 24) {
        put(1 % H, 0, W, "%s", H > 1 ? "(terminal too small)" : "");
        refresh();
        return;
    }
    double eta_job, eta_epoch;
    double f = kiln_watch_progress(w, &eta_job, &eta_epoch);
    char a[32], b[32], suf[96];
    fmt_dur(a, sizeof a, eta_job);
    fmt_dur(b, sizeof b, eta_epoch);
    int y = 1;
    snprintf(suf, sizeof suf, "epoch %.0f/%.0f  ETA %s", w->have_step ? w->epoch : 0, w->epochs, final ? "done" : a);
    bar(d, y++, "Job", f, suf);
    if (H >= 6) {
        double fe = w->have_step && w->batches > 0 ? (w->batch + 1) / w->batches : 0;
        if (!strcmp(w->state, "succeeded"))
            fe = 1;
        snprintf(suf, sizeof suf, "batch %.0f/%.0f  ETA %s", w->have_step ? w->batch + 1 : 0,
                 w->have_step ? w->batches : 0, final ? "done" : b);
        bar(d, y++, "Epoch", fe, suf);
    }
    char mem[32] = "-";
    if (w->have_epoch && isfinite(w->peak_rss_mb))
        snprintf(mem, sizeof mem, "%.0f MB", w->peak_rss_mb);
    if (w->have_step)
        put(y++, 0, W, "step %.0f  loss %.4f  acc %.4f  lr %.4g  %.0f items/s  mem %s", w->step, w->loss, w->acc,
            w->lr, w->items_per_sec, mem);
    else
        put(y++, 0, W, "step -  loss -  acc -  lr -  items/s -  mem %s", mem);
    if (H >= 8) {
        if (w->have_epoch)
            put(y++, 0, W, "epoch %.0f  train loss %.4f acc %.4f  valid loss %.4f acc %.4f  (%.1fs)", w->ep_epoch,
                w->ep_train_loss, w->ep_train_acc, w->ep_valid_loss, w->ep_valid_acc, w->epoch_seconds);
        else
            put(y++, 0, W, "validation: after the first epoch");
    }
    /* What is left: the plots, then the log, then the footer. */
    int footer = H - 1;
    int avail = footer - y;
    int nlog = avail >= 16 ? 5 : avail >= 11 ? 3 : avail >= 7 ? 1 : 0;
    if (nlog > w->nlogs)
        nlog = w->nlogs > 0 ? w->nlogs : (avail >= 7 ? 1 : 0);
    int plot_h = avail - (nlog ? nlog + 1 : 0);
    double xmax = w->have_step && w->batches > 0 ? w->epochs * w->batches : 0;
    if (plot_h >= 4) {
        if (W >= 70) {
            int half = W / 2;
            plot(d, y, 0, plot_h, half - 1, "Loss", &w->train_loss, &w->valid_loss, xmax);
            plot(d, y, half, plot_h, W - half, "Accuracy", &w->train_acc, &w->valid_acc, xmax);
        } else if (plot_h >= 8) {
            plot(d, y, 0, plot_h / 2, W, "Loss", &w->train_loss, &w->valid_loss, xmax);
            plot(d, y + plot_h / 2, 0, plot_h - plot_h / 2, W, "Accuracy", &w->train_acc, &w->valid_acc, xmax);
        } else {
            plot(d, y, 0, plot_h, W, "Loss", &w->train_loss, &w->valid_loss, xmax);
        }
    }
    if (nlog) {
        int ly = footer - nlog - 1;
        attron(A_BOLD);
        put(ly, 0, W, "Log");
        attroff(A_BOLD);
        for (int i = 0; i < nlog; i++) {
            const char *l = kiln_watch_log_line(w, nlog - 1 - i);
            if (l)
                put(ly + 1 + i, 0, W, "%s", l);
        }
    }
    if (state_pair && d->color)
        attron(COLOR_PAIR(state_pair));
    attron(A_REVERSE);
    mvhline(footer, 0, ' ', W);
    put(footer, 0, W, " %s", d->status);
    attroff(A_REVERSE);
    if (state_pair && d->color)
        attroff(COLOR_PAIR(state_pair));
    refresh();
}

static void on_event(void *ctx, const char *type, const char *data)
{
    struct dash *d = ctx;
    kiln_watch_apply(d->w, type, data, false);
    d->dirty = true;
}

static void final_status(struct dash *d)
{
    struct kiln_watch *w = d->w;
    if (!strcmp(w->state, "succeeded") && w->name[0])
        snprintf(d->status, sizeof d->status, "job succeeded; model '%.100s' is served (kiln predict %.40s ...)  q: quit",
                 w->name, w->name);
    else if (w->error[0])
        snprintf(d->status, sizeof d->status, "job %s: %.140s  q: quit", w->state, w->error);
    else
        snprintf(d->status, sizeof d->status, "job %s  q: quit", w->state);
}

int kiln_dashboard_run(const struct kiln_client *given, struct kiln_watch *w, bool exit_on_end)
{
    /* Reconnects try for a second at most: the screen and its 'q' must not wait on a host that
     * drops packets for the CLI's 10 s (the next try comes a second later). */
    struct kiln_client client = *given;
    client.connect_timeout_ms = 1000;
    const struct kiln_client *cl = &client;
    setlocale(LC_ALL, "");
    struct dash d = {.w = w, .utf8 = strcmp(nl_langinfo(CODESET), "UTF-8") == 0, .dirty = true};
    /* The terminal's own size, not an exported $COLUMNS/$LINES, which ncurses would prefer and
     * which would draw a screen that does not fit. (use_env(FALSE) also stops ncurses following
     * a resize, so the variables go instead, when the kernel knows the size.) */
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
        unsetenv("COLUMNS");
        unsetenv("LINES");
    }
    SCREEN *scr = newterm(NULL, stdout, stdin);
    if (!scr) {
        fprintf(stderr, "kiln: watch: cannot use this terminal (TERM=%s); try --plain\n",
                getenv("TERM") ? getenv("TERM") : "");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_sigint}, old_int, old_term;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    cbreak();
    noecho();
    nonl();
    keypad(stdscr, TRUE);
    nodelay(stdscr, TRUE);
    curs_set(0);
    /* NO_COLOR (no-color.org): set and not empty, no colour whatever the terminal offers */
    const char *no_color = getenv("NO_COLOR");
    if (!(no_color && no_color[0]) && has_colors() && start_color() == OK) {
        use_default_colors();
        init_pair(PAIR_TRAIN, COLOR_CYAN, -1);
        init_pair(PAIR_VALID, COLOR_YELLOW, -1);
        init_pair(PAIR_GOOD, COLOR_GREEN, -1);
        init_pair(PAIR_BAD, COLOR_RED, -1);
        init_pair(PAIR_DIM, COLOR_WHITE, -1);
        d.color = true;
    }
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%lld/events", w->id);
    struct kiln_sse s;
    kiln_sse_init(&s);
    double next_connect = 0, last_draw = 0;
    bool fatal = false, quit = false;
    int rc = 0;
    snprintf(d.status, sizeof d.status, "connecting to %.150s", cl->shown);
    while (!quit && !interrupted) {
        double t = now_s();
        if (s.fd < 0 && !w->done && !fatal && t >= next_connect) {
            if (kiln_sse_open(&s, cl, path) == 0) {
                snprintf(d.status, sizeof d.status, "following job %lld at %.120s  q: quit", w->id, cl->shown);
            } else {
                snprintf(d.status, sizeof d.status, "%.150s; retrying  q: quit", s.error);
                next_connect = t + 1;
            }
            d.dirty = true;
        }
        double wait = d.dirty ? 0.1 - (t - last_draw) : 1.0;
        if (s.fd < 0 && !w->done && !fatal)
            wait = fmin(wait, next_connect - t);
        struct pollfd p[2] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = s.fd, .events = POLLIN}};
        int pr = poll(p, s.fd >= 0 ? 2 : 1, wait > 0 ? (int)(wait * 1000) + 1 : 0);
        if (pr < 0 && errno != EINTR)
            break;
        if (pr > 0 && s.fd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            int r = kiln_sse_pump(&s, on_event, &d);
            if (r <= 0) {
                if (r < 0 && s.status > 0 && s.status != 200) {
                    fatal = true; /* kilnd refused (the job is gone, no permission): retrying will not help */
                    snprintf(d.status, sizeof d.status, "%.180s  q: quit", s.error);
                } else if (!w->done) {
                    snprintf(d.status, sizeof d.status, "connection lost; resuming after event %s  q: quit",
                             s.last_id[0] ? s.last_id : "0");
                }
                kiln_sse_close(&s);
                next_connect = now_s() + (r == 0 ? 0.1 : 1.0);
                d.dirty = true;
            }
        }
        if (w->done && s.fd >= 0) {
            kiln_sse_close(&s);
            d.dirty = true;
        }
        if (w->done)
            final_status(&d);
        /* Keys: also after EINTR, since SIGWINCH turns into KEY_RESIZE here. */
        for (int ch; (ch = getch()) != ERR;) {
            if (ch == 'q' || ch == 'Q' || ch == 27) {
                quit = true;
            } else if (ch == KEY_RESIZE || ch == 12 /* Ctrl-L */) {
                clearok(curscr, TRUE);
                d.dirty = true;
                last_draw = 0;
            }
        }
        t = now_s();
        if ((d.dirty && t - last_draw >= 0.1) || t - last_draw >= 1.0) {
            draw(&d);
            d.dirty = false;
            last_draw = t;
        }
        if (w->done && exit_on_end) {
            draw(&d);
            break;
        }
    }
    kiln_sse_close(&s);
    endwin();
    delscreen(scr);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (interrupted) {
        if (!w->done)
            fprintf(stderr, "kiln: stopped watching; job %lld goes on (kiln cancel %lld stops it)\n", w->id, w->id);
        return 128 + interrupted;
    }
    if (fatal) {
        fprintf(stderr, "kiln: watch: %s\n", s.error);
        return 1;
    }
    if (w->done) {
        printf("job %lld: %s%s%s\n", w->id, w->state, w->error[0] ? ": " : "", w->error);
        if (w->final_metrics[0])
            printf("job %lld: %s\n", w->id, w->final_metrics);
        rc = w->exit_code;
    } else if (quit) {
        /* 0 is for a job that succeeded: one left running is said, with its own status */
        fprintf(stderr, "kiln: stopped watching; job %lld is %s and goes on (kiln cancel %lld stops it)\n", w->id,
                w->state[0] ? w->state : "running", w->id);
        rc = 3;
    }
    return rc;
}
