# Probe: cooperative matrices loaded straight from storage buffers, no workgroup staging
# (coop_probe.rs beside this script: copy it into examples/ to build it; `coop_probe check`
# validates its shaders with naga on any machine).
. benches/h200_setup.sh
chmod +x /tmp/coop_probe
/tmp/coop_probe 5 2>&1 | tee $OUT/probe.txt
