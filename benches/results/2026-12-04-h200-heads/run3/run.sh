#!/bin/bash
# (1) Issue 22: the CPU expert executor of HEAD (AVX-512 q4 rows on bytes, per-chunk factors
#     as vectors) against eb8b1d1 (the last build measured on this host), alternated.
# (2) Issue 20 item 5: prefill of 8,192 tokens at full depth under --gpu-memory 24GiB in
#     chunks of 512 (the default), 1,024 and 2,048 rows (SPARSA_PREFILL_CHUNK), decode after.
# (3) Issue 22: the hybrid decode (uniform replayed routing, misses on the CPU), HEAD
#     against eb8b1d1, alternated.
set -u
. benches/h200_setup.sh
for rep in 1 2; do
  for b in ce_new ce_old; do
    /tmp/$b q4 16 40 2>/dev/null | sed "s/^/rep$rep $b 16 threads /"
  done
done
for b in ce_new ce_old; do RAYON_NUM_THREADS=1 /tmp/$b q4 16 10 2>/dev/null | sed "s/^/$b 1 thread /"; done
D=/tmp/m
( time timeout 200 $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
for c in 512 2048 1024; do
  echo "== 24GiB, chunks of $c"
  SPARSA_PREFILL_CHUNK=$c timeout 150 $S bench --model $D --context 8192 --decode 8 --prompt-len 8192 --no-profile --gpu-memory 24GiB > $OUT/chunk$c.txt 2>&1
  grep -E "^prefill|^decode|rror|plan|resident" $OUT/chunk$c.txt | cut -c1-250 | head -6
done
B="bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
for rep in a b; do
  for b in sparsa sparsa_eb; do
    echo "== hybrid $b ($rep)"
    timeout 150 /tmp/$b $B > $OUT/hy-$b-$rep.txt 2>&1
    grep -E "decode at|CPU experts|routing|rror" $OUT/hy-$b-$rep.txt | cut -c1-300
  done
done
rm -rf $D
