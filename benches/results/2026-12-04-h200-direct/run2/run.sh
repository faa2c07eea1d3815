# The tile staged in 16-byte units (8 f16 a store) against the tile of fb5e6e4 (4-byte
# pairs): correctness (kernel lib tests, goldens) and examples/gemm_shapes, alternated.
set -u
. benches/h200_setup.sh
chmod +x /tmp/gemm_shapes* /tmp/libtest /tmp/golden
bash benches/h200_check.sh
for i in 1 2; do
  for b in gemm_shapes_old gemm_shapes; do
    echo "== $b pass $i"; /tmp/$b q4,bf16 5 512,2048 2>&1 | tee $OUT/$b.$i.txt | grep -v "^$"
  done
done
