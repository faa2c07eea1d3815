#!/bin/bash
# Are two sparsa binaries' outputs bit for bit the same? For a change that must not change
# behaviour (a refactor), run the binary before and after it on the same adapter:
#
#   benches/bitwise.sh OLD_SPARSA NEW_SPARSA [DATA_DIR] [OUT_DIR]
#
# For the built-in model and every model in DATA_DIR (default tests/data): the logits of a
# 150-token prefill (two chunks on small adapters), 40 greedy and 40 sampled tokens (picked
# on the GPU, one step ahead), and 30 greedy tokens under a --gpu-memory budget of the fixed
# part plus 2.5 expert slots per MoE layer (experts stream, several rounds per prefill
# chunk). Prints one line per comparison; exits 1 if any differs.
OLD=$1; NEW=$2; DATA=${3:-tests/data}; OUTD=${4:-/tmp/sparsa-bitwise}
[ -x "$OLD" ] && [ -x "$NEW" ] || { echo "usage: $0 OLD_SPARSA NEW_SPARSA [DATA_DIR] [OUT_DIR]" >&2; exit 2; }
mkdir -p "$OUTD"
TOK=$(python3 -c "print(','.join(str(3+(i*37)%200) for i in range(150)))")
fail=0
models="builtin"
for d in "$DATA"/*/; do [ -f "$d/config.json" ] && models="$models $(basename "$d")"; done
for m in $models; do
  if [ "$m" = builtin ]; then MA=(); else MA=(--model "$DATA/$m"); fi
  for b in OLD NEW; do
    BIN=${!b}
    "$BIN" logits "${MA[@]}" --tokens "$TOK" --out "$OUTD/$m.$b.st" 2>"$OUTD/$m.$b.err" || echo "$m $b: logits failed"
    "$BIN" generate "${MA[@]}" --tokens 5,6,7,8,9,10 --max-tokens 40 --temperature 0 --print-ids 2>/dev/null | tail -1 >"$OUTD/$m.$b.greedy"
    "$BIN" generate "${MA[@]}" --tokens 5,6,7,8,9,10 --max-tokens 40 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 3 --print-ids 2>/dev/null | tail -1 >"$OUTD/$m.$b.sampled"
  done
  for k in st greedy sampled; do
    if [ -s "$OUTD/$m.NEW.$k" ] && cmp -s "$OUTD/$m.OLD.$k" "$OUTD/$m.NEW.$k"; then
      echo "same $m $k ($(stat -c%s "$OUTD/$m.NEW.$k") B)"
    else echo "DIFF $m $k"; fail=1; fi
  done
  # The plan's exact bytes come from the binary's own error for a budget that is too small.
  ERR=$("$NEW" generate "${MA[@]}" --tokens "$TOK" --max-tokens 30 --ctx 180 --temperature 0 --gpu-memory 1 2>&1 | tail -1)
  case "$ERR" in *"one expert slot per MoE layer"*) ;; *) continue ;; esac
  BUDGET=$(ERR="$ERR" python3 -c "
import os, re
e = os.environ['ERR']
unit = {'KiB': 1 << 10, 'MiB': 1 << 20, 'GiB': 1 << 30}
size = lambda v, u: float(v) * unit[u]
fixed = size(*re.search(r'needs ([0-9.]+) ([KMG]iB)', e).groups())
n, per = re.search(r'layer \(([0-9]+) × ([0-9.]+) ([KMG]iB)', e).group(1), re.search(r'× ([0-9.]+) ([KMG]iB)', e).groups()
print(int(fixed * 1.001 + 2.5 * int(n) * size(*per)))")
  for b in OLD NEW; do
    BIN=${!b}
    RUST_LOG=info "$BIN" generate "${MA[@]}" --tokens "$TOK" --max-tokens 30 --ctx 180 --temperature 0 --print-ids --gpu-memory "$BUDGET" 2>"$OUTD/$m.$b.off.err" | tail -1 >"$OUTD/$m.$b.off"
  done
  PLAN=$(grep -o 'routed experts [0-9]* of [0-9]*' "$OUTD/$m.NEW.off.err" | head -1)
  if [ -s "$OUTD/$m.NEW.off" ] && cmp -s "$OUTD/$m.OLD.off" "$OUTD/$m.NEW.off"; then
    echo "same $m streamed experts (--gpu-memory $BUDGET: $PLAN on the GPU)"
  else echo "DIFF $m streamed experts: $(tail -1 "$OUTD/$m.NEW.off.err")"; fail=1; fi
done
exit $fail
