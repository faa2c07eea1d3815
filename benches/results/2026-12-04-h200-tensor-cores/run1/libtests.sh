#!/bin/bash
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
xz -dc .h200/libtests.xz > /tmp/lt; chmod +x /tmp/lt
echo "== lib tests (kernels, bench)"
timeout 300 /tmp/lt kernels:: bench:: --test-threads=4 > $OUT/libtests.txt 2>&1; echo "rc=$?"; grep -E "test result|FAILED|panicked" $OUT/libtests.txt | head -20
SPARSA_COOP_Q4_LO=1 timeout 200 /tmp/lt kernels::matmul --test-threads=4 > $OUT/libtests-lo1.txt 2>&1; echo "lo1 rc=$?"; grep -E "test result|FAILED" $OUT/libtests-lo1.txt | head
