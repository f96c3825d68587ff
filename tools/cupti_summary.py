#!/usr/bin/env python3
"""Summarise a tools/cupti_trace.cpp timeline: time per kernel and idle gaps.

usage: cupti_summary.py trace.tsv [--graph-only] [--top N]

Kernels are grouped by name. With --graph-only only kernels replayed from CUDA graphs count, and
the figures are per replay of the most frequent graph (one replay = one decode step).
The gap is the idle time between one kernel's end and the next kernel's start on the GPU.
"""
import argparse
import collections
import re
import sys


def short(name):
    name = re.sub(r"\(.*", "", name)
    return name[:90]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--graph-only", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rows = []
    for line in open(a.trace):
        f = line.rstrip("\n").split("\t")
        if len(f) < 7:
            continue
        rows.append((int(f[0]), int(f[1]), int(f[2]), int(f[3]), f[4], f[5], f[6]))
    rows.sort()
    if not rows:
        sys.exit("no kernels in " + a.trace)
    replays = 1
    if a.graph_only:
        by_graph = collections.Counter(r[2] for r in rows if r[2] != 0)
        if not by_graph:
            sys.exit("no graph kernels in " + a.trace)
        graph = by_graph.most_common(1)[0][0]
        rows = [r for r in rows if r[2] == graph]
        first_node = rows[0][3]
        replays = sum(1 for r in rows if r[3] == first_node)
        print(f"graph {graph}: {len(rows)} kernels, {replays} replays, "
              f"{len(rows) / replays:.0f} kernels per replay")
    total = collections.defaultdict(int)
    count = collections.Counter()
    gaps = 0
    span = 0
    for i, r in enumerate(rows):
        total[short(r[6])] += r[1] - r[0]
        count[short(r[6])] += 1
        if i > 0:
            gap = r[0] - rows[i - 1][1]
            if 0 < gap < 50_000:  # idle time inside a step, not between steps
                gaps += gap
    busy = sum(total.values())
    print(f"busy {busy / replays / 1e3:.1f} us per replay, gaps {gaps / replays / 1e3:.1f} us "
          f"per replay (gaps under 50 us)")
    for name, t in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{t / replays / 1e3:9.1f} us {count[name] / replays:6.1f}x  "
              f"{t / count[name] / 1e3:7.2f} us each  {name}")


if __name__ == "__main__":
    main()
