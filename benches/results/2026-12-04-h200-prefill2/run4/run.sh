#!/bin/bash
# Issue 20: (1) whether the goldens' misses on the H200 predate this tile: the previous
# build's golden tests (golden_old, 713f7a6) and this build's with SPARSA_TENSOR_CORES=0;
# (2) prefill with the new tile, 4-layer GLM-5 q4 synth (profiled with --calibrate, then
# x as one f16 value); (3) 78 layers, random weights, resident and under --gpu-memory 24GiB.
set -u
. benches/h200_setup.sh
for n in golden golden_old; do xz -dc .h200/$n.xz > /tmp/$n; chmod +x /tmp/$n; done
echo "== goldens: previous build (tensor cores)"
timeout 120 /tmp/golden_old --test-threads=2 --skip quantize > $OUT/goldens-old.txt 2>&1; echo "rc=$?"; grep -E "test result|panicked|logit \[" $OUT/goldens-old.txt | head -12 | cut -c1-200
echo "== goldens: this build, SPARSA_TENSOR_CORES=0"
SPARSA_TENSOR_CORES=0 timeout 120 /tmp/golden --test-threads=2 --skip quantize > $OUT/goldens-notc.txt 2>&1; echo "rc=$?"; grep -E "test result|tolerance" $OUT/goldens-notc.txt | head -12 | cut -c1-200
D=/tmp/m4
( time $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
echo "== 4 layers: calibrate + profile"
timeout 150 $S bench --model $D --calibrate --context 8192 --decode 4 --prompt-len 2048,4096,8192 > $OUT/prof4.txt 2>&1
grep -E "^prefill|^decode|rror|matmul_coop|mla::mla |up_v|absorb" $OUT/prof4.txt | cut -c1-150 | head -30
for rep in a b; do
  echo "== 4 layers ($rep)"
  timeout 100 $S bench --model $D --context 8192 --decode 4 --prompt-len 2048,4096,8192 --no-profile 2>&1 | grep -E "^prefill|rror" | cut -c1-150
  echo "== 4 layers, X_F16 ($rep)"
  SPARSA_COOP_X_F16=1 timeout 100 $S bench --model $D --context 8192 --decode 4 --prompt-len 2048,4096,8192 --no-profile 2>&1 | grep -E "^prefill|rror" | cut -c1-150
done
rm -rf $D
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
echo "== 78 layers, resident"
timeout 150 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile > $OUT/full.txt 2>&1
grep -E "^prefill|^decode|rror" $OUT/full.txt | cut -c1-200
echo "== 78 layers, --gpu-memory 24GiB"
timeout 200 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile --gpu-memory 24GiB > $OUT/full-24g.txt 2>&1
grep -E "^prefill|^decode|rror" $OUT/full-24g.txt | cut -c1-250 | head -8
rm -rf $D
