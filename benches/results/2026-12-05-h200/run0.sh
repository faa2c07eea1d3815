#!/bin/bash
# One device call for when only one may come (2026-12-05; from the repository root, the
# bundle of h200_check.sh with examples/cpu_experts, carry .gl and .h200): the most useful
# parts of run1.sh and run2.sh in order, each step only where the time left allows it
# (the call's limit is 600 s).
set -u
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/cpu_experts
left() { echo $((575 - SECONDS)); }
# Correctness on the real driver: the kernels' lib tests (topk_cpu among them), then the
# attention tests with the MLA changes, the matmul tests with a few rows on the GEMM tiles.
timeout 120 /tmp/libtest kernels:: bench:: gpu:: --test-threads=4 > $OUT/libtests.txt 2>&1
echo "lib tests (rc $?): $(grep 'test result' $OUT/libtests.txt)"
for v in "SPARSA_COOP_GATHER=1 SPARSA_MLA_GEMM=3"; do
  env $v timeout 90 /tmp/libtest kernels::attention --test-threads=4 > $OUT/attn.txt 2>&1
  echo "attention lib tests, $v (rc $?): $(grep 'test result' $OUT/attn.txt)"
done
SPARSA_GEMM_FROM_ROWS=2 timeout 90 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.gemm2.txt 2>&1
echo "matmul lib tests, SPARSA_GEMM_FROM_ROWS=2 (rc $?): $(grep 'test result' $OUT/matmul.gemm2.txt)"
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real
echo "[$SECONDS s]"
for v in "SPARSA_GEMM_FROM_ROWS=9" "SPARSA_GEMM_FROM_ROWS=2" "SPARSA_MLA_GEMM=3" "SPARSA_GEMM_FROM_ROWS=2 SPARSA_MLA_GEMM=3"; do
  f=${v// /.}
  [ $(left) -gt 70 ] || break
  echo "== full depth, $v [$SECONDS s]"
  env $v timeout 60 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $OUT/bt.$f.txt 2>&1
  grep -E "sequences|rror" $OUT/bt.$f.txt | head -4 | cut -c1-200
  [ $(left) -gt 60 ] || break
  env $v timeout 60 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $OUT/v.$f.txt 2>&1
  grep -E "verif|step|rror" $OUT/v.$f.txt | head -6 | cut -c1-200
done
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
for p in 1 0; do
  [ $(left) -gt 80 ] || break
  echo "== hybrid, prefetch $p [$SECONDS s]"
  SPARSA_CPU_PREFETCH=$p timeout 75 $S $B > $OUT/hy-$p.txt 2>&1
  grep -E "decode at|CPU experts|routing|stalled|a token|rror" $OUT/hy-$p.txt | cut -c1-300
done
rm -rf $D
echo "[$SECONDS s]"
