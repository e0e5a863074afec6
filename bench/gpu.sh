#!/usr/bin/env bash
# The GPU run, ready to go: every CUDA test, then the GPU rows of bench/batch.py and
# bench/resume.py on the shipped model and both realistic shapes (Qwen3-0.6B, -1.7B, random
# weights), in bf16 (batch also fp32 on the shipped model), and bench/qwen.py's side by side
# with transformers at both shapes; one JSON with everything.
#
#     bash bench/gpu.sh [OUT.json]          # default: gpu.json; at most ~8 minutes on one H200
#
# Where no GPU is, the same run on the CPU, cut to what a CPU does in a few minutes (the CUDA
# tests skip, the rows are the quick ones): it must pass, so that the script is known to work
# when a GPU is lent.  Each part's JSON is kept even when a later part fails; the exit status is
# the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-gpu.json}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
DEVICE=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
status=0
run() {  # name, command...: the command's last stdout line (its JSON) into $TMP/name.json
    local name=$1; shift
    echo "== $name: $*" >&2
    if "$@" > "$TMP/$name.out"; then
        tail -n 1 "$TMP/$name.out" > "$TMP/$name.json"
    else
        status=1
        echo "{\"failed\": true}" > "$TMP/$name.json"
        tail -n 20 "$TMP/$name.out" >&2
    fi
}

# every CUDA test (they skip where torch.cuda.is_available() is false)
if $PY -m pytest -q -p no:cacheprovider -m gpu tests/model > "$TMP/tests.out" 2>&1; then
    tests_ok=true
else
    tests_ok=false; status=1
fi
tail -n 1 "$TMP/tests.out" >&2

if [ "$DEVICE" = cuda ]; then
    run batch_shipped $PY -m bench.batch --device cuda --dtypes fp32,bf16 --sessions 1,8,32 --tasks narrative \
        --turns 1 --repeats 3
    run batch_06b $PY -m bench.batch --device cuda --preset qwen3-0.6b --dtypes bf16 --sessions 1,8,32 \
        --tasks narrative --turns 1 --repeats 2 --tokens 64
    run batch_17b $PY -m bench.batch --device cuda --preset qwen3-1.7b --dtypes bf16 --sessions 1,8,32 \
        --tasks narrative --turns 1 --repeats 2 --tokens 64
    run resume_shipped $PY -m bench.resume --device cuda --presets small --histories 256,1024 --repeats 3 --no-overhead
    run resume_realistic $PY -m bench.resume --device cuda --dtype bf16 --presets qwen3-0.6b,qwen3-1.7b \
        --histories 256,1024,2048 --repeats 3 --no-overhead
    run qwen_06b $PY bench/qwen.py --device cuda --dtypes bf16,fp32 --repeats 3
    run qwen_17b $PY bench/qwen.py --device cuda --shape qwen3-1.7b --dtypes bf16 --repeats 3
else  # the CPU: the same parts, quick
    run batch_shipped $PY -m bench.batch --dtypes fp32 --sessions 1,8 --tasks narrative --turns 1 --repeats 1 --tokens 32
    # (no realistic-shape batch row: its prompts' prefills take tens of minutes on 2 cores)
    run resume_shipped $PY -m bench.resume --presets small --histories 256 --repeats 1 --no-overhead
    run resume_realistic $PY -m bench.resume --presets qwen3-0.6b --histories 256 --repeats 1 --no-overhead --threads 2
    run qwen_06b $PY bench/qwen.py --quick --dtypes bf16 --threads 1 --prompt 64
fi

$PY - "$TMP" "$OUT" "$DEVICE" "$tests_ok" <<'EOF'
import json, sys
from pathlib import Path
tmp, out, device, tests_ok = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "true"
parts = {p.stem: json.loads(p.read_text()) for p in sorted(tmp.glob("*.json"))}
tests = (tmp / "tests.out").read_text().strip().splitlines()[-1:]
out.write_text(json.dumps({"bench": "gpu", "device": device, "cuda_tests_ok": tests_ok, "cuda_tests": tests,
                           **parts}, indent=1) + "\n")
print(f"wrote {out}: {', '.join(parts)}; CUDA tests {'passed' if tests_ok else 'FAILED'} ({' '.join(tests)})")
EOF
exit $status
