#!/bin/bash
# Issue 22: the hybrid run at full depth with the CPU experts' AVX-512 rows against AVX2
# (SPARSA_CPU_AVX512=0), alternated in one call; uniform and Zipf-1 replayed routing.
set -u
. benches/h200_setup.sh   # from the repository root; .h200/sparsa.xz built from eb8b1d1
D=/tmp/m
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --zeros --out $D ) 2>&1 | tail -3
B="$S bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB"
run() { name=$1; shift; echo "== $name: $*"; env "$@" timeout 150 $B $ROUTE > $OUT/$name.txt 2>&1; grep -E "decode at|CPU experts|routing|rror" $OUT/$name.txt | cut -c1-300; }
ROUTE="--expert-routing zipf:0 --cpu-experts on"
run u-512-a SPARSA_CPU_AVX512=1
run u-avx2-a SPARSA_CPU_AVX512=0
run u-512-b SPARSA_CPU_AVX512=1
run u-avx2-b SPARSA_CPU_AVX512=0
rm -rf $D
