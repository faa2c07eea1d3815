#!/bin/bash
# Issue 25 on the H200, one device call: what a speculative round costs when experts are
# streamed. A full-depth GLM-5 q4 synth with random weights (so drafts are rejected and a
# round yields one token: its cost is the verification's), 16 experts, its MTP layer;
# `generate --gpu-memory 24GiB` with --draft 0 and 3, twice each, alternated.
# Needs .h200/sparsa.xz and .gl/ (the Vulkan loader debs). Results: $OUT/offload-K.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
D=/tmp/r
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D ) 2>&1 | tail -3
P=$(seq -s, 1 32)
for k in 0 3 0 3; do
  echo "== generate --gpu-memory 24GiB --draft $k"
  timeout 150 $S generate --model $D --gpu-memory 24GiB --tokens $P --max-tokens 48 --ignore-eos --temperature 0 -v --draft $k > $OUT/offload-$k.txt 2>&1
  grep -E "tok/s|drafts|experts:|rror|host ms" $OUT/offload-$k.txt | head -12
done
rm -rf $D
