set -u
. benches/h200_setup.sh
D=/tmp/m
$S synth --like glm-5 --layers 78 --experts 16 --format q4 --zeros --out $D > /dev/null 2>&1
B="$S bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB --expert-routing zipf:0 --cpu-experts on"
run() { name=$1; echo "== $name"; timeout 150 $B > $OUT/$name.txt 2>&1; grep -E "decode at .*median|host ms|experts:|rror" $OUT/$name.txt | grep -oE "^bench: decode at.*median of [0-9]+|host ms.*|stalled.*|CPU:.*" ; }
SPARSA_CPU_PREFETCH=0 run pf0
run pf2048
SPARSA_SPIN_WAIT=1 run pf2048-spin
SPARSA_CPU_PREFETCH=0 SPARSA_SPIN_WAIT=1 run pf0-spin
rm -rf $D
