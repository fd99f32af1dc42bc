// cumsum: inclusive prefix sums along a dim (vk-reduce.c). Float outputs accumulate in AT
// (double when a slot is f64, else float), integers in int64 wrapping. Slot 0 out, slot 1
// in, binding 3 the offsets of PASS_SCAN (in AT).
//
// A thread never walks a whole long lane: no loop's trip count grows with the lane (a GPU
// would run such a lane on one core, and llvmpipe cuts every shader loop off after 65535
// iterations, silently). Short lanes (PASS_SERIAL) take one thread each. Longer ones are
// cut into blocks of BLOCK elements, each scanned by one workgroup in shared memory;
// PASS_TOTALS writes each block's total (out_d[lane * blocks + block], slot 0 then being
// AT's dtype), the host scans those totals per lane the same way, and PASS_SCAN rescans
// each block starting from the total of every block before it (offsets_d[g - 1]). Every
// sum is taken in an order fixed by the shapes alone, so a result never depends on timing.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_lane; // out with the dim sized 1: the first element of each lane
    KView in_lane;
    int len;
    int out_step;
    int in_step;
    int blocks;      // blocks per lane (PASS_TOTALS and PASS_SCAN)
    int has_offsets; // PASS_SCAN: offsets_d holds the running totals of the blocks
};
KVK_SPEC(3, PASS, 0);

#define PASS_SERIAL 0u
#define PASS_TOTALS 1u
#define PASS_SCAN 2u
#define WG 128 // the workgroup size the host launches with (KVK_WG)
#define ITEMS 8
#define BLOCK (WG * ITEMS) // CUMSUM_BLOCK in vk-reduce.c

#if KVK_F0
#if KVK_DOUBLE
#define AT double
#else
#define AT float
#endif
#if KVK_F1
#define LOADA(o) AT(LD1(in_d[o]))
#else
#define LOADA(o) AT(TOL1(LD1(in_d[o])))
#endif
#define STOREA(x) ST0(C0(x))
#else
#define AT int64_t
#if KVK_F1
#define LOADA(o) kvk_f2l(LD1(in_d[o]))
#else
#define LOADA(o) TOL1(LD1(in_d[o]))
#endif
#define STOREA(x) ST0(FROML0(x))
#endif

KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, in_d);
KVK_BUF_RO(3, AT, offsets_d);

shared AT part[WG];

// Inclusive scan of one block: thread t holds elements t * ITEMS .. t * ITEMS + ITEMS - 1
// in v. Its own run first, then the threads' totals through a Hillis-Steele scan.
void block_scan(inout AT v[ITEMS])
{
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (int i = 1; i < ITEMS; i++)
        v[i] += v[i - 1];
    part[t] = v[ITEMS - 1];
    barrier();
    [[unroll]] for (uint off = 1u; off < WG; off <<= 1) {
        AT x = part[t];
        if (t >= off)
            x = part[t - off] + x;
        barrier();
        part[t] = x;
        barrier();
    }
    AT before = t > 0u ? part[t - 1u] : AT(0);
    barrier(); // part is the next block's
    [[unroll]] for (int i = 0; i < ITEMS; i++)
        v[i] = before + v[i];
}

void main()
{
    if (PASS == PASS_SERIAL) {
        // len is at most CUMSUM_SERIAL_MAX here
        KVK_FOR_EACH(l, in_lane.numel) {
            int ob = kvk_at(out_lane, l), ib = kvk_at(in_lane, l);
            AT s = AT(0);
            for (int j = 0; j < len; j++) {
                s += LOADA(ib + j * in_step);
                out_d[ob + j * out_step] = STOREA(s);
            }
        }
        return;
    }
    uint t = gl_LocalInvocationID.x;
    int total = in_lane.numel * blocks;
    for (int g = int(gl_WorkGroupID.x); g < total; g += int(gl_NumWorkGroups.x)) {
        int l = g / blocks, b = g - l * blocks;
        int ib = kvk_at(in_lane, l);
        int first = b * BLOCK + int(t) * ITEMS;
        AT v[ITEMS];
        [[unroll]] for (int i = 0; i < ITEMS; i++)
            v[i] = first + i < len ? LOADA(ib + (first + i) * in_step) : AT(0);
        block_scan(v);
        if (PASS == PASS_TOTALS) {
            // the block's last element as PASS_SCAN computes it, before its offset
            if (t == WG - 1u)
                out_d[g] = STOREA(v[ITEMS - 1]);
            continue;
        }
        bool offset = has_offsets != 0 && b > 0;
        AT before = offset ? offsets_d[g - 1] : AT(0);
        int ob = kvk_at(out_lane, l);
        [[unroll]] for (int i = 0; i < ITEMS; i++)
            if (first + i < len)
                out_d[ob + (first + i) * out_step] = STOREA(offset ? before + v[i] : v[i]);
    }
}
