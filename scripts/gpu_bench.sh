#!/usr/bin/env bash
# GPU benchmark for a machine with CUDA GPUs: environment report, then experiment=fast on one GPU with
# the device-resident tensor loader (bf16-mixed, optionally channels-last / torch.compile), printing
# time to 99% test accuracy (training time and whole process) and samples/s.
# Writes benchmarks/gpu/RESULTS.md. Usage: scripts/gpu_bench.sh [REPEATS]   (DATA_DIR must hold MNIST/raw)
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${1:-3}
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
    local dir; dir=$(mktemp -d)
    local start end
    start=$(date +%s.%N)
    "$PY" train.py experiment=fast hardware=1gpu precision=bf16-mixed logger=none "$@" hydra.run.dir="$dir" > "$dir/stdout.log" 2>&1
    end=$(date +%s.%N)
    "$PY" - "$dir/results.json" "$name" "$i" "$start" "$end" >> "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); whole = float(sys.argv[5]) - float(sys.argv[4])
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['test/acc']:.4f} | {r['fit_seconds']:.2f} | {whole:.2f} | {r['samples_per_second']:.0f} |")
PY
  done
}

variant "bf16, tensor loader on GPU"
variant "bf16, batch 512, lr 2e-2" batch.global_size=512 batch.reference_size=512 optim.lr=2e-2
variant "fp32 (TF32 matmuls)" precision=32-true

echo >> "$report"
echo "Goal: 99% test accuracy in under 0.5 s of training on one H200." >> "$report"
cat "$report"
