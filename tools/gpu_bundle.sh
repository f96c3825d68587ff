#!/usr/bin/env bash
# Packs built binaries and the Debian shared libraries they need that the GPU machine (Ubuntu) does
# not have, for the device tool's `carry`: out/gpu/bin/<name>.xz (stripped) and
# out/gpu/deblibs.tar.xz (lib/...). On the GPU machine, `tools/gpu_bundle.sh --unpack` restores
# out/gpu/bin/<name> and out/gpu/lib/ and prints the LD_LIBRARY_PATH to use.
#
#   tools/gpu_bundle.sh [BUILD_DIR] [BINARY ...]   (default: build, verl test_cuda test_cuda_mpi)
#   tools/gpu_bundle.sh --unpack
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/out/gpu
if [ "${1:-}" = --unpack ]; then
  mkdir -p "$out/lib"
  tar -xJf "$out/deblibs.tar.xz" -C "$out"
  for f in "$out"/bin/*.xz; do xz -dkf "$f" && chmod +x "${f%.xz}"; done
  echo "$out/lib"
  exit 0
fi
build=${1:-$root/build}
shift || true
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(verl test_cuda test_cuda_mpi)
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
for b in "${bins[@]}"; do
  strip -o "$out/bin/$b" "$build/bin/$b"
  xz -T2 -6 -f "$out/bin/$b"
done
# The libraries Ubuntu lacks (or has in other versions): Debian's fmt, yaml-cpp, ICU, PCRE2,
# OpenBLAS (and its Fortran runtime), snappy.
pattern='libfmt|libyaml-cpp|libicu|libpcre2-8|libopenblas|libgfortran|libquadmath|libsnappy'
for b in "${bins[@]}"; do ldd "$build/bin/$b"; done | awk '/=>/ {print $1, $3}' | grep -E "$pattern" | sort -u |
  while read -r name path; do cp -L "$path" "$out/lib/$name"; done
tar -cJf "$out/deblibs.tar.xz" -C "$out" lib
rm -rf "$out/lib"
du -sh "$out"/* | sed "s|$root/||"
