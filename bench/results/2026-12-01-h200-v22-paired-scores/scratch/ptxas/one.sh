#!/bin/bash
# one.sh SRC OUT elem fmt d g arch
SRC=$1; OUT=$2; mkdir -p $OUT; n=$4_$5_$6_$7
sed -e "s/@ELEMENT@/$3/" -e "s/@FORMAT@/$4/" -e "s/@HEAD_DIM@/$5/" -e "s/@HEAD_GROUPS@/$6/" $SRC/csrc/sparse_mla/instantiations/fwd_instantiation.cu.in > $OUT/$n.cu
nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode arch=compute_$7,code=sm_$7 -I $SRC/csrc/sparse_mla -cubin -o $OUT/$n.cubin $OUT/$n.cu -Xptxas -v > $OUT/$n.ptxas 2>&1 && /tmp/pipdl/nvd/nvidia/cu13/bin/nvdisasm -c $OUT/$n.cubin | sed 's|/\*[0-9a-f]*\*/||g' > $OUT/$n.sass
echo done $n
