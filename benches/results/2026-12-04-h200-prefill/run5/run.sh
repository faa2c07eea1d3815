#!/bin/bash
# Issue 20: sparsa beside transformers on the 4-layer GLM-5 shape, same machine, same call:
# sparsa's prefill of the q4 and the bf16 synth (chunks of 512), then transformers + torch
# (bf16, sdpa; the 512-token prefill first warms it) prefilling the bf16 one (benches/transformers_decode.py).
set -u
. benches/h200_setup.sh
for f in q4 bf16; do
  ( time $S synth --like glm-5 --layers 4 --experts 16 --format $f --out /tmp/g5$f ) 2>&1 | tail -3
  echo "== sparsa $f"
  timeout 120 $S bench --model /tmp/g5$f --context 16384 --decode 2 --prompt-len 2048,4096,16384 --no-profile > $OUT/sparsa-$f.txt 2>&1
  grep -E "^prefill|rror" $OUT/sparsa-$f.txt | head -4
done
rm -rf /tmp/g5q4
echo "== transformers"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tee $OUT/versions.txt
timeout 300 python3 benches/transformers_decode.py --model /tmp/g5bf16 --contexts 512,2048,4096,16384 --decode 2 --json $OUT/tf.json > $OUT/tf.txt 2>&1; echo "rc=$?"
tail -8 $OUT/tf.txt; cat $OUT/tf.json | head -40
rm -rf /tmp/g5bf16
