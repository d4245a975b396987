#!/usr/bin/env bash
# The device runbook: one call on a GPU machine installs the wheel built here (carried in dist/),
# runs the GPU tests (one process per rank through torchrun; on one GPU the multi-rank tests run
# EP 2, 4 and 8 as ranks of one process), the demo and the benchmarks, and writes
# $OUT/summary.json with the logs. From the repository root there:
#   MOK_GIT_COMMIT=<sha> bash tools/device_run.sh [extra pytest args]
# MOK_SKIP_BENCH=1 skips the benchmarks. MOK_OVERLAY_TREE=1 puts this tree's mok/ over the
# wheel's Python (its kernels, with Python changed since it was built; the summary says so).
# $OUT gets at most 7 files (the device tool brings 8).
# The benchmark's rows land in $OUT/bench/results.jsonl; back here, append them to the committed
# table: cat <fetched>/bench/results.jsonl >> benchmarks/results.jsonl (benchmarks/README.md).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
repo=$(pwd)
out=${OUT:-/tmp/mok-device-out}
work=$(mktemp -d)
mkdir -p "$out"
shopt -s nullglob
wheels=("$repo"/dist/mok-*.whl)
[[ ${#wheels[@]} -eq 1 ]] || { echo "device_run: need exactly one dist/mok-*.whl" >&2; exit 2; }
site=/tmp/mok-site
rm -rf "$site"
python3 -m pip install --quiet --no-deps --no-index --target "$site" "${wheels[0]}" || exit 2
if [[ -n "${MOK_OVERLAY_TREE:-}" ]]; then
    cp -r "$repo/mok/." "$site/mok/"
    echo "python overlaid from the tree at $(git -C "$repo" rev-parse --short HEAD 2>/dev/null)" \
        > "$work/overlay.txt"
fi
export PYTHONPATH=$site MOK_EXPECT_INSTALLED=1 MOK_WHEEL=${wheels[0]}
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$work/gpu.txt"
cd /tmp || exit 2
python3 -P -c '
import mok, torch, mok.backends.cuda.extension as ext
print("mok", mok.__version__, "from", mok.__file__, "torch", torch.__version__)
print("archs in wheel:", ext.installed_archs(), "capability:", torch.cuda.get_device_capability())
print("loaded:", ext.module_for_device(torch.device("cuda")).build_info())
' 2>&1 | tee "$work/load.txt"

# Pass 1: every GPU test on one rank (EP=1); pass 2: the multi-GPU tests on every GPU.
pytest_args=(-c "$repo/pyproject.toml" --rootdir "$repo" --import-mode=importlib -p no:cacheprovider)
torchrun --standalone --nproc-per-node=1 -m pytest "$repo/tests/gpu" "${pytest_args[@]}" \
    -m gpu -s --junitxml="$work/gpu.xml" "$@" > "$out/gpu.log" 2>&1
tail -n 5 "$out/gpu.log"
if (( gpus >= 2 )); then
    torchrun --standalone --nproc-per-node="$gpus" -m pytest "$repo/tests/gpu" "${pytest_args[@]}" \
        -m multi_gpu -s --junitxml="$work/multi_gpu.xml" "$@" > "$out/multi_gpu.log" 2>&1
    tail -n 5 "$out/multi_gpu.log"
fi
# EP 2 and 8 as ranks on GPU 0 (mok.testing.OneDeviceGroup), and one process per GPU if several.
demo_sizes=$(printf '%s\n' 2 8 $(( gpus >= 2 ? gpus : 2 )) | sort -un)
demo_runs=0
for ep in $demo_sizes; do
    for mode in "" "--mxfp8"; do
        python3 -P "$repo/tools/demo.py" --ep "$ep" $mode 2>&1 | tee -a "$out/demo.txt" | tail -n 3
        demo_runs=$(( demo_runs + 1 ))
    done
done

if [[ -z "${MOK_SKIP_BENCH:-}" ]]; then
    mkdir -p "$out/bench"
    for ranks in $(printf '%s\n' 1 "$gpus" | sort -un); do
        torchrun --standalone --nproc-per-node="$ranks" -m mok.bench.run \
            --out "$out/bench/results.jsonl" --budget-s 1.0 --deadline-s 150 \
            >> "$out/bench.log" 2>&1
        tail -n 24 "$out/bench.log"
    done
    # N ranks on one GPU: the multi-rank machinery, labelled as such (benchmarks/README.md).
    torchrun --standalone --nproc-per-node=1 -m mok.bench.one_gpu \
        --out "$out/bench/results.jsonl" --precisions bf16 mxfp8 >> "$out/bench.log" 2>&1
    tail -n 8 "$out/bench.log"
    python3 -m mok.bench.chart "$out/bench/results.jsonl" --out "$out/bench/chart.png"
fi

python3 - "$out" "$work" "$demo_runs" "$gpus" <<'PY'
import json, pathlib, sys, xml.etree.ElementTree as ET
out, work, demo_runs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
summary = {"gpu": (work / "gpu.txt").read_text().strip().splitlines(),
           "load": (work / "load.txt").read_text().strip().splitlines()}
if (work / "overlay.txt").exists():
    summary["overlay"] = (work / "overlay.txt").read_text().strip()
for name in ("gpu", "multi_gpu"):
    path = work / f"{name}.xml"
    if name == "multi_gpu" and not path.exists() and int(sys.argv[4]) < 2:
        summary["tests_multi_gpu"] = {"not run": "one GPU: the multi-rank tests ran as ranks on it"}
        continue
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as error:  # e.g. a crash mid-write
        summary[f"tests_{name}"] = {"unreadable": str(error)}
        continue
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    summary[f"tests_{name}"] = {**counts, "failed": failed}
demo = (out / "demo.txt").read_text().splitlines()
summary["demo"] = [line for line in demo if line.startswith(("PASS", "FAIL"))]
if len(summary["demo"]) < demo_runs:  # one verdict per run; a crash prints none
    summary["demo"].append("FAIL: a demo run printed no verdict (traceback in demo.txt)")
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps({k: v for k, v in summary.items() if k != "load"}, indent=2))
PY
