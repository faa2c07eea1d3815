#!/bin/bash
# 2026-12-06 (sixth session), second call (the same warm H100 as run1, the same bundle of
# 3c2e5dd), run as one command line: the built-in model, 1,000 greedy tokens, alternated
# twice: no drafts and --draft 3 with the defaults, with SPARSA_SUBMIT_EVERY=0 (a round's
# verification in one submission instead of one every ~18 dispatches) and SPARSA_SPIN_WAIT=1
# (the read-back polled without sleeping); --draft 2 with SPARSA_SUBMIT_EVERY=0. Output
# in run2-h100.txt.
. benches/h200_setup.sh >/dev/null 2>&1; M=models/sparsa-bard-12m; P=$'ROMEO.\nBut soft, what light through yonder window breaks?\n'; for r in 1 2; do for v in "0 -" "3 -" "3 SPARSA_SUBMIT_EVERY=0" "0 SPARSA_SUBMIT_EVERY=0" "3 SPARSA_SPIN_WAIT=1" "2 SPARSA_SUBMIT_EVERY=0"; do set -- $v; e=""; [ "$2" = - ] || e="$2"; echo "== $r --draft $1 $2: $(env $e timeout 30 $S generate -m $M -p "$P" -n 1000 --ignore-eos --temperature 0 --draft $1 -v 2>&1 >/tmp/t.txt | grep -E 'decode|drafts:|^per round' | sed 's/^.*generated, //' | tr '\n' ' ' | cut -c1-330) text $(md5sum < /tmp/t.txt | cut -c1-12)"; done; done 2>&1 | tee $OUT/run2.txt
