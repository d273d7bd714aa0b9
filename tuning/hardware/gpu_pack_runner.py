"""Time a GPU batch pack's kernels where only TVM's runtime is installed (the pack's run_pack.py).

A pack (`tunelab dataset gpu-batch export`; docs/gpus.md) holds kernels built on another host into
shared libraries (several kernels a library), each task's output check, the drift gauge kernel, TVM's
runtime libraries and this script. On the device's host it needs Python with numpy, tvm_ffi (the
pack carries it for the Python it was made for) and, for CUDA, the driver and libcudart (the pack's
copy, else $CUDA_HOME, /usr/local/cuda or a pip `nvidia-cuda-runtime` wheel, e.g. torch's):

    python run_pack.py                      # every kernel, readings into readings.jsonl beside it
    python run_pack.py --device 1 --out /data/readings.jsonl

For each kernel it checks the output (on inputs made by `pack_input`, the same wherever numpy runs)
against the untuned kernel's, computed where the pack was built (`output_matches`: a fixed sample
of output positions with the lab's tolerances, and the output's sum), then times it with the pack's evaluator settings (TVM's
time_evaluator: `number` runs a cost, `repeat` costs, each >= `min_repeat_ms`, fewer runs when the
measurement would outlast `timeout_s`), and reads the drift gauge once every library. Every reading
is one JSON line, written as it is taken, with the device's fingerprint (name, compute version,
clock, multiprocessors, driver); running the same command again skips what readings.jsonl holds,
so a killed run resumes. A worker process does the timing; a kernel that hangs it (no answer within
timeout_s + 30 s) or crashes it is a `device_hang` / `run` reading and the worker is started again;
a CUDA error (a failed launch, too many resources) is a reading of its kind, after which the worker
is restarted too (a CUDA context is unusable after most errors).

This file imports only the standard library, numpy and tvm_ffi: the lab imports it too, for
`gpu_error_kind` and the reading rules, so both sides read errors and evaluator settings alike.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import queue
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

# Error kinds of a GPU's failures (the lab's ERROR_KINDS), from the CUDA driver's messages.
GPU_ERRORS = (
    ("out_of_resources", ("OUT_OF_RESOURCES", "too many resources requested", "invalid configuration argument",
                          "INVALID_VALUE")),
    ("device_hang", ("LAUNCH_TIMEOUT", "the launch timed out")),
    ("launch_failed", ("LAUNCH_FAILED", "unspecified launch failure", "illegal memory access", "ILLEGAL_ADDRESS",
                       "misaligned address", "MISALIGNED_ADDRESS", "illegal instruction", "ILLEGAL_INSTRUCTION",
                       "CUDA_ERROR", "CUDA:")),
)
GAUGE_NAME = "gauge"
RTOL, ATOL = 1e-3, 1e-3  # the lab's output check (tvm_worker.check_and_time): atol scales with max |expected|
SUM_RTOL = 1e-4  # the whole output's sum, relative to the sum of its magnitudes
CHECK_POINTS = 16384  # output elements a pack checks one by one (a fixed, seeded sample)
# The drift gauge's reading: the median of GAUGE_RUNS["repeat"] costs of >= min_repeat_ms each, on every
# device alike (tvm_worker.gauge_timer reads it so too), so that readings compare
GAUGE_RUNS = {"number": 1, "repeat": 3, "min_repeat_ms": 20}


def gpu_error_kind(message: str) -> str | None:
    """"out_of_resources", "device_hang" or "launch_failed" for a CUDA failure's message; None
    when it is not one (then it is an ordinary `run` error)."""
    for kind, needles in GPU_ERRORS:
        if any(needle.lower() in message.lower() for needle in needles):
            return kind
    return None


def runs_within(number: int, repeat: int, min_repeat_ms: float, timeout_s: float, single: float):
    """(number, repeat) so that a kernel whose one run took `single` s is timed within timeout_s:
    as given when that fits, else fewer runs a cost, then fewer costs; None when not even one cost
    fits. The lab's rule (`slow_kernels: fewer_runs`; tvm_worker.fit_to_timeout applies it)."""
    floor_s, budget = min_repeat_ms / 1000, timeout_s - single
    number = max(number, 1)
    if repeat * max(single * number, floor_s) <= budget:
        return number, repeat
    number = max(1, min(number, int(budget // (repeat * single)) if single > 0 else number))
    repeat = min(repeat, int(budget // max(single * number, floor_s)))
    return (number, repeat) if repeat >= 1 else None


def pack_input(shape, dtype: str, number: int):
    """The pack's input `number`: values in [-1, 1) from a multiplicative hash of each element's
    index, the same wherever numpy runs (a pack carries no input arrays: a 1024^2 one is 4 MiB that
    does not compress)."""
    import numpy as np

    count = int(np.prod(shape, dtype=np.int64))
    index = np.arange(count, dtype=np.uint64) + np.uint64(number * 1_000_003)
    hashed = (index * np.uint64(2654435761) + np.uint64(12345)) % np.uint64(2**32)
    return (hashed.astype(np.float64) / 2**31 - 1.0).astype(dtype).reshape(shape)


def check_points(size: int):
    """The flat output positions a pack checks: all of a small output, else a fixed sample."""
    import numpy as np

    if size <= CHECK_POINTS:
        return np.arange(size, dtype=np.int64)
    return np.unique(np.random.default_rng(0).integers(0, size, CHECK_POINTS, dtype=np.int64))


def output_matches(out, check: dict) -> bool:
    """`out` against a task's check: its sampled positions one by one (the lab's tolerances) and
    its sum (relative to the sum of magnitudes)."""
    import numpy as np

    flat = out.reshape(-1).astype(np.float64)
    expected = check["values"].astype(np.float64)
    scale = max(1.0, float(check["scale"]))
    if not np.allclose(flat[check["indices"]], expected, rtol=RTOL, atol=ATOL * scale):
        return False
    return abs(float(flat.sum()) - float(check["sum"])) <= SUM_RTOL * max(1.0, float(check["abs_sum"]))


# ---- the TVM runtime, without TVM ------------------------------------------------------------------
class Runtime:
    """TVM's runtime through tvm_ffi: libraries loaded, tensors made and timed."""

    def __init__(self, pack: Path, kind: str, index: int):
        import tvm_ffi

        self.ffi = tvm_ffi
        load_runtime(pack, kind)
        self.kind, self.index = kind, index
        self.device = tvm_ffi.device(kind, index)
        self.alloc = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")
        self.copy_from = tvm_ffi.get_global_func("runtime.TVMTensorCopyFromBytes")
        self.copy_to = tvm_ffi.get_global_func("runtime.TVMTensorCopyToBytes")
        self.evaluator = tvm_ffi.get_global_func("runtime.RPCTimeEvaluator")
        self.attr = tvm_ffi.get_global_func("runtime.GetDeviceAttr")

    def tensor(self, array):
        import numpy as np

        array = np.ascontiguousarray(array)
        out = self.alloc(self.ffi.Shape(list(array.shape)), self.ffi.dtype(str(array.dtype)), self.device, None)
        self.copy_from(out, array.ctypes.data_as(ctypes.c_void_p), array.nbytes)
        return out

    def numpy(self, tensor, shape, dtype):
        import numpy as np

        out = np.empty(shape, dtype=dtype)
        self.copy_to(tensor, out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
        return out

    def sync(self) -> None:
        if self.kind != "cpu":
            self.ffi.get_global_func("runtime.Device_StreamSync")(self.device, 0)

    def time(self, module, name: str, tensors, number: int, repeat: int, min_repeat_ms: float) -> list[float]:
        feval = self.evaluator(module, name, self.device.dlpack_device_type(), self.index, number, repeat,
                               int(min_repeat_ms), 100, 0, 1, 0, "")
        return list(struct.unpack("@" + "d" * repeat, feval(*tensors)))

    def fingerprint(self) -> dict:
        """What the device says of itself (TVM's device attributes), and this host's CPU."""
        names = {"name": 5, "compute_version": 4, "max_clock_rate_khz": 6, "multi_processors": 7,
                 "driver_version": 12, "max_shared_memory_per_block": 3, "max_threads_per_block": 1,
                 "warp_size": 2, "l2_cache_bytes": 13, "total_global_memory": 14}
        found = {}
        for key, attr in names.items():
            try:
                value = self.attr(self.device.dlpack_device_type(), self.index, attr)
            except Exception:  # noqa: BLE001 - an attribute the device does not report
                continue
            if value is not None:
                found[key] = value if isinstance(value, (int, float, str)) else str(value)
        found.setdefault("name", cpu_name() if self.kind == "cpu" else f"{self.kind}:{self.index}")
        return {"kind": self.kind, **found}


def cpu_name() -> str:
    """This machine's CPU model from /proc/cpuinfo ("unknown" without one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def load_runtime(pack: Path, kind: str) -> None:
    """TVM's runtime libraries from the pack (RTLD_GLOBAL, after tvm_ffi), and for CUDA libcudart
    first, so libtvm_runtime_cuda.so finds it whatever LD_LIBRARY_PATH says."""
    import tvm_ffi  # noqa: F401 - loads libtvm_ffi.so, which the runtime links

    ctypes.CDLL(str(pack / "lib" / "libtvm_runtime.so"), ctypes.RTLD_GLOBAL)
    if kind == "cuda":
        cudart = find_cudart(pack)
        if cudart is None:
            raise RuntimeError("libcudart.so.13 not found: not in the pack's lib/, $CUDA_HOME/lib64, /usr/local/cuda/lib64, "
                               "LD_LIBRARY_PATH or a pip nvidia-cuda-runtime wheel; pass --cudart PATH")
        ctypes.CDLL(cudart, ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(pack / "lib" / "libtvm_runtime_cuda.so"), ctypes.RTLD_GLOBAL)


def find_cudart(pack: Path | None = None) -> str | None:
    """libcudart.so.13: $TUNELAB_CUDART (--cudart), else the first found in the pack's lib/,
    $CUDA_HOME/lib64, /usr/local/cuda/lib64, LD_LIBRARY_PATH, or a pip nvidia-cuda-runtime wheel."""
    explicit = os.environ.get("TUNELAB_CUDART")
    if explicit:
        return explicit
    places = [str(pack / "lib")] if pack else []
    places += [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64"), "/usr/local/cuda/lib64",
               *os.environ.get("LD_LIBRARY_PATH", "").split(":")]
    places += [os.path.join(p, "nvidia", sub, "lib") for p in sys.path for sub in ("cu13", "cuda_runtime")]
    for place in places:
        for found in sorted(glob.glob(os.path.join(place, "libcudart.so.13*"))) if place else []:
            return found
    return None


# ---- the worker: one library at a time --------------------------------------------------------------
def serve(pack: Path, kind: str, index: int) -> None:
    """Read library jobs (JSON lines) on stdin; write one JSON line per kernel, then {"done": lib}."""
    manifest = json.loads((pack / "manifest.json").read_text())
    runtime = Runtime(pack, kind, index)
    arrays: dict = {}
    gauge = Gauge(runtime, pack, manifest) if manifest.get("gauge") else None
    say({"fingerprint": runtime.fingerprint()})
    for line in sys.stdin:
        job = json.loads(line)
        library = manifest["libraries"][job["library"]]
        gauge_s = gauge.read() if gauge else None
        kernels = [k for k in library["kernels"] if k["name"] not in job["skip"]]
        try:
            module = runtime.ffi.load_module(str(pack / library["file"]))
        except Exception as error:  # noqa: BLE001 - e.g. a cubin for another arch: each kernel's reading
            message = f"{library['file']} did not load: {type(error).__name__}: {error}"[-2000:]
            for kernel in kernels:
                say({"kernel": kernel["name"], "gauge_s": gauge_s, "error": gpu_error_kind(message) or "run",
                     "message": message, "run_s": 0.0})
            say({"done": job["library"]})
            continue
        for kernel in kernels:
            if kernel["task"] not in arrays:
                arrays[kernel["task"]] = task_arrays(pack, manifest["tasks"][kernel["task"]])
            say({"kernel": kernel["name"], "gauge_s": gauge_s,
                 **measure(runtime, module, kernel, arrays[kernel["task"]], manifest["evaluator"])})
        say({"done": job["library"]})


def task_arrays(pack: Path, task: dict) -> dict:
    """A task's inputs (pack_input), its output's shape and dtype, and its check."""
    import numpy as np

    *inputs, output = task["args"]
    with np.load(pack / task["check"]) as saved:
        check = {key: saved[key] for key in ("indices", "values", "scale", "sum", "abs_sum")}
    return {"inputs": [pack_input(shape, dtype, i) for i, (shape, dtype) in enumerate(inputs)],
            "output": output, "check": check}


def say(line: dict) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def measure(runtime: Runtime, module, kernel: dict, arrays: dict, evaluator: dict) -> dict:
    """Check one kernel's output (output_matches), then time it."""
    import numpy as np

    start = time.perf_counter()
    inputs, (out_shape, out_dtype) = arrays["inputs"], arrays["output"]
    checked = [list(a.shape) for a in inputs] + [list(out_shape)] == [shape for shape, _ in kernel["args"]]
    if checked:
        tensors = [runtime.tensor(a) for a in inputs] + [runtime.tensor(np.zeros(out_shape, dtype=out_dtype))]
    else:  # the schedule re-laid-out a weight: timed on seeded uniform(-1, 1) inputs, not checked (as the
        rng = np.random.default_rng(0)  # lab does: zeros can run many times faster than real data)
        tensors = [runtime.tensor(rng.uniform(-1, 1, size=shape).astype(dtype)) for shape, dtype in kernel["args"][:-1]]
        tensors.append(runtime.tensor(np.zeros(kernel["args"][-1][0], dtype=kernel["args"][-1][1])))
    try:
        function = module[kernel["name"]]
        single = time.perf_counter()
        function(*tensors)
        runtime.sync()
        single = time.perf_counter() - single
        if evaluator["check_correctness"] and checked:
            if not output_matches(runtime.numpy(tensors[-1], out_shape, out_dtype), arrays["check"]):
                return {"error": "wrong_answer", "message": "output differs from the untuned kernel",
                        "run_s": time.perf_counter() - start}
        fitted = runs_within(evaluator["number"], evaluator["repeat"], evaluator["min_repeat_ms"],
                             evaluator["timeout_s"], single)
        if fitted is None:
            return {"error": "timeout", "message": f"one run took {single:.3f} s; the measurement would exceed "
                    f"timeout_s={evaluator['timeout_s']}", "run_s": time.perf_counter() - start}
        costs = runtime.time(module, kernel["name"], tensors, fitted[0], fitted[1], evaluator["min_repeat_ms"])
        note = "" if fitted == (evaluator["number"], evaluator["repeat"]) else \
            f"fewer_runs: {fitted[0]} run(s) x {fitted[1]} cost(s), one run {single:.3f} s"
        return {"error": None, "costs": costs, "message": note, "run_s": time.perf_counter() - start}
    except Exception as error:  # noqa: BLE001 - a failure is a reading; a CUDA one ends the worker
        message = f"{type(error).__name__}: {error}"[-2000:]
        kind = gpu_error_kind(message) if runtime.kind != "cpu" else None
        return {"error": kind or "run", "message": message, "run_s": time.perf_counter() - start,
                "restart": kind is not None}


class Gauge:
    """The drift gauge kernel (the lab's: a 128^3 GEMM) read as the lab reads it: the median of 3
    costs of >= 20 ms each."""

    def __init__(self, runtime: Runtime, pack: Path, manifest: dict):
        import numpy as np

        gauge = manifest["gauge"]
        self.runtime = runtime
        self.module = runtime.ffi.load_module(str(pack / gauge["file"]))
        self.tensors = [runtime.tensor(np.ones(shape, dtype=dtype)) for shape, dtype in gauge["args"]]

    def read(self) -> float | None:
        import statistics

        try:
            return statistics.median(self.runtime.time(self.module, GAUGE_NAME, self.tensors, GAUGE_RUNS["number"],
                                                       GAUGE_RUNS["repeat"], GAUGE_RUNS["min_repeat_ms"]))
        except Exception:  # noqa: BLE001 - a gauge that cannot run leaves the readings without it
            return None


# ---- the driver: jobs to a worker, readings to a file -----------------------------------------------
class Driver:
    def __init__(self, pack: Path, device: str, out: Path, worker_timeout_s: float):
        self.pack, self.out = pack, out
        self.kind, _, index = device.partition(":")
        self.index = int(index or 0)
        self.manifest = json.loads((pack / "manifest.json").read_text())
        self.timeout_s = worker_timeout_s
        self.process = None
        self.fingerprint: dict | None = None

    def done(self) -> set:
        """Kernels readings.jsonl holds a reading of (a killed run's last line may be torn)."""
        held = set()
        if self.out.is_file():
            for line in self.out.read_text().splitlines():
                try:
                    held.add(json.loads(line)["kernel"])
                except (ValueError, KeyError, TypeError):
                    continue
        return held

    def start(self) -> None:
        script = Path(__file__).resolve()
        self.process = subprocess.Popen([sys.executable, str(script), "--serve", "--pack", str(self.pack),
                                         "--device", f"{self.kind}:{self.index}"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.process.stdout, self.lines), daemon=True).start()
        first = self.read_line(300)
        if not first or "fingerprint" not in first:
            raise SystemExit(f"run_pack: the worker did not start on {self.kind}:{self.index} "
                             f"({self.stop() or 'no answer'})")
        self.fingerprint = first["fingerprint"]

    @staticmethod
    def _pump(stream, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line)
        lines.put("")  # the worker ended

    def read_line(self, timeout_s: float) -> dict | None:
        """The worker's next line; None when it ended or said nothing for timeout_s."""
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            return None
        try:
            return json.loads(line) if line else None
        except ValueError:  # a torn line of a dying worker
            return None

    def stop(self) -> str:
        if self.process is None:
            return ""
        self.process.kill()
        code = self.process.wait()
        self.process = None
        return f"worker exit code {code}"

    def run(self) -> int:
        """Every kernel readings.jsonl lacks, timed; returns how many were."""
        held, timed = self.done(), 0
        torn = self.out.is_file() and self.out.stat().st_size and not self.out.read_bytes().endswith(b"\n")
        with self.out.open("a") as out:
            if torn:  # a killed run's last line: left as it is, unread, on a line of its own
                out.write("\n")
            for number, library in enumerate(self.manifest["libraries"]):
                todo = [k["name"] for k in library["kernels"] if k["name"] not in held]
                while todo:
                    timed += self.run_library(number, library, todo, held, out)
                    todo = [k["name"] for k in library["kernels"] if k["name"] not in held]
        self.stop()
        return timed

    def run_library(self, number: int, library: dict, todo: list, held: set, out) -> int:
        if self.process is None:
            self.start()
        skip = [k["name"] for k in library["kernels"] if k["name"] in held]
        self.process.stdin.write(json.dumps({"library": number, "skip": skip}) + "\n")
        self.process.stdin.flush()
        timed, waiting = 0, list(todo)
        while waiting:
            line = self.read_line(self.manifest["evaluator"]["timeout_s"] + self.timeout_s)
            if line is None or "kernel" not in line:
                hung = line is None and self.process.poll() is None
                why = self.stop()
                kind = "device_hang" if hung and self.kind != "cpu" else ("timeout" if hung else "run")
                self.write(out, held, {"kernel": waiting[0], "error": kind, "gauge_s": None, "run_s": 0.0,
                                       "message": f"the timing worker {'hung' if hung else 'died'} ({why})"})
                return timed + 1
            if line["kernel"] not in waiting:  # not asked for: nothing to write down
                continue
            restart = line.pop("restart", False)
            self.write(out, held, line)
            waiting.remove(line["kernel"])
            timed += 1
            if restart:
                self.stop()
                return timed
        done = self.read_line(60)
        if not done or done.get("done") != number:
            self.stop()
        return timed

    def write(self, out, held: set, reading: dict) -> None:
        reading = {**reading, "device": self.fingerprint or {}, "measured_at": time.time(), "pack": self.manifest["id"]}
        out.write(json.dumps(reading) + "\n")
        out.flush()
        held.add(reading["kernel"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="run_pack.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", default=str(Path(__file__).resolve().parent), help="the pack folder (default: "
                        "this script's)")
    parser.add_argument("--device", default=None, help="the device, kind:index (default: the pack's kind, index 0)")
    parser.add_argument("--out", default=None, help="the readings file (default: PACK/readings.jsonl)")
    parser.add_argument("--cudart", default=None, help="libcudart.so.13 to use")
    parser.add_argument("--worker-timeout", type=float, default=30.0,
                        help="seconds past timeout_s after which a silent worker counts as hung")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    pack = Path(args.pack).resolve()
    sys.path.insert(0, str(pack / "site"))  # the pack's tvm_ffi, for the Python it was made for
    manifest = json.loads((pack / "manifest.json").read_text())
    device = args.device or f"{manifest['device']}:0"
    if args.device and args.device.isdigit():
        device = f"{manifest['device']}:{args.device}"
    if args.cudart:
        os.environ["TUNELAB_CUDART"] = args.cudart
    if args.serve:
        kind, _, index = device.partition(":")
        serve(pack, kind, int(index or 0))
        return
    out = Path(args.out) if args.out else pack / "readings.jsonl"
    driver = Driver(pack, device, out, args.worker_timeout)
    start = time.time()
    timed = driver.run()
    total = sum(len(lib["kernels"]) for lib in manifest["libraries"])
    print(f"run_pack: {timed} kernels timed now on {device} "
          f"({(driver.fingerprint or {}).get('name', '?')}) in {time.time() - start:.0f} s; "
          f"{len(driver.done())} of {total} in {out}")


if __name__ == "__main__":
    main()
