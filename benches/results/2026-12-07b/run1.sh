#!/bin/bash
# 2026-12-07 (second session), the call (never lent a machine): the 128-row tensor-core tile
# with x as one f16 value (SPARSA_COOP_X_F16=1) against the precise 64-row default (=0).
# Issue 20 items 2 and 3. The full-depth synth is written in the background meanwhile.
#   1. lib tests of the GEMMs and the attention on tensor cores, both ways.
#   2. 4-layer GLM-5 q4 prefill of 2,048 tokens, alternated, both ways.
#   3. Quality: examples/quant_eval, the built-in model's bf16 original against its q4, both ways.
#   4. The golden tests on tensor cores (default, precise; with the knob, where they pass).
#   5. Full depth (GLM-5 q4 synth, 78 layers, 16 experts): prefill of 2,048 tokens, both ways,
#      alternated; 8,192 once; a profile with the tensor-core peak where time is left.
#   6. examples/gemm_shapes q4 at 512 and 2,048 rows, both ways, where time is left.
# Carries .gl, .h200 (bundle.tar.xz, bard-bf16/, bard-tokens.json).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=$OUT/run1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
D=/tmp/m
( time timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1 ) 2> $R/synth.time &
SYN=$!
B=/tmp/bard-bf16
( mkdir -p $B; cp .h200/bard-bf16/*.json $B/; xz -dc .h200/bard-bf16/model.safetensors.xz > $B/model.safetensors
  timeout 60 $S quantize --model $B --out /tmp/bard-q4 --format q4 --block 32 > $R/quantize.txt 2>&1 ) &
QP=$!
ways() { for x in 1 0; do e="SPARSA_COOP_X_F16=$x"; "$@"; done; }
lt() { env $e timeout 120 /tmp/libtest --test-threads 4 kernels::matmul kernels::attention > $R/libtest.$x.txt 2>&1
  echo "== libtest x=$x (rc $?): $(grep -E 'test result' $R/libtest.$x.txt | head -2) $(grep -E 'panicked|FAILED' $R/libtest.$x.txt | head -5)"; }
ways lt
D4=/tmp/m4
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D4 > /dev/null 2>&1
timeout 60 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
p4() { f=$R/pf4.$r.$x.txt; env $e timeout 60 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 --no-profile > $f 2>&1
  echo "== 4 layers 2048 $r x=$x (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120)"; }
for r in 1 2; do ways p4; done
rm -rf $D4
gd() { env $e timeout 100 /tmp/golden --test-threads 4 > $R/golden.$x.txt 2>&1
  echo "== golden x=$x (rc $?): $(grep -E 'test result' $R/golden.$x.txt) $(grep -E '^test .*FAILED' $R/golden.$x.txt | head -6 | tr '\n' ' ')"; }
ways gd
echo "[$SECONDS s] waiting for the synth"; wait $SYN; grep real $R/synth.time
pf() { f=$R/pf.$r.$x.txt; env $e timeout 60 $S bench --model $D --context 4096 --decode 2 --prompt-len 2048 --no-profile > $f 2>&1
  echo "== 78 layers 2048 $r x=$x (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
r=1; ways pf
wait $QP; echo "== quantize: $(tail -1 $R/quantize.txt | cut -c1-100)"
qe() { env $e timeout 60 /tmp/quant_eval $B /tmp/bard-q4 .h200/bard-tokens.json 64 > $R/quant_eval.$x.txt 2>&1
  echo "== quant_eval q4 x=$x (rc $?): $(tail -4 $R/quant_eval.$x.txt | tr '\n' ' ' | cut -c1-300)"; }
ways qe
[ $SECONDS -lt 380 ] && { r=2; ways pf; }
if [ $SECONDS -lt 400 ]; then SPARSA_COOP_X_F16=1 timeout 60 $S bench --model $D --context 8448 --decode 2 --prompt-len 8192 --no-profile > $R/pf8k.1.txt 2>&1
  echo "== 78 layers 8192 x=1: $(grep -hE '^bench: prefill|rror' $R/pf8k.1.txt | cut -c1-140) [$SECONDS s]"; fi
if [ $SECONDS -lt 420 ]; then SPARSA_COOP_X_F16=1 timeout 70 $S bench --model $D --context 4096 --decode 2 --prompt-len 2048 --calibrate > $R/prof.txt 2>&1
  echo "== profile 78 layers [$SECONDS s]"; grep -E "gemm|mla|peak|prefill" $R/prof.txt | head -14 | cut -c1-150; fi
rm -rf $D
shp() { env $e timeout 40 /tmp/gemm_shapes q4 5 512,2048 > $R/shapes.$x.txt 2>&1
  echo "== shapes x=$x (rc $?)"; grep -E "^q4: [a-z]" $R/shapes.$x.txt | cut -c1-110; }
[ $SECONDS -lt 440 ] && ways shp

echo "[$SECONDS s]"
