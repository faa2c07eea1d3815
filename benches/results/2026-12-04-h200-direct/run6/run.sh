# 128-column tensor-core tiles (run5's tile): the kernel lib tests and the goldens on tensor
# cores, then the 78-layer GLM-5 q4 prefill with 128-column tiles (default) and 64
# (SPARSA_COOP_TN=64, the previous tile's rates in run5), alternated, one binary.
set -u
. benches/h200_setup.sh
chmod +x /tmp/libtest /tmp/golden
bash benches/h200_check.sh
grep -q "test result: ok" $OUT/libtests.txt || exit 1
D=/tmp/glm5-78
/tmp/sparsa synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D > /dev/null 2>&1 || exit 1
for tn in 128 64; do
  echo "== TN $tn"
  SPARSA_COOP_TN=$tn /tmp/sparsa bench --model $D --context 8192 --decode 2 --prompt-len 2048,8192 --no-profile 2>&1 | tee $OUT/bench78.tn$tn.txt | grep -E "^prefill|^decode" | cut -c1-150
done
rm -rf $D
