// sort: a stable sort along a dim (vk-sort.c), as a bitonic sorting network over keys.
// Slot 0 is the input and the values, slot 1 the i64 indices; HAS_VALUES / HAS_INDICES say
// which outputs exist.
//
// Each element becomes a (key, position) pair: key is the value mapped to a uint64 whose
// unsigned order is the sort's order (NaN after every number and all NaNs equal, -0 equal
// to +0; every bit inverted for descending), position its index in the lane. Pairs compare
// by key, then position, so no two are equal and the network's result is exactly the stable
// order the host's merge sort gives, in both directions. Lanes are padded to P = 2^log_p
// pairs with (all ones, all ones), which sort after every real one.
//
// The lanes' padded pairs are numbered flat (lane * P + i) and cut into tiles of TILE, one
// workgroup each, sorted in shared memory. PASS_TILE_SORT runs every stage of the network
// up to min(P, TILE) on pairs made from the input; when P > TILE the host then runs each
// later stage (merge width k) as PASS_GLOBAL_STEP dispatches, one per compare distance j of
// TILE or more, over the scratch (key_d, pos_d), and PASS_TILE_MERGE for the distances
// below TILE. The stage's last pass writes the outputs when to_output is set (k == P).
// A thread's loops run a fixed number of times (TILE / 2 / WG per step), whatever len is.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView in_lane; // each lane's first element
    KView val_lane;
    KView idx_lane;
    int len;
    int in_step;
    int val_step;
    int idx_step;
    int lanes;
    int log_p;     // P = 1 << log_p: the padded lane
    int stage;     // k, the width of the bitonic merge (PASS_GLOBAL_STEP, PASS_TILE_MERGE)
    int step;      // j, the compare distance (PASS_GLOBAL_STEP)
    int to_output; // this pass ends the sort: write values and indices, not the scratch
};
KVK_BUF_RO(1, S0, in_d);
KVK_BUF_WO(2, S0, val_d);
KVK_BUF_WO(3, S1, idx_d);
KVK_BUF_RW(4, uint64_t, key_d);
KVK_BUF_RW(5, uint, pos_d);
KVK_SPEC(3, PASS, 0);
KVK_SPEC(4, DESCENDING, 0);
KVK_SPEC(5, HAS_VALUES, 1);
KVK_SPEC(6, HAS_INDICES, 1);

#define PASS_TILE_SORT 0u
#define PASS_GLOBAL_STEP 1u
#define PASS_TILE_MERGE 2u
#define WG 128u    // the workgroup size the host launches with (KVK_WG)
#define TILE 1024u // SORT_TILE in vk-sort.c
#define PAD_KEY 0xfffffffffffffffful
#define PAD_POS 0xffffffffu

shared uint64_t sk[TILE];
shared uint sp[TILE];

uint64_t sort_key(int off)
{
    uint64_t u;
#if KVK_F0
#if KVK_DOUBLE
    double x = double(LD0(in_d[off]));
    if (isnan(x)) {
        u = PAD_KEY;
    } else {
        uint64_t b = x == 0.0lf ? 0ul : packUint2x32(unpackDouble2x32(x));
        u = (b >> 63) != 0ul ? ~b : b | 0x8000000000000000ul;
    }
#else
    float x = float(LD0(in_d[off]));
    uint b = x == 0.0 ? 0u : floatBitsToUint(x);
    uint k32 = isnan(x) ? 0xffffffffu : (b >> 31) != 0u ? ~b : b | 0x80000000u;
    u = uint64_t(k32);
#endif
#else
    u = uint64_t(TOL0(LD0(in_d[off]))) ^ 0x8000000000000000ul;
#endif
    return DESCENDING != 0u ? ~u : u;
}

// does pair a come after pair b?
bool after(uint64_t ka, uint pa, uint64_t kb, uint pb) { return ka > kb || (ka == kb && pa > pb); }

// (lane, i) of flat pair f
int lane_of(int f) { return f >> log_p; }
int index_of(int f) { return f & ((1 << log_p) - 1); }

// The lower pair of compare q at distance j: q with a 0 bit inserted at j's bit.
uint lower_of(uint q, uint j) { return ((q & ~(j - 1u)) << 1) | (q & (j - 1u)); }

// One compare-exchange step (merge width k, distance j < TILE) over the tile at flat base.
void tile_step(int base, uint k, uint j)
{
    for (uint q = gl_LocalInvocationID.x; q < TILE / 2u; q += WG) {
        uint a = lower_of(q, j), b = a | j;
        bool up = (uint(index_of(base + int(a))) & k) == 0u;
        uint64_t ka = sk[a], kb = sk[b];
        uint pa = sp[a], pb = sp[b];
        if (after(ka, pa, kb, pb) == up) {
            sk[a] = kb;
            sk[b] = ka;
            sp[a] = pb;
            sp[b] = pa;
        }
    }
    barrier();
}

void load_tile(int base)
{
    for (uint e = gl_LocalInvocationID.x; e < TILE; e += WG) {
        int f = base + int(e), l = lane_of(f), i = index_of(f);
        if (PASS == PASS_TILE_MERGE) {
            sk[e] = key_d[f];
            sp[e] = pos_d[f];
        } else if (l < lanes && i < len) {
            sk[e] = sort_key(kvk_at(in_lane, l) + i * in_step);
            sp[e] = uint(i);
        } else {
            sk[e] = PAD_KEY;
            sp[e] = PAD_POS;
        }
    }
    barrier();
}

void store_tile(int base)
{
    for (uint e = gl_LocalInvocationID.x; e < TILE; e += WG) {
        int f = base + int(e), l = lane_of(f), i = index_of(f);
        if (to_output == 0) {
            key_d[f] = sk[e];
            pos_d[f] = sp[e];
        } else if (l < lanes && i < len) {
            int from = int(sp[e]); // a real element: pads sort after every one
            if (HAS_VALUES != 0u)
                val_d[kvk_at(val_lane, l) + i * val_step] = in_d[kvk_at(in_lane, l) + from * in_step];
            if (HAS_INDICES != 0u)
                idx_d[kvk_at(idx_lane, l) + i * idx_step] = ST1(int64_t(from));
        }
    }
    barrier(); // sk and sp are the next tile's
}

void main()
{
    int total = lanes << log_p;
    if (PASS == PASS_GLOBAL_STEP) {
        uint k = uint(stage), j = uint(step);
        KVK_FOR_EACH(q, total / 2) {
            uint a = lower_of(uint(q), j), b = a | j;
            bool up = (uint(index_of(int(a))) & k) == 0u;
            uint64_t ka = key_d[a], kb = key_d[b];
            uint pa = pos_d[a], pb = pos_d[b];
            if (after(ka, pa, kb, pb) == up) {
                key_d[a] = kb;
                key_d[b] = ka;
                pos_d[a] = pb;
                pos_d[b] = pa;
            }
        }
        return;
    }
    int tiles = (total + int(TILE) - 1) / int(TILE);
    uint width = min(1u << log_p, TILE);
    for (int t = int(gl_WorkGroupID.x); t < tiles; t += int(gl_NumWorkGroups.x)) {
        int base = t * int(TILE);
        load_tile(base);
        if (PASS == PASS_TILE_SORT) {
            for (uint k = 2u; k <= width; k <<= 1)
                for (uint j = k >> 1; j > 0u; j >>= 1)
                    tile_step(base, k, j);
        } else {
            for (uint j = TILE >> 1; j > 0u; j >>= 1)
                tile_step(base, uint(stage), j);
        }
        store_tile(base);
    }
}
