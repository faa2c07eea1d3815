#!/bin/bash
# First device call of 2026-12-05 (from the repository root, carry .gl and .h200; the bundle
# of h200_check.sh with examples/cpu_experts; ~8 minutes): the prepared MLA call of
# 2026-12-04 (benches/results/2026-12-04-h200-mla-values/run.sh: the lib tests and goldens,
# SPARSA_COOP_GATHER=1 and SPARSA_MLA_GEMM=3 checked and timed on the 4-layer GLM-5 q4), then
# the matmul lib tests and the goldens with a few rows on the GEMM tiles
# (SPARSA_GEMM_FROM_ROWS=2: tensor cores at 2-8 rows, a batched step's and a verification's).
set -u
bash benches/results/2026-12-04-h200-mla-values/run.sh
. benches/h200_setup.sh
SPARSA_GEMM_FROM_ROWS=2 timeout 150 /tmp/libtest kernels::matmul --test-threads=4 > $OUT/matmul.gemm2.txt 2>&1
echo "matmul lib tests, SPARSA_GEMM_FROM_ROWS=2 (rc $?): $(grep 'test result' $OUT/matmul.gemm2.txt)"
SPARSA_GEMM_FROM_ROWS=2 timeout 150 /tmp/golden --test-threads=2 --nocapture --skip quantize > $OUT/goldens.gemm2.txt 2>&1
echo "goldens, SPARSA_GEMM_FROM_ROWS=2 (rc $?): $(grep 'test result' $OUT/goldens.gemm2.txt)"
