# Sourced by the H200 scripts: $OUT made, the carried Vulkan loader (.gl/) unpacked and the
# NVIDIA driver named, a runtime dir, the carried builds unpacked into /tmp (.h200/sparsa.xz
# or a bundle, below), the sparsa binary as $S.
OUT="${OUT:-benches/results/new}"; mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
F=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; [ -f $F ] && export VK_DRIVER_FILES=$F
export XDG_RUNTIME_DIR=/tmp/x; mkdir -p -m 700 /tmp/x
# The binaries come one by one (.h200/NAME.xz) or as one bundle (.h200/bundle.tar.xz: several
# builds compress to little more than one with a dictionary that spans them, `xz
# --lzma2=preset=6,dict=256MiB`, which keeps them under the 64 MiB the device call carries).
[ -f .h200/bundle.tar.xz ] && tar xJf .h200/bundle.tar.xz -C /tmp
for f in .h200/*.xz; do n=$(basename $f .xz); [ $n = bundle.tar ] || xz -dc $f > /tmp/$n; done
chmod +x /tmp/sparsa*; S=/tmp/sparsa
