#!/bin/bash
# Issue 21's full-depth table on the H200, one device call: for each model of TABLE
# (space-separated LIKE:FORMAT:EXPERTS[:CONTEXTS], e.g. "glm-5:q4:16:4096,131072
# deepseek-v3.2:q4:16"), a zero-weight
# synth (`--zeros`: holes, no disk, no time) at the release's full depth, then
# `sparsa bench` at CONTEXTS (default CTX, else 4096). Zero weights cost the GPU the same bytes and
# dispatches as random ones (the first entry of RANDOM=1 runs checks that on random q4).
# Needs .h200/sparsa.xz and .gl/ (the Vulkan loader debs). Results: $OUT/table.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
T=$OUT/table.txt
for m in ${TABLE:-glm-5:q4:16}; do
  IFS=: read -r like fmt experts ctx <<< "$m"
  layers=78; [ "$like" = deepseek-v3.2 ] && layers=61
  zeros=--zeros; [ -n "${RANDOM_FIRST:-}" ] && { zeros=; RANDOM_FIRST=; }
  D=/tmp/m
  echo "== $like $fmt experts $experts layers $layers ${zeros:-random}" >> $T
  ( time $S synth --like $like --layers $layers --experts $experts --format $fmt $zeros --out $D ) 2>&1 | tail -4 >> $T
  timeout ${BENCH_TIMEOUT:-150} $S bench --model $D --context ${ctx:-${CTX:-4096}} --decode 32 --prompt-len 0 ${PROFILE:---no-profile} >> $T 2>&1
  rm -rf $D
done
grep -E "^==|^bench: decode|rror" $T
