#!/bin/bash
# The H200 runs behind BENCHMARKS.md, as one script. Run from the repository root on the GPU
# machine with a release `sparsa` at $SPARSA (built elsewhere and copied; default
# target/release/sparsa) and results written to $OUT (default benches/results/new).
# Needs ~25 GB of disk in /tmp for the synthetic models; transformers + torch for the
# side-by-side numbers.
set -u
S="${SPARSA:-target/release/sparsa}"
OUT="${OUT:-benches/results/new}"
mkdir -p "$OUT"
for spec in "glm-5 q4 g5q4" "glm-5.2 q4 g52q4" "deepseek-v3.2 q4 dsq4" "glm-5 bf16 g5bf" "glm-5 q8 g5q8"; do
  set -- $spec
  [ -d /tmp/$3 ] || "$S" synth --like $1 --layers 4 --experts 16 --format $2 --out /tmp/$3 2>&1 | tail -1
done
B="$S bench --decode 32 --calibrate"
$B --model /tmp/g5q4 --dense --context 4096,32768,131072 --prompt-len 512,4096 --json "$OUT/g5q4.json" > "$OUT/g5q4.txt"
$B --model /tmp/g52q4 --dense --context 4096,32768,131072 --prompt-len 512 --json "$OUT/g52q4.json" > "$OUT/g52q4.txt"
$B --model /tmp/dsq4 --dense --context 4096,131072 --prompt-len 512 --json "$OUT/dsq4.json" > "$OUT/dsq4.txt"
$B --model /tmp/g5bf --context 4096 --prompt-len 512 > "$OUT/g5bf.txt"
$B --model /tmp/g5q8 --context 4096 --prompt-len 512 > "$OUT/g5q8.txt"
# The 128K prefill (about 100 s); SKIP_128K=1 leaves it out.
[ -n "${SKIP_128K:-}" ] || "$S" bench --model /tmp/g5q4 --prompt-len 131072 --context 131072 --decode 4 --no-profile > "$OUT/g5q4_128k.txt"
# Decode GEMVs per GLM-5 matrix shape (needs the example built beside sparsa).
GS="${GEMV_SHAPES:-target/release/examples/gemv_shapes}"
[ -x "$GS" ] && "$GS" q4,q8,bf16 20 > "$OUT/gemv_shapes.txt"
python3 benches/transformers_decode.py --model /tmp/g5bf --contexts ${TF_CONTEXTS:-512,4096,16384} --decode 16 --json "$OUT/tf_g5.json" > /dev/null
python3 benches/plot.py "$OUT" docs/
