"""What CUDA builds and GPU packs cost on this host, without a GPU (docs/gpus.md).

    python experiments/bench_cuda_build.py --out outputs/bench_cuda/readings.json

Per task (default gemm_1024, conv_l8, conv_l1) for one arch (default sm_90): the design space's
size and sketches, how many of a seeded uniform sample of --sample configs pass GPU verification
and what one check costs, then --kernels legitimate configs built into one library (one nvcc run)
with the seconds, the CUDA C and cubin sizes; finally one pack (`gpu-batch export`) of gemm_1024
with --kernels configs, its build seconds and compressed size. Each number is one reading.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tuning.hardware.cuda_compile import blob_of_library, parse_blob, parse_cuda_module
from tuning.hardware.gpu_pack import build_library
from tuning.hardware.tvm_space import TaskSchedules
from tuning.tools.run_config import compose


def workload(model: str) -> dict:
    from tuning.core.task import build_tasks

    return build_tasks(compose([f"model={model}"]).model)[0].workload


def cuda_target(arch: str) -> dict:
    """hardware=cuda's target as conf/hardware/cuda.yaml makes it (its limits), for `arch`."""
    from hydra.utils import instantiate

    return instantiate(compose(["hardware=cuda", f"hardware.arch={arch}"]).hardware).target


def one_task(model: str, target: dict, sample: int, kernels: int, folder: Path) -> dict:
    start = time.perf_counter()
    schedules = TaskSchedules(workload(model), target)
    space_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    drawn = [schedules.space.canonical(schedules.space.sample(rng)) for _ in range(sample)]
    start = time.perf_counter()
    legitimate = [c for c in drawn if schedules.space.is_legitimate(c)]
    check_s = (time.perf_counter() - start) / sample
    while len(legitimate) < kernels:
        config = schedules.space.canonical(schedules.space.sample(rng))
        if schedules.space.is_legitimate(config) and config not in legitimate:
            legitimate.append(config)
    jobs = [[f"k{i}", list(c)] for i, c in enumerate(legitimate[:kernels])]
    start = time.perf_counter()
    outcomes = build_library(workload(model), target, jobs, str(folder / f"{model}.so"))
    build_s = time.perf_counter() - start
    cuda = dict(m for m in parse_blob(blob_of_library(folder / f"{model}.so"))[2] if m[0] == "cuda")["cuda"]
    _, _, cubin = parse_cuda_module(cuda)
    return {"task": model, "space": schedules.space.size, "sketches": len(schedules.sketches), "space_s": space_s,
            "sample": sample, "legitimate": sum(1 for c in drawn if c in legitimate), "check_s": check_s,
            "kernels": kernels, "built": sum(o["error"] is None for o in outcomes), "build_s": build_s,
            "cubin_bytes": len(cubin), "library_bytes": (folder / f"{model}.so").stat().st_size}


def one_pack(arch: str, kernels: int, folder: Path) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tuning.tools.dataset", "gpu-batch", "export", "--model", "gemm_1024",
                           "--configs", str(kernels), "--out", str(folder / "packs"), f"hardware.arch={arch}"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    archive = folder / "packs" / "gemm_1024.tar.gz"
    return {"pack_kernels": kernels, "pack_s": time.perf_counter() - start, "pack_bytes": archive.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["gemm_1024", "conv_l8", "conv_l1"])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--kernels", type=int, default=32)
    parser.add_argument("--out", default="outputs/bench_cuda/readings.json")
    args = parser.parse_args()
    target = cuda_target(args.arch)
    with tempfile.TemporaryDirectory(prefix="bench-cuda-") as scratch:
        rows = [one_task(model, target, args.sample, args.kernels, Path(scratch)) for model in args.models]
        pack = one_pack(args.arch, args.kernels, Path(scratch))
    for row in rows:
        print(f"{row['task']}: space {row['space']:.2g} ({row['sketches']} sketches, {row['space_s']:.2f} s); "
              f"{row['legitimate']}/{row['sample']} legitimate, {row['check_s'] * 1e3:.1f} ms a check; "
              f"{row['built']}/{row['kernels']} built in {row['build_s']:.1f} s, cubin {row['cubin_bytes'] / 1e3:.0f} KB, "
              f"library {row['library_bytes'] / 1e3:.0f} KB")
    print(f"pack of {pack['pack_kernels']} gemm_1024 kernels: {pack['pack_s']:.0f} s, "
          f"{pack['pack_bytes'] / 2**20:.1f} MiB")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"host": platform.node(), "python": sys.version, "tasks": rows, "pack": pack,
                               "time": time.time()}, indent=1))


if __name__ == "__main__":
    main()
