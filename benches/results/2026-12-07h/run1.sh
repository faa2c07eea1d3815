#!/bin/bash
# 2026-12-07 (eighth session), issue 20, first call. The bundle built from the commit that
# added SPARSA_COOP_WIDE (.h200/bundle.tar.xz, recipe in ../2026-12-07d/README.md).
#   "mlaf16"  SPARSA_COOP_MLA_F16=1 (measured +14 % / +18 % at 2,048 / 8,192 in the seventh
#             session's script, run this session first: ../2026-12-07g/run1.tar.xz);
#   "wide"    SPARSA_COOP_WIDE=3 on top: the q4 GEMMs on 128 × 256 tiles, 64 × 64 outputs a
#             subgroup, K-steps of 32 (wide1: the dense gemm alone, wide2: the routed alone).
#   1. lib tests of the GEMMs with wide (on tensor cores), while the synth is written;
#   2. the default GEMMs' golden: wide; SPARSA_MLA_GEMM=2 (the attention on the tile at the
#      golden model's few heads) with and without mlaf16;
#   3. gemm_shapes q4 at 2,048 rows: default and wide;
#   4. full depth (78 layers, 16 experts, q4): 2,048 mlaf16 / +wide / +wide1 / +wide2,
#      8,192 mlaf16 / +wide; a profile;
#   5. quality (quant_eval, built-in model, base exact), SPARSA_MLA_GEMM=2 so that its
#      8 heads take the tile: q4 default, q4 mlaf16, bf16 mlaf16; q4 wide.
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
lt() { env $e timeout 110 /tmp/libtest --test-threads 16 $t > $R/libtest.$w.txt 2>&1
  echo "== libtest $w (rc $?): $(grep -E 'test result' $R/libtest.$w.txt | head -1) $(grep -E 'panicked|FAILED' $R/libtest.$w.txt | head -5 | cut -c1-200) [$SECONDS s]"; }
w=matmul_wide e=SPARSA_COOP_WIDE=3 t="kernels::matmul::tests::gemm_ kernels::matmul::tests::experts_gemm kernels::matmul::tests::experts_chunks quantized_experts_against_cpu_decode tensor_core"; lt
gd() { env $e timeout 60 /tmp/golden default_gemms --nocapture > $R/golden.$w.txt 2>&1
  echo "== golden default GEMMs $w (rc $?): $(grep -E 'default GEMMs \(|test result|panicked' $R/golden.$w.txt | head -4 | tr '\n' ' ' | sed 's/(NVIDIA[^)]*)//' | cut -c1-400) [$SECONDS s]"; }
w=wide e=SPARSA_COOP_WIDE=3; gd
w=mlagemm e=SPARSA_MLA_GEMM=2; gd
w=mlagemm_mlaf16 e="SPARSA_MLA_GEMM=2 SPARSA_COOP_MLA_F16=1"; gd
fin
gs() { f=$R/gemm_shapes.$w.txt; env $e timeout 60 /tmp/gemm_shapes q4 5 2048 > $f 2>&1
  echo "== gemm_shapes $w (rc $?) [$SECONDS s]"; grep -E "^q4:" $f | cut -c1-110; }
w=default e=; gs; w=wide e=SPARSA_COOP_WIDE=3; gs
fin
echo "[$SECONDS s] waiting for the synth"; wait $SYN; tail -1 $R/synth.log
pf() { [ $SECONDS -lt $((LIMIT-70)) ] || { echo "== 78 layers $L $w: no time left"; return; }; f=$R/pf.$L.$w.txt; env $e timeout 65 $S bench --model $D --context $C --decode 2 --prompt-len $L ${prof:---no-profile} > $f 2>&1
  echo "== 78 layers $L $w (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-140) [$SECONDS s]"; }
M=SPARSA_COOP_MLA_F16=1
L=2048; C=2112
w=mlaf16 e=$M; pf; w=wide e="$M SPARSA_COOP_WIDE=3"; pf
w=wide1 e="$M SPARSA_COOP_WIDE=1"; pf; w=wide2 e="$M SPARSA_COOP_WIDE=2"; pf
fin
L=8192; C=8256
w=mlaf16 e=$M; pf; w=wide e="$M SPARSA_COOP_WIDE=3"; pf
fin
L=2048; C=2112; w=profile_wide e="$M SPARSA_COOP_WIDE=3" prof=" "; pf; prof=
grep -E "matmul_coop|mla::|x_to_f16" $R/pf.2048.profile_wide.txt | head -9 | cut -c1-110
fin
rm -rf $D
wait $QP; echo "== quantize: $(tail -1 $R/quantize.txt | cut -c1-100)"
qe() { [ $SECONDS -lt $((LIMIT-30)) ] || { echo "== quant_eval $w: no time left"; return; }; env SPARSA_EVAL_BASE_EXACT=1 SPARSA_MLA_GEMM=2 $e timeout 40 /tmp/quant_eval $B $Q .h200/bard-tokens.json 64 > $R/quant_eval.$w.txt 2>&1
  echo "== quant_eval $w (rc $?): $(tail -1 $R/quant_eval.$w.txt | cut -c1-300) [$SECONDS s]"; }
Q=/tmp/bard-q4; w=q4_default e=; qe
w=q4_mlaf16 e=$M; qe
Q=$B; w=bf16_mlaf16 e=$M; qe
Q=/tmp/bard-q4; w=q4_wide e=SPARSA_COOP_WIDE=3; qe
fin; echo "[$SECONDS s]"
