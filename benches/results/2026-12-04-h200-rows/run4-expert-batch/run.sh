. benches/h200_setup.sh
D=/tmp/m
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
for k in SPARSA_NONE=0 SPARSA_EXPERT_BATCH=4 SPARSA_EXPERT_BATCH=2 "SPARSA_EXPERT_BATCH=4 SPARSA_ROWS_UNROLL=1"; do
  n=$(echo $k | tr ' =' '--')
  echo "== $k"
  env $k timeout 100 $S bench --model $D --context 512 --decode 16 --prompt-len 0 --batch 4,8 > $OUT/k-$n.txt 2>&1
  grep -E "^bench: batched|rror" $OUT/k-$n.txt; grep -E "gemv_dot_experts_rows" $OUT/k-$n.txt
done
rm -rf $D
