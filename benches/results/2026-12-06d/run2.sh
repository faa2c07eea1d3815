#!/bin/bash
# 2026-12-06 (fourth session), second call, bundle of 79c7c1b with de2725f's sparsa beside it:
#   1. The built-in model's drafts (issue 25): de2725f (rounds compile their pipelines as they
#      go) against 79c7c1b (Session::warm_drafts compiles them before the first round), no
#      drafts and --draft 3; then 79c7c1b at --draft 1, 2, 4, 6. Alternated twice.
#   2. Correctness of SPARSA_DOT_I2F=3 (x's block factors once per x row and word in the
#      few-rows kernels): the matmul lib tests, goldens and batch tests with it.
#   3. gemv_shapes q4 at 1, 4, 8 rows: default, SPARSA_DOT_I2F=3, SPARSA_GEMV_TPR=32 and =8
#      (lanes a row group, now measured on the routed experts' rows), alternated twice.
#   4. Full depth (GLM-5 q4 synth, 78 layers, 16 experts, MTP, context 4,096): batch 1 / 8 and
#      a 4-position verification, default against SPARSA_DOT_I2F=3, alternated twice; prefill
#      of 2,048 tokens in chunks of 512 (default) and 2,048, and of 8,192 in chunks of 2,048.
# Every output in one archive ($OUT/run2.tgz).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden /tmp/batchtest /tmp/gemv_shapes /tmp/sparsa-de2725f
R=/tmp/run2; mkdir -p $R
D=/tmp/m
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > /dev/null 2>&1 ) 2>&1 | grep real > $R/synth.txt &
SY=$!
SPARSA_DOT_I2F=3 timeout 90 /tmp/libtest kernels::matmul:: --test-threads=2 > $R/lib.txt 2>&1
echo "matmul lib tests, I2F=3 (rc $?): $(grep 'test result' $R/lib.txt)"
SPARSA_DOT_I2F=3 timeout 120 /tmp/golden --test-threads=2 --skip quantize_is_reproducible > $R/golden.txt 2>&1
echo "goldens, I2F=3 (rc $?): $(grep 'test result' $R/golden.txt)"
SPARSA_DOT_I2F=3 timeout 60 /tmp/batchtest --test-threads=1 > $R/batch.txt 2>&1
echo "batch tests, I2F=3 (rc $?): $(grep 'test result' $R/batch.txt)"
for r in 1 2; do
  for v in auto "SPARSA_DOT_I2F=3" "SPARSA_GEMV_TPR=32" "SPARSA_GEMV_TPR=8"; do
    e=""; [ "$v" = auto ] || e="$v"
    f="$R/shapes.$r.${v// /+}.txt"
    env $e SPARSA_GEMV_XQ=1 timeout 60 /tmp/gemv_shapes q4 20 1,4,8 > "$f" 2>&1
    echo "== shapes $r $v (rc $?): $(grep -E '^q4x[148]: (all|routed (gate_up|down)) ' "$f" | tr -s ' ' | cut -d' ' -f1,2,3,6 | tr '\n' ' ')"
  done
done
wait $SY; cat $R/synth.txt
echo "[$SECONDS s] synth done"
# The built-in model is host-bound: run after the synth, with the host idle.
M=models/sparsa-bard-12m
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
for r in 1 2; do
  for bk in "sparsa-de2725f 0" "sparsa-de2725f 3" "sparsa 0" "sparsa 3" "sparsa 1" "sparsa 2" "sparsa 4" "sparsa 6"; do
    set -- $bk
    echo "== $r built-in model, $1 --draft $2" >> $R/bard.txt
    timeout 30 /tmp/$1 generate -m $M -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $2 -v 2>&1 | grep -E "tok/s|drafts:|host ms|rror" >> $R/bard.txt
  done
done
grep -E "==|decode|drafts" $R/bard.txt | sed 's/^5 prompt.*decode/decode/'
left() { echo $((${LIMIT:-540} - SECONDS)); }
for v in auto "SPARSA_DOT_I2F=3" auto "SPARSA_DOT_I2F=3"; do
  [ $(left) -gt 120 ] || break
  e=""; [ "$v" = auto ] || e="$v"
  echo "== full depth, $v [$SECONDS s]"
  env $e timeout 40 $S bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > "$R/bt.${v// /+}.$SECONDS.txt" 2>&1
  ls -t "$R"/bt.${v// /+}.*.txt | head -1 | xargs grep -hE "^bench: batched|rror" | cut -c1-120
  env $e timeout 30 $S bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > "$R/v.${v// /+}.$SECONDS.txt" 2>&1
  ls -t "$R"/v.${v// /+}.*.txt | head -1 | xargs grep -hE "^  verif|rror" | cut -c1-140
done
for cn in "512 2048" "2048 2048" "2048 8192"; do
  set -- $cn; c=$1
  for n in $2; do
    [ $(left) -gt 45 ] || break
    timeout 60 $S bench --model $D --context $((n + 64)) --decode 2 --prompt-len $n --prefill-chunk $c --no-profile > $R/pf.$c.$n.txt 2>&1
    echo "chunk $c: $(grep -hE "^bench: prefill|rror" $R/pf.$c.$n.txt | cut -c1-120)"
  done
done
rm -rf $D
tar czf $OUT/run2.tgz -C $R .
echo "[$SECONDS s]"
