#!/bin/bash
# 2026-12-07 (third session), call 2: x as one f16 value (the 128-row tile) as q4's default
# on tensor cores, `--exact-gemms` / Gpu::set_exact_gemms the precise path (issue 20 item 2).
#   1. lib tests of the GEMMs and the attention on tensor cores as users get them (q4: f16 x).
#   2. The golden tests (exact GPU) and the default GEMMs' argmax/greedy check, its |Δ| printed.
#   3. 4-layer GLM-5 q4 prefill at 2,048 and 4,096, default against --exact-gemms, alternated.
#   4. Full depth (78 layers, 16 experts, q4) at 2,048 both ways, 8,192 and a profile (default).
#   5. transformers bf16 on the 4-layer bf16 synth at 4,096 (same run), where time is left.
# Carries .gl, .h200 (bundle.tar.xz). Everything lands in $OUT/run2.tar.xz (the call returns
# a few files only).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
fin() { tar cJf $OUT/run2.tar.xz -C /tmp run2; }
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
D=/tmp/m
( time timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1 ) 2> $R/synth.time &
SYN=$!
timeout 150 /tmp/libtest --test-threads 8 kernels::matmul kernels::attention > $R/libtest.d.txt 2>&1
echo "== libtest default (rc $?): $(grep -E 'test result' $R/libtest.d.txt | head -2) $(grep -E 'panicked|FAILED' $R/libtest.d.txt | head -5) [$SECONDS s]"
timeout 90 /tmp/golden --test-threads 8 --skip quantize_is_reproducible --skip default_gemms > $R/golden.txt 2>&1
echo "== golden exact (rc $?): $(grep -E 'test result' $R/golden.txt) $(grep -E '^test .*FAILED' $R/golden.txt | head -6 | tr '\n' ' ') [$SECONDS s]"
timeout 60 /tmp/golden default_gemms --nocapture > $R/golden_default.txt 2>&1
echo "== golden default GEMMs (rc $?): $(grep -E 'default GEMMs|test result' $R/golden_default.txt | head -8 | tr '\n' ' ' | cut -c1-600)"
fin
D4=/tmp/m4
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D4 > /dev/null 2>&1
timeout 60 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
p4() { f=$R/pf4.$L.$r.$w.txt; timeout 40 $S bench --model $D4 --context 4160 --decode 2 --prompt-len $L --no-profile $flag > $f 2>&1
  echo "== 4 layers $L $r $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120) [$SECONDS s]"; }
for L in 2048 4096; do for r in 1 2; do w=default flag=; p4; w=exact flag=--exact-gemms; p4; done; done
rm -rf $D4; fin
echo "[$SECONDS s] waiting for the synth"; wait $SYN; grep real $R/synth.time
pf() { f=$R/pf.$L.$w.txt; timeout 70 $S bench --model $D --context 8448 --decode 2 --prompt-len $L --no-profile $flag > $f 2>&1
  echo "== 78 layers $L $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
L=2048; w=default flag=; pf; w=exact flag=--exact-gemms; pf
L=4096; w=default flag=; pf
L=8192; w=default flag=; pf
fin
if [ $SECONDS -lt 430 ]; then timeout 70 $S bench --model $D --context 4096 --decode 2 --prompt-len 2048 --calibrate > $R/prof.txt 2>&1
  echo "== profile 78 layers [$SECONDS s]"; grep -E "peak|gemm|mla|prefill|kernel" $R/prof.txt | head -16 | cut -c1-160; fi
rm -rf $D; fin
if [ $SECONDS -lt 450 ]; then D4b=/tmp/m4b; timeout 40 $S synth --like glm-5 --layers 4 --experts 16 --format bf16 --out $D4b > /dev/null 2>&1
  timeout 40 $S bench --model $D4b --context 4160 --decode 2 --prompt-len 4096 --no-profile > $R/pf4bf16.txt 2>&1
  echo "== sparsa bf16 4 layers 4096: $(grep -hE '^bench: prefill|rror' $R/pf4bf16.txt | cut -c1-120) [$SECONDS s]"
  timeout $((560-SECONDS)) python3 benches/transformers_decode.py --model $D4b --contexts 4096 --decode 2 --json $R/tf.json > $R/tf.txt 2>&1
  echo "== transformers bf16 4 layers 4096 (rc $?): $(tail -3 $R/tf.txt | tr '\n' ' ' | cut -c1-300) [$SECONDS s]"; fi
fin; echo "[$SECONDS s]"
