. benches/h200_setup.sh
export SPARSA_EXPERT_BATCH=4
D=/tmp/m
( time $S synth --like glm-5 --layers 78 --experts 16 --format q4 --out $D ) 2>&1 | tail -3
$S serve --model $D --parallel 8 --ctx 4096 --port 8090 > $OUT/serve-server.txt 2>&1 &
pid=$!
for i in $(seq 300); do grep -q listening $OUT/serve-server.txt && break; sleep 1; done
timeout 200 python3 benches/serve_load.py http://127.0.0.1:8090 --streams 1,8 --tokens 256 > $OUT/serve.txt 2>&1
cat $OUT/serve.txt
kill -INT $pid; wait $pid
rm -rf $D
