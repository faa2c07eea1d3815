#!/bin/bash
# Issue 22: the hybrid decode with the CPU part overlapped (SPARSA_CPU_OVERLAP, default 1)
# and the routing read-backs spinning instead of blocking (SPARSA_SPIN_WAIT=1, opt-in), one
# binary (run2's), settings alternated.
set -u
. benches/h200_setup.sh
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
i=0
for v in "1 1" "1 0" "0 0" "1 1" "1 0"; do
  set -- $v; i=$((i+1)); f=$OUT/hy$i-o$1-s$2.txt
  echo "== overlap $1 spin $2"
  SPARSA_CPU_OVERLAP=$1 SPARSA_SPIN_WAIT=$2 timeout 100 $S $B > $f 2>&1
  grep -E "a token's time|rror" $f | cut -c1-300
done
rm -rf $D
