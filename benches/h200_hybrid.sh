#!/bin/bash
# Issue 22 on the H200, one device call: hybrid expert execution at full depth. A 78-layer
# GLM-5 q4 synth (16 experts a layer, --zeros: the routing is replayed, so the weights'
# values do not matter) under --gpu-memory 24GiB, decode at 4K with uniform (zipf:0) and
# skewed (zipf:1) replayed routing: --cpu-experts off (every miss uploaded) against auto and
# on, and the executor's thread count. Then (issue 20 item 1) a 2,048-token prefill of the
# resident model with the routed experts' GEMM on tensor cores against the f32 tile.
# Needs .h200/sparsa.xz and .gl/ (the Vulkan loader debs). Results: $OUT/*.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
( lscpu; free -g; nproc ) > $OUT/machine.txt 2>&1
grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)" $OUT/machine.txt
grep -o -E "avx512_vnni|avx512f|avx_vnni|amx_int8" $OUT/machine.txt | sort -u | tr '\n' ' '; echo
D=/tmp/m
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --zeros --out $D ) 2>&1 | tail -3
B="$S bench --model $D --context 4096 --decode 16 --prompt-len 0 --no-profile"
run() { name=$1; shift; echo "== $name: $*"; timeout 170 $B "$@" > $OUT/$name.txt 2>&1; grep -E "decode at|expert offloading|experts:|CPU experts|rror" $OUT/$name.txt | cut -c1-400; }
run u-off --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts off
run u-auto --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts auto
run u-on --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on
run u-on-8t --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on --cpu-threads 8
run z1-auto --gpu-memory 24GiB --expert-routing zipf:1.0 --cpu-experts auto
P="$S bench --model $D --context 4096 --decode 2 --prompt-len 2048 --no-profile"
for tc in 0 1; do
  echo "== prefill 2048, SPARSA_TENSOR_CORES=$tc"
  SPARSA_TENSOR_CORES=$tc timeout 120 $P > $OUT/prefill-tc$tc.txt 2>&1
  grep -E "prefill|rror" $OUT/prefill-tc$tc.txt | head -3 | cut -c1-300
done
rm -rf $D
