#!/usr/bin/env python3
"""Loads a TensorBoard log directory written by verl.cpp with TensorBoard's own reader
(EventAccumulator) and prints its scalars, to prove our hand-written event files are valid.

  python3 tools/check_tensorboard.py DIR                 # print every scalar series
  python3 tools/check_tensorboard.py DIR --expect-sample # also assert the values that the
      test TensorBoardLogger.SampleForExternalCheck writes (VERL_METRICS_SAMPLE_DIR=DIR)
Exit code 0 when the directory loads (and the expected values match), 1 otherwise.
"""
import argparse
import glob
import math
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# Must match tests/metrics/tfevents_test.cpp (SampleForExternalCheck).
SAMPLE_STEPS = range(1, 6)
SAMPLE = {
    "critic/score/mean": lambda s: 0.1 * s,
    "timing_s/gen": lambda s: 1.5 + s,
    "perf/throughput": lambda s: 1000.0 * s,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir", help="directory holding events.out.tfevents.* files")
    ap.add_argument("--expect-sample", action="store_true", help="check the test sample's values")
    args = ap.parse_args()

    files = sorted(glob.glob(os.path.join(args.logdir, "*tfevents*")))
    if not files:
        print(f"no event files in {args.logdir}")
        return 1
    print("event files:", *files, sep="\n  ")

    # size_guidance 0: keep every scalar (the default samples down to 10000 per tag).
    acc = EventAccumulator(args.logdir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = sorted(acc.Tags().get("scalars", []))
    print(f"{len(tags)} scalar tags")
    for tag in tags:
        events = acc.Scalars(tag)
        pts = ", ".join(f"{e.step}:{e.value:.6g}" for e in events[:8])
        more = f" ... ({len(events)} points)" if len(events) > 8 else ""
        print(f"  {tag}: {pts}{more}")

    if not args.expect_sample:
        return 0 if tags else 1
    ok = True
    for tag, fn in SAMPLE.items():
        if tag not in tags:
            print(f"MISSING tag {tag}")
            ok = False
            continue
        got = {e.step: e.value for e in acc.Scalars(tag)}
        for s in SAMPLE_STEPS:
            want = fn(s)
            if s not in got or not math.isclose(got[s], want, rel_tol=1e-6, abs_tol=1e-6):
                print(f"MISMATCH {tag} step {s}: got {got.get(s)}, want {want}")
                ok = False
    print("sample check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
