#!/bin/bash
# run2's lib tests timed out (300 s, only the 7 tests without a GPU finished): each GPU lib
# test alone, with a timeout, to find the one that hangs; then the 78-layer GLM-5 q4 prefill
# with the MLA GEMMs (default) and the mla kernel (SPARSA_MLA_GEMM=0), one binary.
set -u
. benches/h200_setup.sh
chmod +x /tmp/libtest
T0=$(date +%s)
/tmp/libtest --list kernels:: bench:: gpu:: 2>/dev/null | grep ": test$" | sed 's/: test$//' > $OUT/tests.txt
while read t; do
  [ $(( $(date +%s) - T0 )) -gt 240 ] && { echo "stopped at $t"; break; }
  s=$(date +%s.%N)
  timeout 30 /tmp/libtest --exact "$t" --test-threads=1 > $OUT/t.txt 2>&1; rc=$?
  e=$(echo "$(date +%s.%N) - $s" | bc)
  echo "$rc $e $t" >> $OUT/pertest.txt
  [ $rc = 0 ] || { echo "rc $rc ${e}s $t"; tail -5 $OUT/t.txt | cut -c1-200; }
done < $OUT/tests.txt
echo "tests run: $(wc -l < $OUT/pertest.txt), ok: $(grep -c '^0 ' $OUT/pertest.txt)"
D=/tmp/glm5-78
$S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > /dev/null 2>&1 || exit 1
for g in 1 0; do
  echo "== gemm $g"
  SPARSA_MLA_GEMM=$g timeout 150 $S bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile > $OUT/b78.$g.txt 2>&1
  grep -E "^prefill|^decode|rror" $OUT/b78.$g.txt | cut -c1-150
done
rm -rf $D
