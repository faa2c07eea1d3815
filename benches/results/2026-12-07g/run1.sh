#!/bin/bash
# Written 2026-12-07 (seventh session) for issue 20 and NOT RUN: no device was lent that
# session (README). For the next session, with the bundle built from 4f45813 or later
# (.h200/bundle.tar.xz, the recipe in ../2026-12-07d/README.md):
#   "default" the defaults (the attention's exact products, x staged);
#   "mlaf16"  SPARSA_COOP_MLA_F16=1: the prefill attention's products with both operands as
#             one f16 value each (X_F16 = 2, 128-column tiles over f32 caches);
#   "aglob"   SPARSA_COOP_A_GLOBAL=3: the q4 GEMMs (dense, and routed over row tiles) load
#             x's A fragments from an f16 copy instead of staging x (only the weights
#             staged, two stages); "aglob1" the dense one alone, "aglob2" the routed one.
#   1. lib tests on tensor cores: the attention with mlaf16, the matmul tests with aglob; the
#      default GEMMs' golden with mlaf16 (greedy tokens kept); while the synth is written.
#   2. gemm_shapes q4 at 2,048 rows: default and aglob.
#   3. Full depth (78 layers, 16 experts, q4) at 2,048: default, mlaf16, aglob, aglob1;
#      8,192: default, mlaf16, aglob; a profile of the default at 2,048.
#   4. Quality (quant_eval, bard): bf16 exact against q4 as users get it / with mlaf16;
#      bf16 exact against bf16 with mlaf16 (the attention's rounding alone).
# Carries .gl, .h200. Everything lands in $OUT/run1.tar.xz.
set -u
LIMIT=${LIMIT:-560}
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1; mkdir -p $R
fin() { tar cJf $OUT/run1.tar.xz -C /tmp run1; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $R/gpu.txt
D=/tmp/m
( timeout 300 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $R/synth.log 2>&1; echo "synth rc $? at $SECONDS s" >> $R/synth.log ) &
SYN=$!
B=/tmp/bard-bf16
( mkdir -p $B; cp .h200/bard-bf16/*.json $B/; xz -dc .h200/bard-bf16/model.safetensors.xz > $B/model.safetensors
  timeout 60 $S quantize --model $B --out /tmp/bard-q4 --format q4 --block 32 > $R/quantize.txt 2>&1 ) &
QP=$!
lt() { env $e timeout 100 /tmp/libtest --test-threads 8 $t > $R/libtest.$w.txt 2>&1
  echo "== libtest $w (rc $?): $(grep -E 'test result' $R/libtest.$w.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.$w.txt | head -5 | cut -c1-200) [$SECONDS s]"; }
w=attention_mlaf16 e=SPARSA_COOP_MLA_F16=1 t="kernels::attention"; lt
w=matmul_aglob e=SPARSA_COOP_A_GLOBAL=3 t="kernels::matmul"; lt
SPARSA_COOP_MLA_F16=1 timeout 60 /tmp/golden default_gemms --nocapture > $R/golden_default.txt 2>&1
echo "== golden default GEMMs, mlaf16 (rc $?): $(grep -E 'default GEMMs|test result' $R/golden_default.txt | head -8 | tr '\n' ' ' | cut -c1-500) [$SECONDS s]"
fin
gs() { f=$R/gemm_shapes.$w.txt; env $e timeout 60 /tmp/gemm_shapes q4 5 2048 > $f 2>&1
  echo "== gemm_shapes $w (rc $?) [$SECONDS s]"; grep -E "^q4:" $f | cut -c1-110; }
w=default e=; gs; w=aglob e=SPARSA_COOP_A_GLOBAL=3; gs
fin
echo "[$SECONDS s] waiting for the synth"; wait $SYN; tail -1 $R/synth.log
pf() { [ $SECONDS -lt $((LIMIT-70)) ] || { echo "== 78 layers $L $w: no time left"; return; }; f=$R/pf.$L.$w.txt; env $e timeout 65 $S bench --model $D --context $C --decode 2 --prompt-len $L ${prof:---no-profile} > $f 2>&1
  echo "== 78 layers $L $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
L=2048; C=2112
w=default e=; pf; w=mlaf16 e=SPARSA_COOP_MLA_F16=1; pf; w=aglob e=SPARSA_COOP_A_GLOBAL=3; pf
w=aglob1 e=SPARSA_COOP_A_GLOBAL=1; pf
fin
L=8192; C=8256
w=default e=; pf; w=mlaf16 e=SPARSA_COOP_MLA_F16=1; pf; w=aglob e=SPARSA_COOP_A_GLOBAL=3; pf
fin
L=2048; C=2112; w=profile e= prof=" "; pf; prof=
grep -E "matmul_coop|mla::|x_to_f16" $R/pf.2048.profile.txt | head -9 | cut -c1-110
fin
rm -rf $D
wait $QP; echo "== quantize: $(tail -1 $R/quantize.txt | cut -c1-100)"
qe() { [ $SECONDS -lt $((LIMIT-40)) ] || { echo "== quant_eval $w: no time left"; return; }; env $e timeout 40 /tmp/quant_eval $B $Q .h200/bard-tokens.json 64 > $R/quant_eval.$w.txt 2>&1
  echo "== quant_eval $w (rc $?): $(tail -1 $R/quant_eval.$w.txt | cut -c1-300) [$SECONDS s]"; }
Q=/tmp/bard-q4; w=q4_default e=SPARSA_EVAL_BASE_EXACT=1; qe
w=q4_mlaf16 e="SPARSA_EVAL_BASE_EXACT=1 SPARSA_COOP_MLA_F16=1"; qe
Q=$B; w=bf16_mlaf16 e="SPARSA_EVAL_BASE_EXACT=1 SPARSA_COOP_MLA_F16=1"; qe
fin; echo "[$SECONDS s]"
