set -u
. benches/h200_setup.sh
D=/tmp/m
$S synth --like glm-5 --layers 78 --experts 16 --format q4 --zeros --out $D > /dev/null 2>&1
B="$S bench --model $D --context 4096 --decode 16 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:1.0"
run() { name=$1; shift; echo "== $name"; timeout 100 $B "$@" > $OUT/$name.txt 2>&1; grep -E "decode at .*median|experts:|rror" $OUT/$name.txt | grep -oE "^bench: decode at.*median of [0-9]+|hit rate.*" | cut -c1-400; }
run z1-off --cpu-experts off
run z1-auto --cpu-experts auto
