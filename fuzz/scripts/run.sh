#!/bin/sh
# Run one fuzz target the way fuzz/README.md records it, from the repository root:
#     fuzz/scripts/run.sh <target> [runs] [extra libFuzzer flags...]
# The fuzzer grows its corpus in fuzz/corpus-run/<target>/ (git-ignored), seeded from the
# committed fuzz/corpus/<target>/. Final stats go to fuzz/logs/<target>.log (git-ignored).
set -u
t=$1
runs=${2:-10000000}
shift; [ $# -gt 0 ] && shift
case $t in
  safetensors|quant_meta) dict=safetensors; len=4096 ;;
  chat_template) dict=chat_template; len=4096 ;;
  config) dict=json; len=8192 ;;
  tokenizer) dict=json; len=4096 ;;
  *) dict=json; len=4096 ;;
esac
mkdir -p fuzz/corpus-run/$t fuzz/logs
cd fuzz
nice -n 10 cargo +nightly fuzz run -O --debug-assertions "$t" corpus-run/"$t" corpus/"$t" -- \
  -runs="$runs" -max_len=$len -rss_limit_mb=2048 -timeout=10 \
  -dict=dicts/$dict.dict -print_final_stats=1 "$@" > logs/"$t".log 2>&1
status=$?
tail -n 25 logs/"$t".log
exit $status
