set -u
xz -dc .h200/cpu_experts.xz > /tmp/ce; chmod +x /tmp/ce
lscpu | grep -E "Model name|^CPU\(s\)"
for rep in 1 2; do
for f in q4 q8; do for a in 1 0; do
  SPARSA_CPU_AVX512=$a /tmp/ce $f 16 40 2>/dev/null | sed "s/^/rep$rep avx512=$a /"
done; done; done
for a in 1 0; do RAYON_NUM_THREADS=1 SPARSA_CPU_AVX512=$a /tmp/ce q4 16 10 2>/dev/null | sed "s/^/1thread avx512=$a /"; done
for a in 1 0; do RAYON_NUM_THREADS=8 SPARSA_CPU_AVX512=$a /tmp/ce q4 16 20 2>/dev/null | sed "s/^/8threads avx512=$a /"; done
