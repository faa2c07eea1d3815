#!/bin/bash
# 2026-12-06 (ninth session), first call: (a) four builds (one bundle, none with the embedded
# model): the router's fused GEMV and routing for one row only (sparsa, 2b9c372), for up to 8
# rows (sparsa-rg, d50e815); besides, a GPU round in one submission with its next hidden row
# and its picks with the acceptance in one dispatch each (sparsa-one, e5a530c); besides, the
# residual adds in the float GEMVs' store (sparsa-add, fb368d2): the built-in model, ROMEO
# prompt, 1,000 greedy tokens, no drafts and --draft 3, alternated twice; (b) the MTP layer
# trained further on the main model's own text (training/mtp.py --init shipped
# --own-windows), spliced into the shipped q8 model (--splice-q8), and timed the same way
# with fb368d2, with --draft 2 and 4 once. Each text hashed.
# Carries .gl, .h200 (the bundle), .whl, training/work/tokens.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
one() {
  local r=$1 b=$2 m=$3 k=$4
  echo "== $r $b $m --draft $k" >> $R/bard.txt
  timeout 60 /tmp/$b generate -m $m -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $k -v > $R/text.txt 2> $R/err.txt
  echo "rc $? text $(md5sum < $R/text.txt | cut -c1-12)" >> $R/bard.txt
  grep -E "tok/s|drafts:|rror" $R/err.txt >> $R/bard.txt
}
O=models/sparsa-bard-12m
for r in 1 2; do for b in sparsa sparsa-rg sparsa-one sparsa-add; do one $r $b $O 0; one $r $b $O 3; done; done
echo "[$SECONDS s] timing of the shipped layer done"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
B=${BUDGET:-240}
PYTHONUNBUFFERED=1 timeout $((B + 200)) python3 training/mtp.py --out $R/mtp --model-out /tmp/mtp_model --init shipped \
  --own-windows ${OWN:-4096} --own-bs 512 --own-frac 0.6 --lr-b 3e-4 --budget-a 0 --budget-b $B \
  --deadline $((B + 10)) ${MTPARGS:-} > $R/train.txt 2>&1
echo "train rc $? [$SECONDS s]"
grep -E "own_windows|initial|\"steps\"|restored|greedy held-out|done at|rror" $R/train.txt | cut -c1-420
python3 training/mtp.py --splice-q8 $R/mtp/mtp_layer.safetensors --model-out /tmp/new_q8 > /dev/null && \
  md5sum /tmp/new_q8/model.safetensors
N=/tmp/new_q8
if [ -f $N/model.safetensors ]; then
  cp $N/model.safetensors $R/new_model.safetensors
  for r in 3 4; do one $r sparsa-add $O 0; one $r sparsa-add $O 3; one $r sparsa-add $N 3; done
  one 5 sparsa-add $N 2; one 5 sparsa-add $N 4; one 5 sparsa-add $O 2
fi
grep -E "==|rc|decode|drafts" $R/bard.txt | sed 's/^.*prompt tokens.*generated, //' | paste - - - - | cut -c1-220
tar czf $OUT/run1.tgz -C $R .
echo "[$SECONDS s]"
