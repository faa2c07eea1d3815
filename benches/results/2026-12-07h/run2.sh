#!/bin/bash
# 2026-12-07 (eighth session), issue 20, second call: the bundle built with the attention's
# f16 operands on by default (SPARSA_COOP_MLA_F16). Full depth (78 layers, 16 experts, q4):
# the default at 2,048 / 8,192 / 16,384 tokens and a profile; SPARSA_COOP_WIDE=1 (the dense
# GEMM on 128 × 256 tiles) beside it at 2,048 and 8,192; SPARSA_COOP_WIDE=3 once more with
# the driver's register counts (--shader-stats: the routed GEMM ran 5× slower wide in
# run1); gemm_shapes q4 at 2,048 rows: default, wide1, wide3; --gpu-memory 24GiB at 8,192
# where time is left. SPARSA_MLA_PAIRS=1 (the logits over query-row pairs, b811cb1) at 2,048.
# Needs a bundle from b811cb1 or later.
set -u
LIMIT=${LIMIT:-470}
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
fin() { tar cJf $OUT/run2.tar.xz -C /tmp run2; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
D=/tmp/m
( timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1; echo "synth rc $? at $SECONDS s" >> $R/synth.log ) &
SYN=$!
gs() { f=$R/gemm_shapes.$w.txt; env $e timeout 60 /tmp/gemm_shapes q4 5 2048 > $f 2>&1
  echo "== gemm_shapes $w (rc $?) [$SECONDS s]"; grep -E "^q4:" $f | cut -c1-110; }
w=default e=; gs; w=wide1 e=SPARSA_COOP_WIDE=1; gs; w=wide3 e=SPARSA_COOP_WIDE=3; gs
fin
echo "[$SECONDS s] waiting for the synth"; wait $SYN; tail -1 $R/synth.log
pf() { [ $SECONDS -lt $((LIMIT-${need:-50})) ] || { echo "== 78 layers $L $w: no time left"; return; }; f=$R/pf.$L.$w.txt; env $e timeout ${to:-70} $S bench --model $D --context $C --decode 2 --prompt-len $L ${extra:-} ${prof:---no-profile} > $f 2>&1
  echo "== 78 layers $L $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
L=2048; C=2112; w=default e=; pf
L=8192; C=8256; w=default e=; pf
L=2048; C=2112; w=wide1 e=SPARSA_COOP_WIDE=1; pf
L=2048; C=2112; w=pairs e=SPARSA_MLA_PAIRS=1; pf
L=8192; C=8256; w=wide1 e=SPARSA_COOP_WIDE=1; pf
fin
L=2048; C=2112; w=profile e= prof=" "; pf; prof=
grep -E "matmul_coop|mla::|x_to_f16" $R/pf.2048.profile.txt | head -9 | cut -c1-110
fin
w=wide3_stats e=SPARSA_COOP_WIDE=3 extra=--shader-stats; pf; extra=
grep -E "matmul_coop.*gemm" $R/pf.2048.wide3_stats.txt | cut -c1-160 | head -8
fin
L=16384; C=16448; w=default e= need=80 to=90; pf
fin
L=8192; C=8256; w=gpumem24 e= need=60 to=$((LIMIT-SECONDS-5)) extra="--gpu-memory 24GiB"; pf; extra=
fin
rm -rf $D; echo "[$SECONDS s]"
