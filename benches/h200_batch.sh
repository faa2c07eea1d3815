#!/bin/bash
# Issue 23 on the H200, one device call: batched decode steps (`sparsa bench --batch`) of a
# 78-layer GLM-5 q4 synth with 16 experts a layer and random weights (the routers pick
# near-uniformly per token, so 8 rows touch most of a layer's experts), resident, at 512 and
# 4,096 positions, 1/2/4/8 sequences a step, with the per-kernel profile of each. Then
# `sparsa serve --parallel 8` with 1 and 8 greedy streams (benches/serve_load.py).
# Needs .h200/sparsa.xz and .gl/. Results: $OUT/*.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
D=/tmp/m
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
timeout 300 $S bench --model $D --context ${CONTEXTS:-512,4096} --decode 16 --prompt-len 0 \
  --batch 2,4,8 > $OUT/batch.txt 2>&1
grep -E "^bench: batched|rror" $OUT/batch.txt
if [ -z "${NO_SERVE:-}" ]; then
  $S serve --model $D --parallel 8 --ctx 4096 --port 8090 > $OUT/serve-server.txt 2>&1 &
  pid=$!
  for i in $(seq 300); do grep -q listening $OUT/serve-server.txt && break; sleep 1; done
  timeout 150 python3 benches/serve_load.py http://127.0.0.1:8090 --streams 1,8 --tokens 256 \
    > $OUT/serve.txt 2>&1
  cat $OUT/serve.txt
  kill -INT $pid; wait $pid
fi
rm -rf $D
