#!/bin/bash
# 2026-12-07, first call: (a) issue 25's first target on this GPU: the built-in model (the
# retrained MTP layer of 1ae0a5f), ROMEO prompt, 1,000 greedy tokens, no drafts against
# --draft 3 (and 4), alternated six times, fb368d2's code (sparsa-add; HEAD differs only in
# tests, docs and the model file, which comes from the tree); (b) full depth (GLM-5 q4 synth,
# 78 layers, 16 experts, MTP layer, context 4,096), profiled: batch 1 / 8 (issue 23) and a
# 4-position verification (issue 25), then unprofiled twice, and one 2,048-token prefill.
# Carries .gl, .h200.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
B=/tmp/sparsa-add
D=/tmp/m
O=models/sparsa-bard-12m
for r in 1 2 3 4 5 6; do for k in 0 3 4; do
  [ $k = 4 ] && [ $((r % 2)) = 1 ] && continue
  timeout 60 $B generate -m $O -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $k -v > $R/text.txt 2> $R/err.txt
  echo "$r k$k rc $? $(md5sum < $R/text.txt | cut -c1-12) $(grep -oE 'decode [0-9.]+ tok/s' $R/err.txt) $(grep -oE '[0-9.]+ tokens per verification|per round .*GPU' $R/err.txt | tr '\n' ' ')" | tee -a $R/bard.txt
done; done
( time timeout 240 $B synth --like glm-5 --layers 78 --experts 16 --format q4 --mtp --out $D > $R/synth.log 2>&1 ) 2> $R/synth.time
grep real $R/synth.time
echo "[$SECONDS s] synth done"
timeout 100 $B bench --model $D --context 4096 --decode 8 --batch 1,8 > $R/batch.txt 2>&1
grep -hE "^bench: batched|rror" $R/batch.txt | cut -c1-140
timeout 60 $B bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 > $R/verify.txt 2>&1
grep -hE "^bench: (verify|decode at)|rror" $R/verify.txt | cut -c1-200
for r in 1 2; do
  timeout 45 $B bench --model $D --context 4096 --decode 8 --batch 1,8 --no-profile > $R/bt.$r.txt 2>&1
  grep -hE "^bench: batched|rror" $R/bt.$r.txt | cut -c1-140
  timeout 30 $B bench --model $D --context 4096 --decode 8 --prompt-len 0 --verify 3 --no-profile > $R/v.$r.txt 2>&1
  grep -hE "^  verif|rror" $R/v.$r.txt | cut -c1-160
done
[ $SECONDS -lt 480 ] && timeout 60 $B bench --model $D --context 4096 --decode 4 --prompt-len 2048 --no-profile > $R/pf.txt 2>&1
grep -hE "bench: prefill|rror" $R/pf.txt | cut -c1-140
rm -rf $D
tar czf $OUT/run1.tgz -C $R .
echo "[$SECONDS s]"
