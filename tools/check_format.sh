#!/usr/bin/env bash
# Every C++ and CUDA source of the repository is formatted by .clang-format (clang-format 14, as
# Debian ships it): lists the files that are not, with the first differences, and exits 1.
#   tools/check_format.sh [SOURCE_DIR]    (fix: clang-format -i FILE ...)
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
command -v clang-format > /dev/null || { echo "format: clang-format is not installed (make deps)"; exit 2; }
files=$(find src tests bench tools -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \
          -o -name '*.cuh' -o -name '*.cc' \) -not -path '*/fixtures/*' -not -path '*/node_modules/*' | sort)
bad=0
for f in $files; do
  if ! out=$(clang-format --dry-run --Werror "$f" 2>&1); then
    echo "format: $f is not clang-formatted:"
    echo "$out" | head -6
    bad=$((bad + 1))
  fi
done
[ $bad = 0 ] && echo "format: ok ($(echo "$files" | wc -l) files)" || echo "format: $bad files to format (clang-format -i)"
[ $bad = 0 ]
