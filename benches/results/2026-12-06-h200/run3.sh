#!/bin/bash
# 2026-12-06: gemv_dot_rows through subgroup shuffles by default where its dispatch has at
# most 256 workgroups (898a4da), against SPARSA_DOT_SG=0 (the workgroup-memory tree
# everywhere): the GLM-5 decode shapes at 8 rows, then full depth (GLM-5 q4 synth, 78
# layers, 16 experts, MTP layer, context 4,096: batch 1 / 8 and a 4-position verification)
# alternated while the call's time lasts (LIMIT, default 250 s). Every output in one archive
# ($OUT/run3.tgz: a call brings back only a few files).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/gemv_shapes*
R=/tmp/run3; mkdir -p $R
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $R/synth.txt &
SY=$!
timeout 60 /tmp/libtest kernels::matmul::tests::integer_dot kernels::matmul::tests::xq_gemv kernels::matmul::tests::dot_red --test-threads=2 > $R/matmul.txt 2>&1
echo "lib tests (rc $?): $(grep 'test result' $R/matmul.txt)"
for v in auto 0; do
  e=""; [ $v = 0 ] && e="SPARSA_DOT_SG=0"
  env $e SPARSA_GEMV_XQ=1 timeout 30 /tmp/gemv_shapes q4 20 8 > $R/shapes.$v.txt 2>&1
  echo "== shapes at 8 rows, $v (rc $?): $(grep -E '^q4x8: all' $R/shapes.$v.txt | tr -s ' ' | cut -d' ' -f1,4,5)"
done
wait $SY; cat $R/synth.txt
echo "[$SECONDS s] synth done"
left() { echo $((${LIMIT:-250} - SECONDS)); }
for v in auto 0 auto 0; do
  [ $(left) -gt 30 ] || break
  e=""; [ $v = 0 ] && e="SPARSA_DOT_SG=0"
  echo "== full depth, $v [$SECONDS s]"
  env $e timeout 40 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $R/bt.$v.$SECONDS.txt 2>&1
  grep -hE "sequences|rror" $R/bt.$v.$SECONDS.txt | cut -c1-120
  [ $(left) -gt 15 ] || break
  env $e timeout 30 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $R/v.$v.$SECONDS.txt 2>&1
  grep -hE "^  verif|rror" $R/v.$v.*.txt | tail -1 | cut -c1-120
done
rm -rf $D
tar czf $OUT/run3.tgz -C $R .
echo "[$SECONDS s]"
