#!/bin/bash
# 2026-12-07 (third session), call 4: the tensor-core tile with the next K-step's loads after
# the products (SPARSA_COOP_PREFETCH=0: fewer registers live across them, so two workgroups
# might share an SM) against the default (loads before the products, waiting in registers).
# GEMM lib tests with the knob, then 4-layer and full-depth GLM-5 q4 prefill, alternated.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run4; mkdir -p $R
fin() { tar cJf $OUT/run4.tar.xz -C /tmp run4; }
D=/tmp/m
( timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1 ) &
SYN=$!
SPARSA_COOP_PREFETCH=0 timeout 100 /tmp/libtest --test-threads 8 kernels::matmul::tests::gemm kernels::matmul::tests::experts_gemm kernels::matmul::tests::experts_chunks kernels::attention::tests::sparse_mla kernels::attention::tests::absorb_q > $R/libtest.txt 2>&1
echo "== libtest prefetch 0 (rc $?): $(grep -E 'test result' $R/libtest.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.txt | head -5) [$SECONDS s]"
D4=/tmp/m4
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --out $D4 > /dev/null 2>&1
timeout 60 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
p4() { f=$R/pf4.$L.$r.$x.txt; SPARSA_COOP_PREFETCH=$x timeout 40 $S bench --model $D4 --context 4160 --decode 2 --prompt-len $L --no-profile $flag > $f 2>&1
  echo "== 4 layers $L $r prefetch $x $flag (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120) [$SECONDS s]"; }
flag=; for L in 2048 4096; do for r in 1 2; do for x in 0 1; do p4; done; done; done
flag=--exact-gemms; L=2048; r=1; for x in 0 1; do p4; done
rm -rf $D4; fin
wait $SYN
pf() { f=$R/pf.$L.$x.txt; SPARSA_COOP_PREFETCH=$x timeout 70 $S bench --model $D --context 8448 --decode 2 --prompt-len $L --no-profile > $f 2>&1
  echo "== 78 layers $L prefetch $x (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
L=2048; for x in 0 1; do pf; done
rm -rf $D; fin; echo "[$SECONDS s]"
