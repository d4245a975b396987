"""`mok` on the command line (the wheel's console script).

    mok info      what this installation is and what serves this machine
    mok bench     mok against the standard path (NCCL + torch._grouped_mm) here: table and chart
    mok tune      sweep MoKConfig's knobs for one layer's sizes; write the fastest config

`mok bench` and `mok tune` run in one process (EP 1, or `mok tune --ep N` ranks on one GPU) or
under torchrun (`torchrun --nproc-per-node=N -m mok.cli bench`, one GPU per rank); their
progress bar and charts use tqdm and matplotlib (`pip install 'mok[cli]'`), and without them
they print a line per step and skip the chart.

`mok info` prints the package and torch versions, the architectures the installed extension
modules were built for with their compiler and commit, every visible CUDA device with the module
that serves it (or why none does), and the process-wide settings; `--json` prints the same as one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import mok
from mok import settings
from mok.backends.cuda import extension
from mok.bench import run, tune


def build_facts() -> list[dict]:
    """The build facts of every installed extension module (one per architecture); a module
    that cannot load here says why."""
    facts = []
    for arch in extension.installed_archs():
        try:
            facts.append(dict(extension.load_arch(arch).build_info()))
        except ImportError as error:
            facts.append({"arch": arch, "error": str(error)})
    return facts


def device_facts() -> list[dict]:
    """Every visible CUDA device: name, compute capability, SM count, memory and which module
    serves it (None with the reason when none does)."""
    devices = []
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(index)
        capability = (props.major, props.minor)
        try:
            served = extension.module_for_capability(capability, props.name).build_info()["arch"]
            reason = None
        except (ImportError, NotImplementedError) as error:
            served, reason = None, str(error)
        devices.append({
            "index": index, "name": props.name, "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count, "memory_gib": round(props.total_memory / 2**30, 1),
            "module": served, "reason": reason,
        })  # fmt: skip
    return devices


def info() -> dict:
    """Everything `mok info` reports, as one dict."""
    return {
        "mok": mok.__version__,
        "package": mok.__file__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "modules": build_facts(),
        "devices": device_facts(),
        "settings": {
            "MOK_BACKEND": settings.backend(),
            "MOK_COMM_TIMEOUT_S": settings.comm_timeout_ns() / 1e9,
            "MOK_DEBUG": settings.debug(),
        },
    }


def _print_info(facts: dict) -> None:
    print(f"mok {facts['mok']} ({facts['package']})")
    print(f"torch {facts['torch']}, CUDA {facts['torch_cuda'] or 'none (CPU build)'}")
    if not facts["modules"]:
        print("extension: none installed (a source tree without a build): reference backend only")
    for module in facts["modules"]:
        if "error" in module:
            print(f"extension {module['arch']}: cannot load here: {module['error']}")
            continue
        print(f"extension {module['arch']}: nvcc {module['nvcc_version']}, CUDA runtime "
              f"{module['cuda_version']}, {module['host_compiler']}, commit "
              f"{module['git_commit']}")  # fmt: skip
    if not facts["devices"]:
        print("devices: no CUDA device visible: the reference backend (PyTorch) serves every op")
    for d in facts["devices"]:
        serves = f"mok's {d['module']} kernels" if d["module"] else f"the reference ({d['reason']})"
        print(f"cuda:{d['index']} {d['name']} (sm {d['capability']}, {d['sms']} SMs, "
              f"{d['memory_gib']} GiB): {serves}")  # fmt: skip
    print("settings: " + ", ".join(f"{k}={v}" for k, v in facts["settings"].items()))


def bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`mok bench`: mok.bench.run with its rows and chart in ./mok-bench/ by default."""
    args.out = args.out or Path("mok-bench") / "results.jsonl"
    if args.chart is None and not args.no_chart:
        args.chart = args.out.with_name("chart.png")
    return run.measure_all(run.resolve(parser, args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mok", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", metavar="command")
    info_parser = commands.add_parser("info", help="what this installation is and what serves it")
    info_parser.add_argument("--json", action="store_true", help="one JSON object instead")
    bench_parser = commands.add_parser("bench", help="mok against the standard path, here")
    run.add_arguments(bench_parser, out_required=False)
    bench_parser.add_argument("--no-chart", action="store_true", help="leave the chart out")
    tune_parser = commands.add_parser("tune", help="the fastest MoKConfig for one layer's sizes")
    tune.add_arguments(tune_parser)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "bench":
        return bench(bench_parser, args)
    if args.command == "tune":
        try:
            return tune.tune(args)
        except ValueError as error:  # sizes mok does not take (they name mok's argument)
            tune_parser.error(str(error))
    facts = info()
    if args.json:
        json.dump(facts, sys.stdout, indent=2)
        print()
    else:
        _print_info(facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
