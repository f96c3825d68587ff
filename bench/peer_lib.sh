# shellcheck shell=bash
# Sourced by bench/*_cuda.sh, which time one of ours beside its HuggingFace peer: picks the binaries
# and gives run(). Expects $root (the repository) set by the caller.
: "${root:?set root to the repository before sourcing bench/peer_lib.sh}"
#   VERL    the verl binary (default .gpu/verl when it exists, else $BUILD/bin/verl, BUILD=build);
#           its folder is put in front of LD_LIBRARY_PATH for its run (.gpu holds its libraries)
#   PYTHON  python with torch and transformers (default /opt/torch/.venv/bin/python3 when it
#           exists, else python3)
if [ -z "${VERL:-}" ]; then
  if [ -x "$root/.gpu/verl" ]; then VERL=$root/.gpu/verl; else VERL=${BUILD:-$root/build}/bin/verl; fi
fi
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run NAME CMD...: the command's JSON line goes to $work/NAME.json and stdout. A run that printed
# none (a crash, an argument error) is recorded as {"bench": NAME, "error": ...} with its last
# stderr line.
run() {
  local name=$1
  shift
  "$@" > "$work/$name.out" 2> "$work/$name.err"
  local rc=$?
  local line
  line=$(grep '^{' "$work/$name.out" | tail -n 1)
  if [ -z "$line" ]; then
    line=$("$PYTHON" -c 'import json, sys; print(json.dumps({"bench": sys.argv[1], "error": "exit %s: %s" % (sys.argv[2], sys.argv[3])}))' \
      "$name" "$rc" "$(grep -v '^\s*$' "$work/$name.err" | tail -n 1)")
  elif [ $rc -ne 0 ]; then
    tail -n 5 "$work/$name.err" >&2
  fi
  echo "$line" > "$work/$name.json"
  echo "$line"
}

# run_verl NAME ARGS...: run NAME with our binary, its folder first on LD_LIBRARY_PATH.
run_verl() {
  local name=$1
  shift
  run "$name" env LD_LIBRARY_PATH="$(dirname "$VERL"):${LD_LIBRARY_PATH:-}" "$VERL" "$@"
}
