#!/usr/bin/env bash
# GPU benchmark for a machine with CUDA GPUs: environment report, then experiment=fast on one GPU with
# the device-resident tensor loader (bf16-mixed, optionally channels-last / torch.compile), printing
# time to 99% test accuracy (training time and whole process) and samples/s; then the cost of a cheap
# step (plain loop, bare Lightning, the project, also with model.compile=true) in ms per step.
# Writes benchmarks/gpu/RESULTS.md. Usage: scripts/gpu_bench.sh [REPEATS] [PARTS]   (DATA_DIR must hold MNIST/raw)
# PARTS: "runs cheap graphs" (default), or some of them, so that a short lease can take them one call at a time:
# runs (experiment=fast, eager), cheap (the cheap step, eager and compiled), graphs (compiled with CUDA graphs,
# bf16 compiled, and experiment=fast compiled).
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${1:-3}
PARTS=${2:-runs cheap graphs}
has() { [[ " $PARTS " == *" $1 "* ]]; }
OUT=benchmarks/gpu
PY=${PYTHON:-python}
mkdir -p "$OUT"
report="$OUT/RESULTS.md"

{
  echo "# GPU benchmark"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "nvidia-smi not available"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'gpus', torch.cuda.device_count())"
  echo '```'
  echo
  echo "| variant | run | test/acc | fit s (training) | whole process s | samples/s |"
  echo "|---|---|---|---|---|---|"
} > "$report"

variant() {  # variant NAME OVERRIDES...
  local name=$1; shift
  for i in $(seq "$REPEATS"); do
    # The run dir is a new folder inside a temporary one: the log beside it, since a run refuses a folder that
    # holds files it did not write.
    local dir; dir=$(mktemp -d)
    local start end
    start=$(date +%s.%N)
    "$PY" train.py experiment=fast hardware=1gpu precision=bf16-mixed logger=none "$@" hydra.run.dir="$dir/run" > "$dir/stdout.log" 2>&1 \
      || { echo "| $name | $i | failed: $(tail -n 1 "$dir/stdout.log") | | | |" >> "$report"; continue; }
    end=$(date +%s.%N)
    "$PY" - "$dir/run/results.json" "$name" "$i" "$start" "$end" >> "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); whole = float(sys.argv[5]) - float(sys.argv[4])
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['test/acc']:.4f} | {r['fit_seconds']:.2f} | {whole:.2f} | {r['samples_per_second']:.0f} |")
PY
  done
}

if has runs; then
  variant "bf16, tensor loader on GPU"
  variant "bf16, batch 512, lr 2e-2" batch.global_size=512 batch.reference_size=512 optim.lr=2e-2
  variant "fp32 (TF32 matmuls)" precision=32-true
fi

cheap() {  # cheap NAME PROJECT_OVERRIDES...: ms per optimizer step of a cheap step, plain / Lightning / project
  local name=$1; shift
  if "$PY" - "$name" "$REPEATS" "$@" >> "$report" <<'PY'
import os, sys, tempfile
from pathlib import Path
sys.path.insert(0, "scripts")
from benchmark import cheap_step
name, repeats, overrides = sys.argv[1], int(sys.argv[2]), tuple(sys.argv[3:])
r = cheap_step(os.environ.get("DATA_DIR", "data"), (100, 800), repeats, Path(tempfile.mkdtemp()), False, "gpu", overrides)
ms = {k: r[f"{k}_ms_per_step"]["median"] for k in ("plain", "lightning", "project")}
print(f"| {name} | {ms['plain']:.3f} | {ms['lightning']:.3f} | {ms['project']:.3f} | {r['project_vs_lightning']:.2f} |")
PY
  then :; else echo "| $name | failed (see the log) | | | |" >> "$report"; fi
}

if has cheap || has graphs; then
  {
    echo
    echo "Cheap step (MLP 784-128-256-10, batch 64, Adam, data on the GPU; ms per optimizer step, steps 100 to 800"
    echo "of one run inside epoch 0, median of $REPEATS):"
    echo
    echo "| variant | plain loop | bare Lightning | project | project / Lightning |"
    echo "|---|---|---|---|---|"
  } >> "$report"
fi
if has cheap; then
  cheap "fp32"
  cheap "fp32, project with model.compile=true" model.compile=true
fi
if has graphs; then
  cheap "fp32, project with model.compile=true, compile_mode=reduce-overhead" model.compile=true model.compile_mode=reduce-overhead
  cheap "bf16-mixed project, model.compile=true" precision=bf16-mixed model.compile=true
  # experiment=fast with a compiled network: compile time counts in the whole process, not in samples/s.
  {
    echo
    echo "| variant | run | test/acc | fit s (training) | whole process s | samples/s |"
    echo "|---|---|---|---|---|---|"
  } >> "$report"
  variant "bf16, tensor loader on GPU, model.compile=true" model.compile=true
  variant "bf16, model.compile=true, compile_mode=reduce-overhead" model.compile=true model.compile_mode=reduce-overhead
fi

echo >> "$report"
echo "Goal: 99% test accuracy in under 0.5 s of training on one H200; the project's cheap step within 1.15x of bare Lightning." >> "$report"
cat "$report"
