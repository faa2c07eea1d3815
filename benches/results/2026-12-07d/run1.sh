#!/bin/bash
# 2026-12-07 (fourth session), call 1: the tensor-core tile's weight stores rotated onto
# distinct banks (SPARSA_COOP_BROT=1), K-steps of 32 in two stages for the GEMMs
# (SPARSA_COOP_HK=32) and mla_values' positions loaded a K-step ahead
# (SPARSA_COOP_GATHER_AHEAD=1), each set explicitly (the bundle was built while 1 was the
# default of the first and the third): "old" is the code before them, "new" both on.
#   1. lib tests of the GEMMs and the attention as users get them; the GEMMs' with HK=32.
#   2. examples/gemm_shapes q4 at 2,048 rows, the three ways.
#   3. 4-layer GLM-5 q4 prefill of 4,096 tokens, the three ways, alternated.
#   4. Full depth (78 layers, 16 experts, q4) at 2,048 the three ways; 8,192 the best way.
#   5. The goldens, where time is left.
# Carries .gl, .h200 (bundle.tar.xz). Everything lands in $OUT/run1.tar.xz.
set -u
LIMIT=${LIMIT:-590}   # seconds this call may take
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1; mkdir -p $R
fin() { tar cJf $OUT/run1.tar.xz -C /tmp run1; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
D=/tmp/m
( timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1; echo "synth rc $? at $SECONDS s" >> $R/synth.log ) &
SYN=$!
SPARSA_COOP_BROT=1 SPARSA_COOP_GATHER_AHEAD=1 timeout 120 /tmp/libtest --test-threads 8 kernels::matmul kernels::attention > $R/libtest.txt 2>&1
echo "== libtest new (rc $?): $(grep -E 'test result' $R/libtest.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.txt | head -5 | cut -c1-200) [$SECONDS s]"
SPARSA_COOP_BROT=1 SPARSA_COOP_GATHER_AHEAD=1 SPARSA_COOP_HK=32 timeout 90 /tmp/libtest --test-threads 8 kernels::matmul > $R/libtest.hk32.txt 2>&1
echo "== libtest HK=32 (rc $?): $(grep -E 'test result' $R/libtest.hk32.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.hk32.txt | head -5 | cut -c1-200) [$SECONDS s]"
fin
gs() { f=$R/gemm_shapes.$w.txt; env $e timeout 60 /tmp/gemm_shapes q4 5 2048 > $f 2>&1
  echo "== gemm_shapes $w (rc $?) [$SECONDS s]"; grep -E "^q4:" $f | cut -c1-110; }
NEW="SPARSA_COOP_BROT=1 SPARSA_COOP_GATHER_AHEAD=1"; OLD="SPARSA_COOP_BROT=0 SPARSA_COOP_GATHER_AHEAD=0"
w=new e=$NEW; gs; w=old e=$OLD; gs; w=hk32 e="$NEW SPARSA_COOP_HK=32"; gs
fin
D4=/tmp/m4
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D4 > /dev/null 2>&1
timeout 60 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
p4() { [ $SECONDS -lt $((LIMIT-200)) ] || return; f=$R/pf4.$w.$r.txt; env $e timeout 40 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 4096 --no-profile > $f 2>&1
  echo "== 4 layers 4096 $w $r (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120) [$SECONDS s]"; }
for r in 1 2; do w=new e=$NEW; p4; w=old e=$OLD; p4; w=hk32 e="$NEW SPARSA_COOP_HK=32"; p4; done
rm -rf $D4; fin
echo "[$SECONDS s] waiting for the synth"; wait $SYN; tail -1 $R/synth.log
pf() { [ $SECONDS -lt $((LIMIT-75)) ] || { echo "== 78 layers $L $w: no time left"; return; }; f=$R/pf.$L.$w.txt; env $e timeout 70 $S bench --model $D --context 8448 --decode 2 --prompt-len $L --no-profile > $f 2>&1
  echo "== 78 layers $L $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
L=2048; w=new e=$NEW; pf; w=old e=$OLD; pf; w=hk32 e="$NEW SPARSA_COOP_HK=32"; pf
w=brot1 e="SPARSA_COOP_BROT=1 SPARSA_COOP_GATHER_AHEAD=0"; pf; w=ga1 e="SPARSA_COOP_BROT=0 SPARSA_COOP_GATHER_AHEAD=1"; pf
fin
if [ $SECONDS -lt $((LIMIT-120)) ]; then L=8192; w=new e=$NEW; pf; fi
rm -rf $D; fin
if [ $SECONDS -lt $((LIMIT-60)) ]; then env $NEW timeout $((LIMIT-SECONDS)) /tmp/golden --test-threads 8 --skip quantize_is_reproducible --nocapture > $R/golden.txt 2>&1
  echo "== golden (rc $?): $(grep -E 'test result' $R/golden.txt) $(grep -E '^test .*FAILED|default GEMMs' $R/golden.txt | head -6 | tr '\n' ' ' | cut -c1-500) [$SECONDS s]"; fi
fin; echo "[$SECONDS s]"
