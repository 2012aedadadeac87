#!/usr/bin/env python3
"""Puts one real `espgw bench` run into README.md, verbatim.

    cargo build --release
    target/release/espgw bench --tables --report docs/results --plot docs/results \
        > docs/results/bench.txt
    python3 scripts/readme-results.py

Replaces the text between the bench-results markers in README.md with
docs/results/bench.txt, so no figure is typed by hand.
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
readme = root / "README.md"
run = (root / "docs/results/bench.txt").read_text().rstrip("\n")
text = readme.read_text()
pattern = re.compile(r"(<!-- bench-results:start -->\n)(?:.*?\n)?(<!-- bench-results:end -->)", re.S)
if not pattern.search(text):
    sys.exit("README.md has no bench-results markers")
readme.write_text(pattern.sub(lambda m: m.group(1) + "```\n" + run + "\n```\n" + m.group(2), text, count=1))
print(f"README.md: inserted {len(run.splitlines())} lines from docs/results/bench.txt")
