. benches/h200_setup.sh
xz -dc .h200/gemv_shapes.xz > /tmp/g; chmod +x /tmp/g
/tmp/g q4 20 1,2,4,8 > $OUT/int.txt 2>&1; grep -E "copy|: all" $OUT/int.txt
SPARSA_GEMV_XQ=1 /tmp/g q4 20 1 > $OUT/int-xq1.txt 2>&1; grep -E ": all" $OUT/int-xq1.txt
SPARSA_ROWS_UNROLL=1 /tmp/g q4 20 8 > $OUT/int-u1.txt 2>&1; grep -E ": all" $OUT/int-u1.txt
