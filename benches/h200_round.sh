#!/bin/bash
# Issue 25 on the H200, one device call: what a speculative round costs the host. A
# full-depth zero-weight GLM-5 q4 synth with its MTP layer: `bench --verify` under knob
# sets ($SETS; e.g. SPARSA_SUBMIT_EVERY=0: a verification in one submission,
# SPARSA_CACHE_ROWS=1: its bind groups made anew each round), then greedy `generate` with
# and without drafts; then the built-in model (benches/h200_bard_mtp.sh) under each of
# $BARD_SETS. Needs .h200/sparsa.xz and .gl/. Results: $OUT/mtp.txt, $OUT/bard-*/.
set -u
here=$(dirname "$0")
. "$here/h200_setup.sh"
SETS=${SETS:-default} DRAFTS=${DRAFTS:-3 5} CTX=${CTX:-4096} VERIFY=${VERIFY:-1,3,4,7} \
  bash "$here/h200_mtp.sh"
for set in ${BARD_SETS:-default}; do
  echo "== built-in model, $set"
  env $( [ "$set" = default ] || echo "$set" | tr , ' ' ) OUT=$OUT/bard-${set//[=,]/_} \
    DRAFTS="${BARD_DRAFTS:-0 3}" bash "$here/h200_bard_mtp.sh" | grep -E "decode|drafts:" | sed 's/^/  /'
done
true
