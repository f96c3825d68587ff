# Helpers shared by the e2e scripts (sourced; they set `pass` and `fail`).
pass=0 fail=0
# check WHAT COMMAND...: counts COMMAND's success, prints WHAT when it fails.
check() {
  local what=$1
  shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $what"; fail=$((fail + 1)); fi
}
# compare A B STEPS KEYS...: each step's metrics in A/metrics.jsonl and B/metrics.jsonl agree within
# 1e-4 relative (1e-7 absolute for values near zero, e.g. PPO's pg_loss over whitened advantages);
# a key missing on either side is a difference.
compare() {
  python3 - "$@" <<'PY'
import json, sys
a, b, steps, keys = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split(",")], sys.argv[4:]
def rows(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        out[r["step"]] = {**out.get(r["step"], {}), **r}
    return out
ra, rb = rows(a + "/metrics.jsonl"), rows(b + "/metrics.jsonl")
bad = 0
for s in steps:
    for k in keys:
        x, y = ra.get(s, {}).get(k), rb.get(s, {}).get(k)
        if x is None or y is None or abs(x - y) > 1e-7 + 1e-4 * max(abs(x), abs(y)):
            print(f"step {s} {k}: {x} vs {y}"); bad += 1
sys.exit(1 if bad else 0)
PY
}
