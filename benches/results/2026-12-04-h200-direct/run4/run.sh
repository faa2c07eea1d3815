# 128-column tensor-core tiles for weights without lo halves (q4, bf16, f16) against fb5e6e4
# (64 columns): correctness (kernel lib tests, goldens), examples/gemm_shapes alternated, and
# the 78-layer GLM-5 q4 prefill of both builds alternated.
set -u
. benches/h200_setup.sh
chmod +x /tmp/gemm_shapes* /tmp/libtest /tmp/golden
bash benches/h200_check.sh
grep -q "test result: ok" $OUT/libtests.txt || exit 1
for b in gemm_shapes_old gemm_shapes; do
  echo "== $b"; /tmp/$b q4,bf16 5 512,2048 2>&1 | tee $OUT/$b.txt | grep -v "^$"
done
D=/tmp/glm5-78
/tmp/sparsa synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > $OUT/synth.txt 2>&1 || { tail -3 $OUT/synth.txt; exit 1; }
for i in 1 2; do
  for b in sparsa_old sparsa; do
    echo "== $b pass $i"
    /tmp/$b bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile 2>&1 | tee $OUT/bench78.$b.$i.txt | grep -iE "prefill|tok/s" | head -6
  done
done
rm -rf $D
