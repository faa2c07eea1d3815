#!/bin/bash
# The library's tests (every kernel against its CPU reference, the tensor-core GEMM tile
# included) on the H200, from a test binary built here (`cargo test --lib --no-run`,
# stripped, in .h200/libtest.xz). It finds the built-in model and test data through the
# path it was built in (/work/main), so that path points at this checkout.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
mkdir -p /work && [ -e /work/main ] || ln -s "$PWD" /work/main
xz -dc .h200/libtest.xz > /tmp/libtest; chmod +x /tmp/libtest
/tmp/libtest --test-threads=4 > $OUT/libtest.txt 2>&1; echo "rc=$?" >> $OUT/libtest.txt
tail -5 $OUT/libtest.txt
