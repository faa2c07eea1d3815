#!/bin/bash
# Faults on a real driver (docs/ROBUSTNESS.md): GPU memory running out without fault
# injection, and a device loss, on the H200 machine. Run from the repository root with a
# release `sparsa` at $SPARSA; needs ~20 GB of disk in /tmp for the synthetic model.
set -u
S="${SPARSA:-target/release/sparsa}"
M=/tmp/g5deep
# GLM-5's full depth (78 layers) with 8 routed experts per layer, 4-bit.
[ -d $M ] || "$S" synth --like glm-5 --layers 78 --experts 8 --format q4 --out $M 2>&1 | tail -1
echo "== fits: --ctx 4096"
"$S" generate --model $M --tokens 1,2,3 --max-tokens 4 --ctx 4096 --print-ids; echo "exit $?"
echo "== caches for --ctx 900000 need 78 x 2.5 GB, more than the GPU has"
/usr/bin/time -f "wall %e s, max RSS %M KB" "$S" generate --model $M --tokens 1,2,3 --max-tokens 4 --ctx 900000; echo "exit $?"
echo "== device destroyed after 20 submissions"
SPARSA_FAULT_DEVICE_LOST_AFTER=20 "$S" generate --model $M --tokens 1,2,3 --max-tokens 40 --ctx 4096; echo "exit $?"
