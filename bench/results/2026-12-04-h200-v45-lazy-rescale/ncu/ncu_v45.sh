#!/bin/bash
# v45 main: ncu pipe figures (as v38's) of the fp8 WideWarps kernels after the lazy rescale, bf16 beside them; stall samples of the fp8 ones -> $OUT/ncu5.tgz
set -u
L=/tmp/n5; rm -rf $L; mkdir -p $L; date -u > $L/date.txt; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader >> $L/date.txt
s=$SECONDS; GLM53_ARCHS=90 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/lib . > $L/build.txt 2>&1 || { tail -20 $L/build.txt; exit 1; }
echo "built in $((SECONDS-s)) s"; export PYTHONPATH=/tmp/lib
m=$(grep -o "^    [a-z_0-9.]*" bench/results/2026-12-04-h200-v38-persistent/ncu/metrics_ds.txt | tr -d ' ' | grep "__" | paste -sd, -)
echo "$m" > $L/metrics_asked.txt
for spec in "DeepSeek-V3.2 128 fp8_e4m3 ds_e4m3 1" "GLM-5.3-Flash 64 fp8_ds_mla glm_ds 1" "DeepSeek-V3.2 128 fp8_ds_mla ds_ds 0" "DeepSeek-V3.2 128 bf16 ds_bf16 0"; do
  set -- $spec
  timeout 90 ncu --clock-control none -k regex:sparse_mla_fwd -c 1 --metrics "$m" \
    python3 bench/profile_shape.py --model $1 --heads $2 --kv $3 --tokens 1024 --calls 1 > $L/metrics_$4.txt 2>&1
  echo "== $1 H$2 $3"; grep -E "pct_of_peak|cycles_active|inst_executed.sum  " $L/metrics_$4.txt | grep -E "mem_shared.sum.pct|hmma|issue_active|lsu_wavefronts.sum.pct|cycles_active|shared_op_ld.sum.pct|conflicts_pipe_lsu_mem_shared.sum.pct"
  if [ "$5" = 1 ]; then
    timeout 90 ncu --clock-control none -k regex:sparse_mla_fwd -c 1 --section SourceCounters --section WarpStateStats -o $L/rep_$4 \
      python3 bench/profile_shape.py --model $1 --heads $2 --kv $3 --tokens 1024 --calls 1 > $L/ncu_run_$4.txt 2>&1
    ncu -i $L/rep_$4.ncu-rep --page source --csv --print-source sass > $L/rep_$4.csv 2>/dev/null
    python3 bench/ncu_stalls.py $L/rep_$4.csv > $L/ncu_stalls_$4.txt 2>&1
    head -25 $L/ncu_stalls_$4.txt; rm -f $L/rep_$4.csv $L/rep_$4.ncu-rep
  fi
done
date -u >> $L/date.txt; cd /tmp && tar -czf $OUT/ncu5.tgz n5
