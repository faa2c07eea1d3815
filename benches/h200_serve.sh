#!/bin/bash
# Issue 23 on the H200, one device call: batched decode across sequences in `sparsa serve`.
# A 78-layer GLM-5 q4 synth with 16 experts a layer and random weights (the routers pick
# near-uniformly per token, so 8 rows touch most of a layer's experts: the hard case for
# batching an MoE), resident, `--parallel 8 --ctx 4096`; benches/serve_load.py with 1, 2, 4
# and 8 greedy streams of 256 tokens, batched and with SPARSA_SERVE_BATCH=0 (each sequence
# its own step, as before batching), alternated. Needs .h200/sparsa.xz and .gl/.
# Results: $OUT/*.txt.
set -u
. "$(dirname "$0")/h200_setup.sh"
D=/tmp/m
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
serve_run() {
  name=$1; shift
  env "$@" $S serve --model $D --parallel 8 --ctx 4096 --port 8090 > $OUT/$name-server.txt 2>&1 &
  pid=$!
  for i in $(seq 300); do grep -q listening $OUT/$name-server.txt && break; sleep 1; done
  echo "== $name ($*)"
  timeout 200 python3 benches/serve_load.py http://127.0.0.1:8090 --streams ${STREAMS:-1,2,4,8} \
    --tokens ${TOKENS:-256} --rounds ${ROUNDS:-1} > $OUT/$name.txt 2>&1
  cat $OUT/$name.txt
  kill -INT $pid; wait $pid
  grep -E "rror|panic" $OUT/$name-server.txt | head -3
}
serve_run batched SPARSA_SERVE_BATCH=1
serve_run single SPARSA_SERVE_BATCH=0
serve_run batched-again SPARSA_SERVE_BATCH=1
rm -rf $D
