#!/bin/bash
# Run prebuilt fuzz binaries (fuzz/bin/<target>, copied from fuzz/target/*/release) side by
# side on a many-core machine, from the repository root:
#     fuzz/scripts/parallel.sh SECONDS target:PROCESSES ...
# Each process is an independent libFuzzer run (its own seed and corpus copy) with the same
# flags as run.sh, bounded by -max_total_time; logs go to $OUT (default fuzz/logs/parallel).
# Process i of a target uses -seed=SEED_BASE+i (SEED_BASE defaults to 0): give a later call a
# new SEED_BASE so it does not replay an earlier call's runs.
set -u
secs=$1
shift
out=${OUT:-fuzz/logs/parallel}
mkdir -p "$out"
work=$(mktemp -d)
for spec in "$@"; do
  t=${spec%%:*}
  n=${spec##*:}
  case $t in
    safetensors|quant_meta) dict=safetensors; len=4096 ;;
    chat_template) dict=chat_template; len=4096 ;;
    config) dict=json; len=8192 ;;
    *) dict=json; len=4096 ;;
  esac
  for i in $(seq 1 "$n"); do
    mkdir -p "$work/$t-$i"
    cp fuzz/corpus/"$t"/* "$work/$t-$i/"
    ${BIN:-fuzz/bin}/"$t" "$work/$t-$i" -seed="$((${SEED_BASE:-0} + i))" -max_len=$len -rss_limit_mb=2048 -timeout=10 \
      -dict=fuzz/dicts/$dict.dict -print_final_stats=1 -max_total_time="$secs" \
      -artifact_prefix="$out/$t-$i-" > "$out/$t-$i.log" 2>&1 &
  done
done
wait
for f in "$out"/*.log; do
  echo "$(basename "$f" .log) $(grep -o 'stat::number_of_executed_units: [0-9]*' "$f" | grep -o '[0-9]*$') execs, $(grep -o 'stat::average_exec_per_sec: [0-9]*' "$f" | grep -o '[0-9]*$')/s, $(grep -c 'ERROR\|deadly signal' "$f") errors"
done
