#!/bin/bash
# 2026-12-08, issue 20 (never ran: no device machine was lent that session). The indexer's
# chunk scores over several rows a workgroup (scores_rows, SPARSA_INDEXER_ROWS=1) against the
# default (scores, a row a workgroup) at 8,192 tokens, with profiles; the rest measures the
# code as it landed at stop 76. Needs a bundle built from the session's last commit or later
# (benches/results/2026-12-07d/README.md); call with LIMIT=540, carry [".gl", ".h200"].
# Full depth (synth --like glm-5 --layers 78 --experts 16 --format q4): the default at 2,048
# with a profile and the driver's register counts (--shader-stats), 8,192 with a profile
# (never taken: the indexer's O(L²) share), SPARSA_COOP_WIDE=3 with the register counts
# (the routed GEMM ran 5× slower wide), SPARSA_COOP_WIDE=1 and SPARSA_MLA_PAIRS=1 at 2,048,
# 16,384, and 8,192 under --gpu-memory 24GiB where time is left. While the synth is written:
# gemm_shapes default and wide3, and the GEMMs' and attention's lib tests with wide1 and pairs.
set -u
LIMIT=${LIMIT:-540}
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1; mkdir -p $R
fin() { tar cJf $OUT/run1.tar.xz -C /tmp run1; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
D=/tmp/m
( timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1; echo "synth rc $? at $SECONDS s" >> $R/synth.log ) &
SYN=$!
gs() { f=$R/gemm_shapes.$w.txt; env $e timeout 60 /tmp/gemm_shapes q4 5 2048 > $f 2>&1
  echo "== gemm_shapes $w (rc $?) [$SECONDS s]"; grep -E "^q4:" $f | cut -c1-110; }
w=default e=; gs; w=wide3 e=SPARSA_COOP_WIDE=3; gs
fin
# The GEMMs' and the attention's lib tests with the wide dense tile and the row pairs on.
lt() { env $e timeout 100 /tmp/libtest --test-threads 4 $t > $R/libtest.$w.txt 2>&1
  echo "== libtest $w (rc $?): $(grep -E 'test result' $R/libtest.$w.txt | head -2) $(grep -E 'panicked|FAILED' $R/libtest.$w.txt | head -5) [$SECONDS s]"; }
w=indexer e= t=kernels::indexer; lt
w=wide1_pairs e="SPARSA_COOP_WIDE=1 SPARSA_MLA_PAIRS=1" t="kernels::matmul kernels::attention"; lt
echo "[$SECONDS s] waiting for the synth"; wait $SYN; tail -1 $R/synth.log
pf() { [ $SECONDS -lt $((LIMIT-${need:-50})) ] || { echo "== 78 layers $L $w: no time left"; return; }; f=$R/pf.$L.$w.txt; env $e timeout ${to:-70} $S bench --model $D --context $C --decode 2 --prompt-len $L ${extra:-} ${prof:---no-profile} > $f 2>&1
  echo "== 78 layers $L $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
top() { f=$R/pf.$L.$w.txt; grep -A${1:-14} "^prefill" $f | tail -n +3 | cut -c1-100; sed -n '/^shader statistics/,$p' $f | grep -E "matmul_coop::(gemm|mla)|indexer" | cut -c1-220 | head -14; }
L=2048; C=2112; w=default e=; pf
L=8192; C=8256; w=profile e= prof=" " need=80 to=90; pf; prof=; top 18
fin
L=8192; C=8256; w=profile_rows1 e=SPARSA_INDEXER_ROWS=1 prof=" " need=80 to=90; pf; prof=; top 18
fin
L=2048; C=2112; w=stats e= prof=" " extra=--shader-stats; pf; prof= extra=; top
fin
L=2048; C=2112; w=wide3_stats e=SPARSA_COOP_WIDE=3 prof=" " extra=--shader-stats need=50 to=70; pf; prof= extra=; top
fin
L=2048; C=2112; w=wide1 e=SPARSA_COOP_WIDE=1; pf
L=2048; C=2112; w=pairs e=SPARSA_MLA_PAIRS=1; pf
L=8192; C=8256; w=default e= need=70 to=80; pf
fin
L=16384; C=16448; w=default e= need=90 to=100; pf
fin
L=8192; C=8256; w=gpumem24 e= need=60 to=$((LIMIT-SECONDS-5)) extra="--gpu-memory 24GiB"; pf; extra=
fin
rm -rf $D; echo "[$SECONDS s]"
