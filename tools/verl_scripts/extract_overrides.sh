#!/usr/bin/env bash
# Writes the override list a verl launch script passes to verl's entry point, one per line, as the
# script spells them (tests/fixtures/verl_scripts/ holds the output). The script runs with its
# launchers (python3, torchrun, uv, ray) replaced by a stub that records the arguments after
# `-m verl.…` / `-m recipe.…`; `python3 -c` probes fail, so device detection picks the GPU branch.
# Usage: [REV=commit] extract_overrides.sh VERL_GIT_DIR SCRIPT_PATH OUT [script args...]
set -euo pipefail
repo=$1 path=$2 out=$(realpath -m "$3")
shift 3
commit=$(git -C "$repo" rev-parse "${REV:-HEAD}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$repo" show "$commit:$path" | sed 's/^\s*ulimit /: /' > "$tmp/script.sh"
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho 20260101_0000\n' > "$tmp/bin/date"  # experiment names embed the date
for b in python3 python torchrun uv ray; do
  cat > "$tmp/bin/$b" <<'EOS'
#!/usr/bin/env bash
for a in "$@"; do if [ "$a" = "-c" ]; then exit 1; fi; done
seen=0
for a in "$@"; do
  if [ $seen = 1 ]; then printf '%s\n' "$a" >> "$STUB_OUT"; fi
  if [ $seen = 0 ] && [[ "$a" == verl.* || "$a" == recipe.* ]]; then seen=1; echo "# entry: $a" >> "$STUB_OUT"; fi
done
EOS
  chmod +x "$tmp/bin/$b"
done
: > "$tmp/args"
(cd "$tmp" && env -i PATH="$tmp/bin:/usr/bin:/bin" HOME=/HOME DEVICE=gpu VERL_USE_UV=0 STUB_OUT="$tmp/args" \
  bash script.sh "$@" > /dev/null 2> "$tmp/err") || { echo "$path failed:" >&2; tail -3 "$tmp/err" >&2; exit 1; }
repo_name=$(basename "$(dirname "$(realpath "$repo")")" | tr '+' '/')
{
  echo "# source: $repo_name/$path"
  echo "# commit: $commit"
  cat "$tmp/args"
} > "$out"
