#!/bin/bash
# 2026-12-06 (eighth session), first call: the built-in model's MTP layer trained further on
# the main model's own text (training/mtp.py --init shipped --own-windows: continuations the
# frozen main model writes from corpus prefixes, greedy and sampled, half and more of each
# batch), then spliced into the shipped q8 model (--splice-q8) and timed beside the shipped
# layer: the ROMEO prompt, 1,000 greedy tokens, no drafts against --draft 3, alternated.
# Carries .whl (transformers 5.24.0, regex), training/work/tokens, .gl and two builds without
# the embedded model (`cargo build --release --no-default-features --features cli`):
# .h200/sparsa.xz (2b9c372) and .h200/sparsa-rg.xz (the router's GEMV and routing in one
# dispatch for up to 8 rows, not only one: a verification's 7 router GEMV + routing pairs
# become 7 dispatches).
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run1; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
PYTHONUNBUFFERED=1 timeout 330 python3 training/mtp.py --out $R/mtp --model-out /tmp/mtp_model --init shipped \
  --own-windows ${OWN:-2048} --own-bs 512 --own-frac 0.6 --lr-b 3e-4 --budget-a 0 --budget-b ${BUDGET:-150} \
  --deadline $(( ${BUDGET:-150} + 10 )) > $R/train.txt 2>&1
echo "train rc $? [$SECONDS s]"
grep -E "own_windows|initial|\"steps\"|restored|greedy held-out|done at|rror" $R/train.txt | cut -c1-420
python3 training/mtp.py --splice-q8 $R/mtp/mtp_layer.safetensors --model-out /tmp/new_q8 > /dev/null && \
  md5sum /tmp/new_q8/model.safetensors
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
one() {
  local r=$1 b=$2 m=$3 k=$4
  echo "== $r $b $m --draft $k" >> $R/bard.txt
  timeout 60 /tmp/$b generate -m $m -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $k -v > $R/text.txt 2> $R/err.txt
  echo "rc $? text $(md5sum < $R/text.txt | cut -c1-12)" >> $R/bard.txt
  grep -E "tok/s|drafts:|rror" $R/err.txt >> $R/bard.txt
}
O=models/sparsa-bard-12m; N=/tmp/new_q8; [ -f $N/model.safetensors ] || N=$O
for r in 1 2; do
  one $r sparsa $O 0; one $r sparsa $O 3; one $r sparsa $N 0; one $r sparsa $N 3
  one $r sparsa-rg $N 0; one $r sparsa-rg $N 3
done
one 3 sparsa-rg $N 2; one 3 sparsa-rg $N 4; one 3 sparsa-rg $N 0; one 3 sparsa-rg $N 3
grep -E "==|rc|decode|drafts" $R/bard.txt | sed 's/^.*prompt tokens.*generated, //' | paste - - - - | cut -c1-220
tar czf $OUT/run1.tgz -C $R .
echo "[$SECONDS s]"
