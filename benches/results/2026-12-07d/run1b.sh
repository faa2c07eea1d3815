#!/bin/bash
# 2026-12-07 (fourth session): run1.sh cut to what a short call allows (the device budget
# went on refused starts): the lib tests with the knobs on, gemm_shapes q4 at 2,048 rows and a
# 4-layer GLM-5 q4 prefill of 4,096 tokens, "new" (SPARSA_COOP_BROT=1 and
# SPARSA_COOP_GATHER_AHEAD=1), "old" (both 0: the code before them) and "hk32" (new and
# SPARSA_COOP_HK=32); then each of the first two alone. LIMIT: the seconds this call may take.
set -u
LIMIT=${LIMIT:-250}
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1b; mkdir -p $R
fin() { tar cJf $OUT/run1b.tar.xz -C /tmp run1b; }
left() { [ $SECONDS -lt $((LIMIT-$1)) ]; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
D4=/tmp/m4
( timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D4 > /dev/null 2>&1 ) &
SYN=$!
NEW="SPARSA_COOP_BROT=1 SPARSA_COOP_GATHER_AHEAD=1"; OLD="SPARSA_COOP_BROT=0 SPARSA_COOP_GATHER_AHEAD=0"
env $NEW timeout 80 /tmp/libtest --test-threads 12 kernels::matmul kernels::attention > $R/libtest.txt 2>&1
echo "== libtest new (rc $?): $(grep -E 'test result' $R/libtest.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.txt | head -5 | cut -c1-200) [$SECONDS s]"
fin
gs() { left 30 || return; f=$R/gemm_shapes.$w.txt; env $e timeout 40 /tmp/gemm_shapes q4 5 2048 > $f 2>&1
  echo "== gemm_shapes $w (rc $?) [$SECONDS s]"; grep -E "^q4:" $f | cut -c1-110; }
w=new e=$NEW; gs; w=old e=$OLD; gs; w=hk32 e="$NEW SPARSA_COOP_HK=32"; gs
fin
wait $SYN
left 40 && timeout 30 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
p4() { left 20 || return; f=$R/pf4.$w.txt; env $e timeout 25 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 4096 --no-profile > $f 2>&1
  echo "== 4 layers 4096 $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120) [$SECONDS s]"; }
w=new e=$NEW; p4; w=old e=$OLD; p4; w=hk32 e="$NEW SPARSA_COOP_HK=32"; p4
w=brot1 e="SPARSA_COOP_BROT=1 SPARSA_COOP_GATHER_AHEAD=0"; p4; w=ga1 e="SPARSA_COOP_BROT=0 SPARSA_COOP_GATHER_AHEAD=1"; p4
fin
if left 60; then env $NEW SPARSA_COOP_HK=32 timeout $((LIMIT-SECONDS-5)) /tmp/libtest --test-threads 12 kernels::matmul > $R/libtest.hk32.txt 2>&1
  echo "== libtest HK=32 (rc $?): $(grep -E 'test result' $R/libtest.hk32.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.hk32.txt | head -5 | cut -c1-200) [$SECONDS s]"; fi
fin; echo "[$SECONDS s]"
