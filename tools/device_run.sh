#!/usr/bin/env bash
# The device runbook: one call on a GPU machine installs the wheel built here (carried in dist/),
# runs the GPU tests (one process per rank through torchrun) and the demo on every GPU, and writes
# $OUT/summary.json plus the logs. Usage there, from the repository root:
#   bash tools/device_run.sh [extra pytest args]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
repo=$(pwd)
out=${OUT:-/tmp/mok-device-out}
mkdir -p "$out"
shopt -s nullglob
wheels=("$repo"/dist/mok-*.whl)
[[ ${#wheels[@]} -eq 1 ]] || { echo "device_run: need exactly one dist/mok-*.whl" >&2; exit 2; }
site=/tmp/mok-site
rm -rf "$site"
python3 -m pip install --quiet --no-deps --no-index --target "$site" "${wheels[0]}" || exit 2
export PYTHONPATH=$site MOK_EXPECT_INSTALLED=1 MOK_WHEEL=${wheels[0]}
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt"
cd /tmp || exit 2
python3 -P -c '
import mok, torch, mok._extension as ext
print("mok", mok.__version__, "from", mok.__file__, "torch", torch.__version__)
print("archs in wheel:", ext.installed_archs(), "device capability:", torch.cuda.get_device_capability())
print("loaded:", ext.module_for_device(torch.device("cuda")).build_info())
' 2>&1 | tee "$out/load.txt"

pytest_args=(-c "$repo/pyproject.toml" --rootdir "$repo" --import-mode=importlib -p no:cacheprovider)
torchrun --standalone --nproc-per-node=1 -m pytest "$repo/tests" "${pytest_args[@]}" \
    -m "gpu and not multi_gpu" -s --junitxml="$out/gpu.xml" "$@" 2>&1 | tee "$out/gpu.log" | tail -n 40
if (( gpus >= 2 )); then
    torchrun --standalone --nproc-per-node="$gpus" -m pytest "$repo/tests" "${pytest_args[@]}" \
        -m multi_gpu --junitxml="$out/multi_gpu.xml" "$@" 2>&1 | tee "$out/multi_gpu.log" | tail -n 30
fi
for mode in "" "--mxfp8"; do
    python3 -P "$repo/tools/demo.py" --ep "$gpus" $mode 2>&1 | tee -a "$out/demo.txt" | tail -n 6
done

python3 - "$out" <<'PY'
import json, pathlib, sys, xml.etree.ElementTree as ET
out = pathlib.Path(sys.argv[1])
summary = {"gpu": (out / "gpu.txt").read_text().strip().splitlines()}
for name in ("gpu", "multi_gpu"):
    path = out / f"{name}.xml"
    if path.exists():
        root = ET.parse(path).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        summary[name] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
summary["demo"] = [l for l in (out / "demo.txt").read_text().splitlines() if l.startswith(("PASS", "FAIL"))]
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
PY
