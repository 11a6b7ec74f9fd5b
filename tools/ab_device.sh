#!/usr/bin/env bash
# A/B of kernel builds on one GPU, in one call of the device machine: build every variant, check
# that its outputs are the first one's bit for bit, then time them interleaved (A B A B ...) and
# print bench/compare.py's table of each variant against the first.
#
#   tools/ab_device.sh OUT NAME=SOURCE [NAME=SOURCE ...]
#
# SOURCE is a source tree (a folder; "." from the repository root), or a .diff applied to a copy
# of this repository; OUT and SOURCE are paths from the caller's directory. Environment:
# AB_ARCHS (default 90), AB_ROUNDS (default 2), AB_KV (default bf16,fp16), AB_TOKENS (default
# 64,1024,4096), AB_STEPS (default "build bitwise bench"), AB_Q (q's dtype of the bitwise
# launches for every cache, bf16 or fp16; default: fp16 with the fp16 cache, else bf16; bench
# times the models' bf16 q). Writes OUT/build_NAME.log,
# OUT/bitwise_FIRST_NAME.txt, OUT/ab_NAME_R.json and OUT/compare_FIRST_NAME.txt. Exits 2 on bad
# arguments, 1 on a failed build, save or bench run; a bitwise difference is reported and the
# timing goes on. A device call brings back only a few files: give OUT outside the call's $OUT
# and pack it there (tar) in the same command.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,17p' "$0" >&2; exit 2; }
out=$(realpath -m "$1"); shift
case "${AB_Q:-}" in
  "" | bf16 | fp16) ;;
  *) echo "ab_device: AB_Q '$AB_Q' is not bf16 or fp16" >&2; exit 2 ;;
esac
specs=()
for spec in "$@"; do
  name=${spec%%=*}
  [[ "$spec" == *=* && "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "ab_device: '$spec' is not NAME=SOURCE" >&2; exit 2; }
  src=$(realpath -m "${spec#*=}")
  [ -e "$src" ] || { echo "ab_device: $name: no such folder or diff: ${spec#*=}" >&2; exit 2; }
  specs+=("$name=$src")
done
cd "$(dirname "$0")/.."
root=$PWD
mkdir -p "$out"
work=${AB_WORK:-/tmp/ab_device}
archs=${AB_ARCHS:-90}
rounds=${AB_ROUNDS:-2}
kv=${AB_KV:-bf16,fp16}
tokens=${AB_TOKENS:-64,1024,4096}
steps=" ${AB_STEPS:-build bitwise bench} "

names=()
for spec in "${specs[@]}"; do
  name=${spec%%=*}
  src=${spec#*=}
  names+=("$name")
  [[ "$steps" == *" build "* ]] || continue
  tree=$work/src_$name
  rm -rf "$tree" "$work/lib_$name"
  mkdir -p "$tree"
  base=$root
  [ -d "$src" ] && base=$src
  (cd "$base" && tar --exclude=./.git --exclude=./build -cf - .) | (cd "$tree" && tar -xf -)
  [ -f "$src" ] && patch -s -p1 -d "$tree" < "$src"
  echo "ab_device: building $name ($src) for sm_$archs"
  start=$SECONDS
  (cd "$tree" && GLM53_ARCHS=$archs python3 -m pip install --no-build-isolation --no-deps --target "$work/lib_$name" .) \
    > "$out/build_$name.log" 2>&1 || { tail -30 "$out/build_$name.log" >&2; echo "ab_device: build of $name failed" >&2; exit 1; }
  echo "ab_device: built $name in $((SECONDS - start)) s"
done

first=${names[0]}
if [[ "$steps" == *" bitwise "* ]]; then
  for name in "${names[@]}"; do
    PYTHONPATH=$work/lib_$name python3 tools/bitwise_ab.py save "$work/bw_$name" --kv "$kv" ${AB_Q:+--q-dtype "$AB_Q"} > "$out/bitwise_save_$name.txt" 2>&1 \
      || { tail -5 "$out/bitwise_save_$name.txt" >&2; echo "ab_device: bitwise save of $name failed" >&2; exit 1; }
  done
  for name in "${names[@]:1}"; do
    python3 tools/bitwise_ab.py cmp "$work/bw_$first" "$work/bw_$name" > "$out/bitwise_${first}_$name.txt" 2>&1 || true
    echo "ab_device: bitwise $first/$name: $(tail -1 "$out/bitwise_${first}_$name.txt")"
  done
fi

if [[ "$steps" == *" bench "* ]]; then
  for r in $(seq 1 "$rounds"); do
    for name in "${names[@]}"; do
      (cd "$work" && PYTHONPATH=$work/lib_$name python3 -m vllm_sparse_mla_blackwell bench --quick --kv "$kv" --no-naive \
        --no-peers --tokens "$tokens" --json "$out/ab_${name}_$r.json" --png "$out/ab_${name}_$r.png") > "$out/bench_${name}_$r.txt" 2>&1 \
        || { tail -5 "$out/bench_${name}_$r.txt" >&2; echo "ab_device: bench of $name failed" >&2; exit 1; }
      echo "ab_device: bench $name round $r done"
    done
  done
  for name in "${names[@]:1}"; do
    python3 "$root/bench/compare.py" --a "$out"/ab_"${first}"_*.json --b "$out"/ab_"${name}"_*.json \
      | tee "$out/compare_${first}_$name.txt"
  done
fi
