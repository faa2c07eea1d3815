#!/bin/bash
# 2026-12-07 (eighth session), third call, cut to the device time left (run2.sh never
# started: no machine). Same bundle as run2 (the attention's f16 operands on by default).
# gemm_shapes q4 at 2,048 rows: default, SPARSA_COOP_WIDE=1, =3; the 4-layer GLM-5 q4 shape
# at 4,096 tokens, default / wide1 / wide3, the last with the driver's register counts
# (--shader-stats: why the routed GEMM ran 5× slower wide in run1).
set -u
LIMIT=${LIMIT:-200}
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run3; mkdir -p $R
fin() { tar cJf $OUT/run3.tar.xz -C /tmp run3; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
D=/tmp/m4
( timeout 100 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D > $R/synth.log 2>&1; echo "synth rc $? at $SECONDS s" >> $R/synth.log ) &
SYN=$!
gs() { f=$R/gemm_shapes.$w.txt; env $e timeout 40 /tmp/gemm_shapes q4 5 2048 > $f 2>&1
  echo "== gemm_shapes $w (rc $?) [$SECONDS s]"; grep -E "^q4:" $f | cut -c1-110; }
w=default e=; gs; w=wide1 e=SPARSA_COOP_WIDE=1; gs; w=wide3 e=SPARSA_COOP_WIDE=3; gs
fin
wait $SYN; tail -1 $R/synth.log
pf() { [ $SECONDS -lt $((LIMIT-25)) ] || { echo "== 4 layers $w: no time left"; return; }; f=$R/pf4.$w.txt; env $e timeout 40 $S bench --model $D --context 4160 --decode 2 --prompt-len 4096 --no-profile ${extra:-} > $f 2>&1
  echo "== 4 layers 4096 $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
w=default e=; pf; w=wide1 e=SPARSA_COOP_WIDE=1; pf
w=wide3_stats e=SPARSA_COOP_WIDE=3 extra=--shader-stats; pf; extra=
grep -E "matmul_coop.*gemm" $R/pf4.wide3_stats.txt | cut -c1-200 | head -8
w=default2 e=; pf
fin; echo "[$SECONDS s]"
