#!/usr/bin/env python3
"""bench/gpu/table.py RESULTS.jsonl... — the bench rows of bench/gpu/run's results.jsonl files as
one Markdown table (row, kiln, peer, unit, ratio, TF32, CUDA graph), in the order they ran; the
step lines and error rows are left out. For docs/performance.md."""
import json
import sys


def cell(v):
    if isinstance(v, float):
        return "%.4g" % v
    return "" if v is None else str(v)


rows = []
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "name" in r and "ratio" in r and "error" not in r:
                rows.append(r)
print("| row | kiln | peer | unit | ratio | TF32 | CUDA graph |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print("| %s | %s | %s | %s | %s | %s | %s |" % (
        r["name"], cell(r.get("kiln")), cell(r.get("peer")), r.get("unit", ""), cell(r.get("ratio")),
        {True: "on", False: "off"}.get(r.get("tf32"), ""), {True: "yes", False: "no"}.get(r.get("cuda_graphs"), "")))
