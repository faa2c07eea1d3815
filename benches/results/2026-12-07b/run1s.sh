#!/bin/bash
# 2026-12-07 (second session), the short call (what the device time left allowed): lib tests of
# the GEMMs and the attention on tensor cores, both ways (SPARSA_COOP_X_F16=1: q4 on the
# 128-row f16-x tile; =0, the default: the precise 64-row tile), and a 4-layer GLM-5 q4
# prefill of 2,048 tokens both ways, then the golden tests (default). Issue 20. Never ran.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT/run1s; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
D4=/tmp/m4
( timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D4 > /dev/null 2>&1 ) &
SYN=$!
ways() { for x in 1 0; do e="SPARSA_COOP_X_F16=$x"; "$@"; done; }
lt() { env $e timeout 60 /tmp/libtest --test-threads 8 kernels::matmul kernels::attention > $R/libtest.$x.txt 2>&1
  echo "== libtest x=$x (rc $?): $(grep -E 'test result' $R/libtest.$x.txt | head -2) $(grep -E 'panicked|FAILED' $R/libtest.$x.txt | head -5) [$SECONDS s]"; }
ways lt
wait $SYN
timeout 40 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
p4() { f=$R/pf4.$r.$x.txt; env $e timeout 40 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile > $f 2>&1
  echo "== 4 layers 2048 $r x=$x (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120) [$SECONDS s]"; }
r=1; ways p4
timeout 60 /tmp/golden --test-threads 8 > $R/golden.d.txt 2>&1; rc=$?
echo "== golden (rc $rc): $(grep -E 'test result' $R/golden.d.txt) $(grep -E '^test .*FAILED' $R/golden.d.txt | head -6 | tr '\n' ' ') [$SECONDS s]"
r=2; ways p4
echo "[$SECONDS s]"
