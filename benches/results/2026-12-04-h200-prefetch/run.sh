#!/bin/bash
# Not run yet: written on 2026-12-04 when no device machine was lent. Issue 22: the CPU
# experts' q4 / q8 rows now prefetch their codes 4 KiB ahead (src/experts/cpu.rs,
# PREFETCH_AHEAD; SPARSA_CPU_PREFETCH=0 turns it off). On the 2-core development machine it
# took the executor from 68-72 % to 91-99 % of the RAM read rate; the H200 host's 16
# threads read 72-80 GB/s of its 116 without it. Carry .gl and .h200 with the sparsa binary
# and examples/cpu_experts in the bundle:
#   cargo build --release --example cpu_experts
#   cp target/release/sparsa target/release/examples/cpu_experts /tmp/b && strip /tmp/b/*
#   tar cf - -C /tmp/b sparsa cpu_experts | xz --lzma2=preset=6,dict=256MiB > .h200/bundle.tar.xz
# then from the repository root (~6 minutes):
set -u
. benches/h200_setup.sh
chmod +x /tmp/cpu_experts
for rep in a b; do
  for p in 0 1; do
    echo -n "prefetch $p: "
    SPARSA_CPU_PREFETCH=$p RAYON_NUM_THREADS=16 /tmp/cpu_experts q4 64 40 2>/dev/null
  done
done
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > /dev/null 2>&1 ) 2>&1 | grep real
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
for rep in a b; do
  for p in 0 1; do
    echo "== hybrid, prefetch $p ($rep)"
    SPARSA_CPU_PREFETCH=$p timeout 100 $S $B > $OUT/hy-$p-$rep.txt 2>&1
    grep -E "decode at|CPU experts|routing|stalled|a token|rror" $OUT/hy-$p-$rep.txt | cut -c1-300
  done
done
rm -rf $D
