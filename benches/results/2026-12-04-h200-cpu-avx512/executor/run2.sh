set -u
xz -dc .h200/cpu_experts.xz > /tmp/ce; chmod +x /tmp/ce
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
grep -i huge /proc/meminfo | head -3
for rep in 1 2; do
for b in heap file anon thp; do for a in 1 0; do
  SPARSA_CE_BACKING=$b SPARSA_CPU_AVX512=$a /tmp/ce q4 16 60 2>/dev/null | sed "s/^/rep$rep avx512=$a /"
done; done; done
for b in file thp; do SPARSA_CE_BACKING=$b /tmp/ce q8 16 40 2>/dev/null | sed "s/^/q8 /"; done
