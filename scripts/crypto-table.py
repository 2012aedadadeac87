#!/usr/bin/env python3
"""Summarise the `crypto_libs` criterion run as the crypto table of docs/results.md ("Crypto crates").

Usage:
    cargo bench -p accel --bench crypto_libs -- --warm-up-time 1 --measurement-time 2
    python3 scripts/crypto-table.py [target/criterion]

Prints, per algorithm and size, the median time per operation of each crate,
MB/s, and the fastest crate, read from criterion's estimates.json files.
"""
import json
import pathlib
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
rows = {}
for est in root.glob("*/*/*/new/estimates.json"):
    group, crate, size = est.parts[-5], est.parts[-4], est.parts[-3]
    if not size.isdigit():
        continue
    median_ns = json.loads(est.read_text())["median"]["point_estimate"]
    rows.setdefault((group, int(size)), {})[crate] = median_ns

if not rows:
    sys.exit(f"no criterion results under {root}; run the bench first")

crates = sorted({c for r in rows.values() for c in r})
print("| operation | bytes | " + " | ".join(f"{c} ns (MB/s)" for c in crates) + " | fastest |")
print("|---|---:|" + "---:|" * len(crates) + "---|")
for (group, size) in sorted(rows):
    r = rows[(group, size)]
    best = min(r, key=r.get)
    cells = []
    for c in crates:
        if c in r:
            text = f"{r[c]:,.0f} ({size / r[c] * 1e3:,.0f})"
            cells.append(f"**{text}**" if c == best else text)
        else:
            cells.append("—")
    print(f"| {group} | {size} | " + " | ".join(cells) + f" | {best} |")
