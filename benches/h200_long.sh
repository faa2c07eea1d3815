#!/bin/bash
# The long-context runs behind BENCHMARKS.md ("Long context at real depth"), one model per
# call (each synthetic model is 30-40 GB; the GPU machine has 64 GB of disk):
#   benches/h200_long.sh glm-5 | glm-5.2 | deepseek-v3.2
# Run from the repository root on the GPU machine with a release `sparsa` at $SPARSA
# (default target/release/sparsa); results go to $OUT (default benches/results/new).
# Decode at full depth (78 or 61 layers, 16 experts: the bytes a real token touches) with
# synthetic cache fill, per cache format; the dense baseline where it fits.
set -u
S="${SPARSA:-target/release/sparsa}"
OUT="${OUT:-benches/results/new}"
mkdir -p "$OUT"
like="$1"
case "$like" in
  glm-5) layers=78; tag=g5 ;;
  glm-5.2) layers=78; tag=g52 ;;
  deepseek-v3.2) layers=61; tag=ds ;;
  *) echo "usage: $0 glm-5|glm-5.2|deepseek-v3.2" >&2; exit 2 ;;
esac
M=/tmp/$tag
[ -d "$M" ] || "$S" synth --like "$like" --layers $layers --experts 16 --format q4 --out "$M" 2>&1 | tail -1
B="$S bench --model $M --prompt-len 0 --decode 16"
run() { # name, args...
  local name=$1; shift
  echo "== $name: $*"
  $B "$@" --json "$OUT/${tag}_$name.json" > "$OUT/${tag}_$name.txt" 2>&1
  grep -E "^decode at|error" "$OUT/${tag}_$name.txt"
}
case "$like" in
  glm-5)
    run f32 --context 4096,32768,131072 --cache-type f32
    run fp8 --context 4096,32768,131072 --cache-type fp8
    run fp8i8 --context 4096,131072 --cache-type fp8/i8
    run dense --context 4096,32768,131072 --cache-type fp8 --dense
    ;;
  glm-5.2)
    [ -n "${AUTO_ONLY:-}" ] && { run auto --context 4096,1048576; rm -rf "$M"; exit; }
    run auto --context 4096,16384,65536,262144,1048576
    run fp8 --context 4096,1048576 --cache-type fp8
    run fp8i8 --context 1048576 --cache-type fp8/i8
    run dense --context 4096,16384,65536,262144 --cache-type fp8 --dense
    ;;
  deepseek-v3.2)
    run auto --context 4096,163840
    run fp8 --context 4096,163840 --cache-type fp8
    ;;
esac
rm -rf "$M"
