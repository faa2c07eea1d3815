#!/bin/bash
# 2026-12-05 late (prepared without a device): the integer-dot GEMVs' conversions (i2f_small:
# two integer and two float additions instead of two int-to-float conversions per word and
# weight row, the same bits) and SPARSA_ROWS_QUADS=2 (8 weight rows a lane in the few-rows
# kernels: half the x loads per product). Needs a bundle with gemv_shapes-old and sparsa-old
# (a build before both: `OLD="/work/old/sparsa-old /work/old/gemv_shapes-old"
# benches/h200_bundle.sh`). Part 1, about 3 minutes: the matmul lib tests (every layout on
# the device), then the GLM-5 decode shapes for old / new / new with 8 rows a lane / new with
# workgroups of 128 (SPARSA_ROWS_WG=128: occupancy in finer steps) / new without x's lo words
# (SPARSA_XQ_LO=0: what they cost; inexact, timing only), alternated twice.
set -u
OUT=${OUT:-benches/results/new}
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/gemv_shapes*
timeout 90 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.txt 2>&1
echo "matmul lib tests (rc $?): $(grep 'test result' $OUT/matmul.txt)"
grep -E "panicked|FAILED" $OUT/matmul.txt | head -4 | cut -c1-300
for pass in a b; do
  for v in old new "new SPARSA_ROWS_QUADS=2" "new SPARSA_ROWS_QUADS=2 SPARSA_ROWS_UNROLL=2" "new SPARSA_ROWS_UNROLL=2" "new SPARSA_ROWS_WG=128" "new SPARSA_ROWS_WG=128 SPARSA_ROWS_QUADS=2" "new SPARSA_XQ_LO=0"; do
    set -- $v; b=$1; shift
    g=/tmp/gemv_shapes; [ $b = old ] && g=/tmp/gemv_shapes-old
    n=$(echo "$v" | tr ' =' '__').$pass
    env "$@" SPARSA_GEMV_XQ=1 timeout 40 $g q4 20 1,2,4,8 > $OUT/shapes.$n.txt 2>&1
    echo "== shapes, $v ($pass, rc $?): $(grep -E '^q4x.: all' $OUT/shapes.$n.txt | tr -s ' ' | cut -c1-60 | tr '\n' ' ')"
  done
done
grep -iE "bandwidth|dot4|peak" $OUT/shapes.new.a.txt | head -3
echo "[$SECONDS s]"
