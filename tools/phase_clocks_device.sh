#!/usr/bin/env bash
# Phase clocks of the PingPong kernel (or the WideWarps one) in one call of the device machine:
# for each build, a copy of this repository with PC_BASE's diff (if any) and the measuring diff
# applied, built with the build's CUDA flags and without the resource check (the clocks' printf
# spills), then bench/profile_shape.py at each shape | tools/phase_clocks.py.
#
#   tools/phase_clocks_device.sh OUT NAME=FLAGS [NAME=FLAGS ...]
#
# FLAGS go to nvcc through CMAKE_CUDA_FLAGS, e.g. "plain=" "twice=-DPC_SCORES_TWICE"
# "delay=-DPC_S_DELAY=300" "kdelay=-DPC_K_DELAY=300" (the probes of
# bench/candidates/pingpong-phase-clocks.diff). OUT and the diffs are paths from the caller's
# directory. Environment: PC_DIFF (the measuring diff; default
# bench/candidates/pingpong-phase-clocks.diff, whose tables take --pingpong), PC_BASE (a kernel
# diff applied first, e.g. a candidate's; default none), PC_SHAPES (MODEL:HEADS,...; default
# DeepSeek-V3.2:128,GLM-5.3-Flash:64), PC_KV (default fp8_e4m3,fp8_ds_mla), PC_TOKENS (default
# 1024), PC_ARCHS (default 90), PC_WORK (default /tmp/phase_clocks_device). Writes
# OUT/build_NAME.log, OUT/NAME_MODEL_HEADS_KV.txt (the tables) and .raw (the kernel's lines), and
# prints each table's "all" rows. Exits 2 on bad arguments (before anything is built), 1 on a
# failed patch, build or run. A device call brings back only a few files: give OUT outside the
# call's $OUT and pack it there (tar) in the same command.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
out=$(realpath -m "$1"); shift
diff=$(realpath -m "${PC_DIFF:-$(dirname "$0")/../bench/candidates/pingpong-phase-clocks.diff}")
base=${PC_BASE:+$(realpath -m "$PC_BASE")}
cd "$(dirname "$0")/.."
work=${PC_WORK:-/tmp/phase_clocks_device}
IFS=, read -ra shapes <<< "${PC_SHAPES:-DeepSeek-V3.2:128,GLM-5.3-Flash:64}"
IFS=, read -ra kvs <<< "${PC_KV:-fp8_e4m3,fp8_ds_mla}"
[ -f "$diff" ] || { echo "phase_clocks_device: PC_DIFF: no such diff: $diff" >&2; exit 2; }
[ -z "$base" ] || [ -f "$base" ] || { echo "phase_clocks_device: PC_BASE: no such diff: $base" >&2; exit 2; }
for shape in "${shapes[@]}"; do
  [[ "$shape" =~ ^[A-Za-z0-9.-]+:[0-9]+$ ]] || { echo "phase_clocks_device: PC_SHAPES: '$shape' is not MODEL:HEADS" >&2; exit 2; }
done
pingpong=""
[[ "$(basename "$diff")" == pingpong* ]] && pingpong=--pingpong
for spec in "$@"; do
  name=${spec%%=*}
  [[ "$spec" == *=* && "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "phase_clocks_device: '$spec' is not NAME=FLAGS" >&2; exit 2; }
  [[ "${spec#*=}" != *"'"* ]] || { echo "phase_clocks_device: $name: FLAGS may not hold a single quote" >&2; exit 2; }
done

mkdir -p "$out"
for spec in "$@"; do
  name=${spec%%=*}
  flags=${spec#*=}
  tree=$work/src_$name
  lib=$work/lib_$name
  rm -rf "$tree" "$lib"
  mkdir -p "$tree"
  (tar --exclude=./.git --exclude=./build --exclude=./.e2e -cf - .) | (cd "$tree" && tar -xf -)
  [ -z "$base" ] || patch -s -p1 -d "$tree" < "$base" || { echo "phase_clocks_device: PC_BASE does not apply" >&2; exit 1; }
  patch -s -p1 -d "$tree" < "$diff" || { echo "phase_clocks_device: PC_DIFF does not apply${base:+ over PC_BASE}" >&2; exit 1; }
  echo "phase_clocks_device: building $name (${flags:-no flags}) for sm_${PC_ARCHS:-90}"
  (cd "$tree" && CMAKE_ARGS="-DSPARSE_MLA_CHECK_RESOURCES=OFF '-DCMAKE_CUDA_FLAGS=$flags'" GLM53_ARCHS=${PC_ARCHS:-90} \
    python3 -m pip install --no-build-isolation --no-deps --target "$lib" .) > "$out/build_$name.log" 2>&1 \
    || { tail -30 "$out/build_$name.log" >&2; echo "phase_clocks_device: build of $name failed" >&2; exit 1; }
  for shape in "${shapes[@]}"; do
    for kv in "${kvs[@]}"; do
      file=$out/${name}_${shape%%:*}_${shape##*:}_$kv
      PYTHONPATH=$lib python3 bench/profile_shape.py --model "${shape%%:*}" --heads "${shape##*:}" \
        --tokens "${PC_TOKENS:-1024}" --kv "$kv" --calls 1 > "$file.raw" 2>&1 \
        || { tail -5 "$file.raw" >&2; echo "phase_clocks_device: $name $shape $kv failed" >&2; exit 1; }
      python3 tools/phase_clocks.py $pingpong < "$file.raw" > "$file.txt"
      echo "== $name ${shape%%:*} H${shape##*:} $kv"
      grep -E "^│ +all|^│ +[0-9]+ │" "$file.txt" || true
    done
  done
done
