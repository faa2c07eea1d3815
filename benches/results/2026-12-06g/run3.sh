#!/bin/bash
# 2026-12-06 (seventh session), third call, on the same warm machine as run2: run2.sh with
# 1,000 tokens instead of 2,000 (over 2,000 the drafts are accepted less: 1.73 tokens a round
# instead of 2.34 over the first 1,000, so the ratio measured depends on the length) and
# `bench --verify 3` at context 200. The built-in model, no drafts against --draft 3
# alternated four times, then --draft 2 and --draft 3 three deep once; each text hashed.
sed -e 's/-n 2000/-n 1000/; s/run2/run3/g; s/--context 1000 --decode 32/--context 200 --decode 32/' \
  "$(dirname "$0")/run2.sh" > /tmp/run3.sh && exec bash /tmp/run3.sh
