. benches/h200_setup.sh
xz -dc .h200/gemv_shapes.xz > /tmp/g; chmod +x /tmp/g
/tmp/g q4 20 1,2,4,8 > $OUT/int.txt 2>&1; grep -E "copy|: all" $OUT/int.txt
D=/tmp/m
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
timeout 150 $S bench --model $D --context 512 --decode 16 --prompt-len 0 --batch 2,4,8 > $OUT/batch.txt 2>&1
grep -E "^bench: batched|rror" $OUT/batch.txt; grep -E "gemv_dot_experts_rows|gemv_dot_rows|mla::mla " $OUT/batch.txt
for k in SPARSA_MLA_HG=16 SPARSA_MLA_HG=4 SPARSA_MLA_GROUPS=1024 SPARSA_MLA_GROUPS=64; do
  echo "== $k"
  env $k timeout 100 $S bench --model $D --context 512 --decode 16 --prompt-len 0 --batch 8 > $OUT/k-${k/=/-}.txt 2>&1
  grep -E "^bench: batched|rror" $OUT/k-${k/=/-}.txt; grep -E "mla::mla " $OUT/k-${k/=/-}.txt
done
rm -rf $D
