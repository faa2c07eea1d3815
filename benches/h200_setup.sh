# Sourced by the H200 scripts: $OUT made, the carried Vulkan loader (.gl/) unpacked and the
# NVIDIA driver named, a runtime dir, the carried build (.h200/sparsa.xz) unpacked as $S.
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
xz -dc .h200/sparsa.xz > /tmp/sparsa; chmod +x /tmp/sparsa; S=/tmp/sparsa
