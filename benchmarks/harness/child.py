"""The process ``run_child`` starts: ``python child.py FILE FUNCTION PAYLOAD_JSON RESULT_FILE`` imports the benchmark
file, calls ``FUNCTION(payload)`` and writes its dict as JSON. Standalone: the benchmark imports ``harness`` itself."""

import importlib.util
import json
import sys
from pathlib import Path


def main(file: str, function: str, payload: str, result_file: str) -> None:
    spec = importlib.util.spec_from_file_location(Path(file).stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    result = getattr(module, function)(json.loads(payload))
    Path(result_file).write_text(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(f"usage: {sys.argv[0]} FILE FUNCTION PAYLOAD_JSON RESULT_FILE (used by harness.run_child)")
    # benchmarks/, not benchmarks/harness/: the benchmark's ``import harness`` and its siblings resolve as in its parent
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    main(*sys.argv[1:])
