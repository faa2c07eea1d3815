set -u
. benches/h200_setup.sh
xz -dc .h200/ce.xz > /tmp/ce; chmod +x /tmp/ce
for t in 16 8; do echo -n "q4 t=$t: "; RAYON_NUM_THREADS=$t /tmp/ce q4 24 10 2>&1 | tail -1; done
echo -n "q4 t=16 f32: "; RAYON_NUM_THREADS=16 SPARSA_CPU_INT_DOT=0 /tmp/ce q4 24 10 2>&1 | tail -1
echo -n "q8 t=16: "; RAYON_NUM_THREADS=16 /tmp/ce q8 24 10 2>&1 | tail -1
D=/tmp/m
$S synth --like glm-5 --layers 78 --experts 16 --format q4 --zeros --out $D > /dev/null 2>&1
B="$S bench --model $D --context 4096 --decode 32 --prompt-len 0 --no-profile --gpu-memory 24GiB"
run() { name=$1; shift; echo "== $name: $*"; timeout 170 $B "$@" > $OUT/$name.txt 2>&1; grep -E "decode at .*median|host ms|experts:|CPU experts|rror" $OUT/$name.txt | cut -c1-700; }
run u-on --expert-routing zipf:0 --cpu-experts on
run u-off --expert-routing zipf:0 --cpu-experts off
run z1-auto --expert-routing zipf:1.0 --cpu-experts auto
run u-on-15t --expert-routing zipf:0 --cpu-experts on --cpu-threads 15
rm -rf $D
