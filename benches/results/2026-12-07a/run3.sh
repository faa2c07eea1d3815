#!/bin/bash
# 2026-12-07, third call: the built-in model's MTP layer trained on from the shipped one
# (training/logs/mtp-run2) on 4,096 fresh own-text windows (seed 7) for ${BUDGET:-270} s
# (training/mtp.py --init shipped --own-windows 4096 --own-frac 0.6 --lr-b 3e-4
# --budget-a 0), spliced into the shipped q8 model (--splice-q8) and timed against the
# shipped layer with ad5564c (sparsa-rp): ROMEO prompt, 1,000 greedy tokens, --draft 3 and
# 4, alternated three times. Carries .gl, .h200, .whl, training/work/tokens.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
R=/tmp/run3; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $R/gpu.txt 2>&1; tail -1 $R/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
B=${BUDGET:-270}
PYTHONUNBUFFERED=1 timeout $((B + 260)) python3 training/mtp.py --out $R/mtp --model-out /tmp/mtp_model --init shipped \
  --seed 7 --own-windows 4096 --own-bs 512 --own-frac 0.6 --lr-b 3e-4 --budget-a 0 --budget-b $B \
  --deadline $((B + 10)) > $R/train.txt 2>&1
echo "train rc $? [$SECONDS s]"
grep -E "own_windows|\"steps\"|greedy held-out|done at|rror" $R/train.txt | cut -c1-300
python3 training/mtp.py --splice-q8 $R/mtp/mtp_layer.safetensors --model-out /tmp/new_q8 > /dev/null && \
  md5sum /tmp/new_q8/model.safetensors
P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'
O=models/sparsa-bard-12m
N=/tmp/new_q8
if [ -f $N/model.safetensors ]; then
  cp $N/model.safetensors $R/new_model.safetensors
  for r in 1 2 3; do for m in $O $N; do for k in 3 4; do
    [ $SECONDS -lt 570 ] || break
    timeout 30 /tmp/sparsa-rp generate -m $m -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $k -v > $R/text.txt 2> $R/err.txt
    echo "$r $(basename $m) k$k rc $? $(md5sum < $R/text.txt | cut -c1-12) $(grep -oE 'decode [0-9.]+ tok/s' $R/err.txt) $(grep -oE '[0-9.]+ tokens per verification' $R/err.txt)" | tee -a $R/bard.txt
  done; done; done
fi
tar czf $OUT/run3.tgz -C $R .
echo "[$SECONDS s]"
