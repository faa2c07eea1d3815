#!/bin/bash
# 2026-12-07 (third session), call 6: x as one f16 value only in a prompt's prefill
# (Recorder::set_prefill; decode steps, batches and verifications exact). Lib tests of the
# GEMMs, the attention and the recorder, the goldens and the default GEMMs' check, a 4-layer
# q4 prefill both ways.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run6; mkdir -p $R
fin() { tar cJf $OUT/run6.tar.xz -C /tmp run6; }
nvidia-smi --query-gpu=name --format=csv,noheader
( timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out /tmp/m4 > /dev/null 2>&1 ) &
SYN=$!
timeout 110 /tmp/libtest --test-threads 8 kernels::matmul kernels::attention gpu::recorder > $R/libtest.txt 2>&1
echo "== libtest (rc $?): $(grep -E 'test result' $R/libtest.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.txt | head -5) [$SECONDS s]"
timeout 60 /tmp/golden --test-threads 8 --skip quantize_is_reproducible --nocapture > $R/golden.txt 2>&1
echo "== golden (rc $?): $(grep -E 'test result' $R/golden.txt) $(grep -E '^test .*FAILED|default GEMMs' $R/golden.txt | head -6 | tr '\n' ' ' | cut -c1-500) [$SECONDS s]"
fin
wait $SYN
timeout 30 $S bench --model /tmp/m4 --context 4160 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
for flag in "" --exact-gemms; do f=$R/pf4.${flag:-default}.txt
  timeout 30 $S bench --model /tmp/m4 --context 4160 --decode 2 --prompt-len 4096 --no-profile $flag > $f 2>&1
  echo "== 4 layers 4096 ${flag:-default}: $(grep -hE '^bench: prefill|rror' $f | cut -c1-120) [$SECONDS s]"; done
fin; echo "[$SECONDS s]"
