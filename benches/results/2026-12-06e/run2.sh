#!/bin/bash
# 2026-12-06 (fifth session), second call, bundle of the commit that adds experts_direct (the
# routed experts through the direct tensor-core GEMM: slots sorted by expert, x split into
# planes in that order, experts decoded to f16 a group at a time). Issue 20.
#   1. lib tests of the direct GEMMs (dense and experts) against the CPU decode.
#   2. examples/gemm_shapes q4 at 512 and 2,048 rows with SPARSA_COOP_DIRECT 0 and 1 (every
#      dispatch of a product timed: the sort, split and decode included).
#   3. 4-layer GLM-5 q4 prefill of 2,048 and 4,096 tokens, SPARSA_COOP_DIRECT 0 / 1,
#      alternated twice after a warm-up; one profiled run with 1.
#   4. Full depth (78 layers, 16 experts, MTP): prefill of 2,048 and 8,192, 0 / 1.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run2; mkdir -p $R
D=/tmp/m; D4=/tmp/m4
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $R/synth.txt &
SY=$!
timeout 60 /tmp/libtest direct_gemm > $R/libtest.txt 2>&1
echo "== libtest direct_gemm (rc $?): $(grep -E 'test result|panicked' $R/libtest.txt | head -3)"
for d in 0 1; do
  SPARSA_COOP_DIRECT=$d timeout 100 /tmp/gemm_shapes q4 5 512,2048 > $R/shapes.d$d.txt 2>&1
  echo "== shapes DIRECT=$d (rc $?)"; grep -E "^q4:" $R/shapes.d$d.txt | cut -c1-100
done
timeout 60 $S synth --like glm-5 --layers 4 --experts 16 --format q4 --mtp --out $D4 > /dev/null 2>&1
timeout 90 $S bench --model $D4 --context 4160 --decode 2 --prompt-len 2048 --no-profile > $R/warm.txt 2>&1
for r in 1 2; do
  for d in 0 1; do
    for n in 2048 4096; do
      f=$R/pf4.$r.d$d.$n.txt
      SPARSA_COOP_DIRECT=$d timeout 90 $S bench --model $D4 --context $((n + 64)) --decode 2 --prompt-len $n --no-profile > $f 2>&1
      echo "== 4 layers $r DIRECT=$d $n (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120)"
    done
  done
done
SPARSA_COOP_DIRECT=1 timeout 90 $S bench --model $D4 --context 2112 --decode 2 --prompt-len 2048 > $R/prof4.d1.txt 2>&1
echo "== profile DIRECT=1 (rc $?)"; grep -E "gemm|split_x|dequant_w|sort_slots|mla" $R/prof4.d1.txt | head -14 | cut -c1-160
rm -rf $D4
wait $SY; cat $R/synth.txt
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-560} - SECONDS)); }
for n in 2048 8192; do
  for d in 0 1; do
    [ $(left) -gt 50 ] || break
    f=$R/pf78.d$d.$n.txt
    SPARSA_COOP_DIRECT=$d timeout 80 $S bench --model $D --context $((n + 64)) --decode 2 --prompt-len $n --no-profile > $f 2>&1
    echo "== 78 layers DIRECT=$d $n (rc $?): $(grep -hE '^bench: prefill|rror' $f | cut -c1-120)"
  done
done
rm -rf $D
tar czf $OUT/run2.tgz -C $R .
echo "[$SECONDS s]"
