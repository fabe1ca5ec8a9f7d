#!/usr/bin/env bash
# The main job on the embedded default: collect -> analyze -> sweep (the paper's §4 pipeline),
# then what-if: every method (the group gate, the trajectory gate, the loop detector, DAPO, GRESO)
# side by side on the collect's own groups, each judged by their full outcomes.
#
#   bash examples/demo.sh [OUT_DIR]            # full: 100 groups, G=8, T_max=30 (default policy)
#   DEMO_QUICK=1 bash examples/demo.sh [OUT]   # a one-minute look (collect --quick)
#   DEMO_POLICY=noisy-expert bash examples/demo.sh   # no model: the noisy planner expert acts
#   DEMO_MODEL=smollm2-alfworld bash examples/demo.sh  # the real LLM (SmolLM2-135M + our LoRA
#                                                      # adapter), at the quick size unless DEMO_FULL=1
#
# The default policy ships with the package; the generated ALFWorld games are made on first use
# (seconds) and cached in $SROLLOUT_HOME (default ~/.cache/srollout). Rerunning continues an
# interrupted collect.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/demo}"
SROLLOUT="${SROLLOUT:-.venv/bin/srollout}"
POLICY="${DEMO_POLICY:-lm}"

collect_args=(--policy "$POLICY" --out "$OUT/collect")
[ -n "${DEMO_QUICK:-}" ] && collect_args+=(--quick)
if [ -n "${DEMO_MODEL:-}" ]; then
  collect_args+=(--model "$DEMO_MODEL")
  # a real LLM is ~40x dearer per token than the shipped policy: the quick size by default
  [ -z "${DEMO_FULL:-}" ] && [ -z "${DEMO_QUICK:-}" ] && collect_args+=(--quick)
fi
if [ -f "$OUT/collect/manifest.json" ]; then
  collect_args+=(--resume)   # finished groups are kept; a complete run is only re-read
fi

"$SROLLOUT" collect "${collect_args[@]}"
"$SROLLOUT" analyze "$OUT/collect" --out "$OUT/analyze" --overwrite
"$SROLLOUT" sweep "$OUT/collect" --K 10 --out "$OUT/sweep" --overwrite
"$SROLLOUT" what-if "$OUT/collect" --K 10 --out "$OUT/what-if" --overwrite

echo
echo "Reports: $OUT/collect/report.md  $OUT/analyze/report.md  $OUT/sweep/report.md"
echo "         $OUT/what-if/report.md"
