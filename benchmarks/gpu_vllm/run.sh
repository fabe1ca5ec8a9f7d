#!/bin/bash
# On the lent GPU machine, after every part has been moved to /root/stash (see README.md here):
# install the bundle, then srollout's vLLM paths on the GPU. Output: $OUT/gpu.log and reports.
exec > >(tee "$OUT/gpu.log") 2>&1
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 )) s] $*"; }
rm -rf /tmp/site /tmp/bundle
cat /root/stash/p* | tar -x -C /tmp || { el "bundle incomplete"; ls -la /root/stash; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  /tmp/bundle/*.whl 2>&1 | grep -v "^WARNING: Target directory" | tail -3
export PYTHONPATH=/tmp/site:$PWD
# a subprocess that sets its own PYTHONPATH (srollout's tests do) still sees the bundle first
echo "import sys; sys.path.insert(0, '/tmp/site')" \
  > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/zz_bundle.pth"
export SROLLOUT_HOME=/tmp/srh TMPDIR=/tmp PYTHONUNBUFFERED=1 COLUMNS=160
el "installed"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import vllm, transformers, torch; print('vllm', vllm.__version__, '| transformers', \
transformers.__version__, '| torch', torch.__version__, '|', torch.cuda.get_device_name(0))"
# sr SECONDS ARGS...: srollout under a time limit, without vLLM's INFO lines
sr() { local t=$1; shift; timeout "$t" python3 -m srollout.cli.app "$@" 2>&1 | grep -v -E "^(INFO|WARNING|\[W)" | tail -30; }
el "1. collect --quick in process (8 groups, T_max 12)"
TIMEFORMAT="collect --quick: %R s"; time sr 150 collect --backend vllm --quick --out /tmp/runs/q
cp /tmp/runs/q/report.md "$OUT/quick-report.md" 2>/dev/null
el "2. srollout serve, then collect --quick through it"
setsid python3 -m srollout.cli.app serve --port 8011 > /tmp/serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do
  curl -sf http://127.0.0.1:8011/v1/models >/dev/null && break
  kill -0 $SP 2>/dev/null || break
  sleep 1
done
el "server answered or died (i=$i)"
TIMEFORMAT="collect --quick via server: %R s"
time sr 120 collect --backend vllm-server --base-url http://127.0.0.1:8011 --quick --out /tmp/runs/s
cp /tmp/runs/s/report.md "$OUT/server-report.md" 2>/dev/null; cp /tmp/serve.log "$OUT/serve.log"
kill -- -$SP 2>/dev/null; sleep 3
el "3. the gate through vLLM: ab-rollout --quick --repeats 2"
TIMEFORMAT="ab-rollout: %R s"; time sr 200 ab-rollout --backend vllm --quick --repeats 2 --out /tmp/runs/ab
cp /tmp/runs/ab/report.md "$OUT/ab-report.md" 2>/dev/null
el done
