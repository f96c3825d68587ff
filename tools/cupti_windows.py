#!/usr/bin/env python3
"""A tools/cupti_trace.cpp timeline cut into fixed windows: for each window the share of the time
some kernel ran (merged over streams) and the kernel family that ran longest in it, so host gaps
show up by phase of a step (generation, log-prob passes, update).

usage: cupti_windows.py trace.tsv [--window-ms 20] [--last-s S]   (S: only the last S seconds)
"""
import argparse
import collections
import re


def family(name):
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"^_Z\d+", "", name)
    return name[:48]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--window-ms", type=float, default=20.0)
    ap.add_argument("--last-s", type=float, default=0.0)
    a = ap.parse_args()
    rows = []
    for line in open(a.trace):
        f = line.rstrip("\n").split("\t")
        if len(f) >= 7:
            rows.append((int(f[0]), int(f[1]), f[6]))
    rows.sort()
    t_end = max(r[1] for r in rows)
    t0 = rows[0][0] if a.last_s <= 0 else max(rows[0][0], t_end - int(a.last_s * 1e9))
    w = int(a.window_ms * 1e6)
    nwin = (t_end - t0) // w + 1
    busy = [0] * nwin
    fam = [collections.Counter() for _ in range(nwin)]
    cur_s = cur_e = None
    def add_busy(s, e):
        while s < e:
            i = (s - t0) // w
            ce = min(e, t0 + (i + 1) * w)
            busy[i] += ce - s
            s = ce
    for s, e, n in rows:
        if e <= t0:
            continue
        s = max(s, t0)
        i = (s - t0) // w
        fam[i][family(n)] += e - s
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                add_busy(cur_s, cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        add_busy(cur_s, cur_e)
    total_busy = sum(busy)
    print(f"span {(t_end - t0) / 1e9:.3f} s, busy {total_busy / 1e9:.3f} s ({100 * total_busy / (t_end - t0):.1f}%)")
    for i in range(nwin):
        top = fam[i].most_common(2)
        names = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in top)
        print(f"{i * a.window_ms:8.0f} ms busy {100 * busy[i] / w:5.1f}%  {names}")


if __name__ == "__main__":
    main()
