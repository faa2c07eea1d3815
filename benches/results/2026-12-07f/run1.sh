#!/bin/bash
# 2026-12-07 (sixth session), call 1 (issue 20): the routed GEMM over row tiles cut
# beforehand (expert_tiles.wgsl; "tiles", the default) against each workgroup walking its
# expert's rows ("walk", SPARSA_EXPERT_TILES=0), and the routed gate and up's own tile knobs
# (SPARSA_COOP_GATE_UP_HK=32, SPARSA_COOP_GATE_UP_BROT=1; "gu" = both).
#   1. lib tests of the routed products on tensor cores (both forms), while the full-depth
#      synth is written.
#   2. examples/gemm_shapes q4 at 2,048 rows: walk, tiles, tiles+gu.
#   3. Full depth (78 layers, 16 experts, q4) at 2,048: tiles, walk, tiles+gu, tiles+HK32
#      alone.
#   4. Where time is left: the goldens, then the lib tests with gu.
# Carries .gl, .h200 (bundle.tar.xz). Everything lands in $OUT/run1.tar.xz.
set -u
LIMIT=${LIMIT:-560}   # seconds this call may take
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1; mkdir -p $R
fin() { tar cJf $OUT/run1.tar.xz -C /tmp run1; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
D=/tmp/m
( timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1; echo "synth rc $? at $SECONDS s" >> $R/synth.log ) &
SYN=$!
GU="SPARSA_COOP_GATE_UP_HK=32 SPARSA_COOP_GATE_UP_BROT=1"
lt() { env $e timeout 90 /tmp/libtest --test-threads 8 experts > $R/libtest.$w.txt 2>&1
  echo "== libtest $w (rc $?): $(grep -E 'test result' $R/libtest.$w.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.$w.txt | head -5 | cut -c1-200) [$SECONDS s]"; }
w=default e=; lt
fin
gs() { f=$R/gemm_shapes.$w.txt; env $e timeout 60 /tmp/gemm_shapes q4 5 2048 > $f 2>&1
  echo "== gemm_shapes $w (rc $?) [$SECONDS s]"; grep -E "^q4:" $f | cut -c1-110; }
w=walk e=SPARSA_EXPERT_TILES=0; gs; w=tiles e=; gs; w=tiles_gu e=$GU; gs
fin
echo "[$SECONDS s] waiting for the synth"; wait $SYN; tail -1 $R/synth.log
pf() { [ $SECONDS -lt $((LIMIT-70)) ] || { echo "== 78 layers $L $w: no time left"; return; }; f=$R/pf.$L.$w.txt; env $e timeout 65 $S bench --model $D --context $C --decode 2 --prompt-len $L ${prof:---no-profile} > $f 2>&1
  echo "== 78 layers $L $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
L=2048; C=2112
w=tiles e=; pf; w=walk e=SPARSA_EXPERT_TILES=0; pf; w=tiles_gu e=$GU; pf; w=tiles_hk32 e=SPARSA_COOP_GATE_UP_HK=32; pf
fin
rm -rf $D
if [ $SECONDS -lt $((LIMIT-40)) ]; then timeout $((LIMIT-SECONDS)) /tmp/golden --test-threads 8 --skip quantize_is_reproducible > $R/golden.txt 2>&1
  echo "== golden (rc $?): $(grep -E 'test result' $R/golden.txt) $(grep -E '^test .*FAILED' $R/golden.txt | head -6 | tr '\n' ' ' | cut -c1-400) [$SECONDS s]"; fi
if [ $SECONDS -lt $((LIMIT-40)) ]; then w=gu e=$GU; lt; fi
rm -rf $D; fin; echo "[$SECONDS s]"
