# 128-column tensor-core tiles, second version (the two 64-column blocks' staged weights and
# results as fields, not arrays indexed in loops), against fb5e6e4: the matmul lib tests, and
# examples/gemm_shapes of both builds and of this one with SPARSA_COOP_TN=64.
set -u
. benches/h200_setup.sh
chmod +x /tmp/gemm_shapes* /tmp/libtest
timeout 200 /tmp/libtest kernels::matmul kernels::attention --test-threads=4 > $OUT/libtests.txt 2>&1
echo "lib tests (rc $?): $(grep 'test result' $OUT/libtests.txt)"
for b in gemm_shapes_old gemm_shapes; do
  echo "== $b"; /tmp/$b q4,bf16 5 512,2048 2>&1 | tee $OUT/$b.txt | grep -v "^$"
done
echo "== gemm_shapes SPARSA_COOP_TN=64"; SPARSA_COOP_TN=64 /tmp/gemm_shapes q4 5 512,2048 2>&1 | tee $OUT/gemm_shapes_tn64.txt | grep -v "^$"
