"""The lab's RPC server: TVM's own server, plus a function that says which device it is.

    tunelab rpc-server --tracker 127.0.0.1:9190 --key local [--host 127.0.0.1] [--port 9091]
                       [--cpus 0] [--threads 1] [--name NAME]

TVM's stock server (`python -m tvm.exec.rpc_server`) reports no CPU identity, so a store could not
tell readings from two kinds of boards apart, and it stops serving for good once a session ends
abnormally (a client that vanished mid-call, a kernel that crashed its session). This one starts the
same `tvm.rpc.Server` with a `server_init_callback` that keeps it serving after such a session and
registers `tunelab.device_identity` (rpc_worker.IDENTITY_FUNCTION):
the device's name (its address, or --name), CPU model, LLVM cpu and triple, runtime threads and
TVM version, as JSON. The remote runner keys the measurement store by it and takes `mcpu: auto`
from it. `--cpus` pins the server (and every session it forks) to those cores and `--threads` sets
TVM_NUM_THREADS for its kernels, so two servers on one host each time on their own core.
"""
from __future__ import annotations

import json
import os
import signal
import sys

from tuning.config.cli import new_parser

IDENTITY_FUNCTION = "tunelab.device_identity"
# x86 instruction-set extensions a target's -mcpu can switch on, in one spelling for /proc/cpuinfo's
# flags and LLVM's features (lower case, no "_", "-" or "."; cpuinfo says pni for sse3, bmi1 for bmi)
ISA_EXTENSIONS = frozenset(
    "sse3 ssse3 sse41 sse42 sse4a popcnt avx avx2 fma fma4 xop f16c bmi bmi2 adx sha aes pclmul vaes vpclmulqdq "
    "gfni avx512f avx512bw avx512cd avx512dq avx512vl avx512vnni avx512bf16 avx512fp16 avx512vbmi avx512vbmi2 "
    "avx512ifma avx512bitalg avx512vpopcntdq avxvnni avxifma avxvnniint8 amxtile amxint8 amxbf16 amxfp16".split())


def isa_name(feature: str) -> str:
    name = feature.lower().replace("_", "").replace("-", "").replace(".", "")
    return {"pni": "sse3", "pclmulqdq": "pclmul", "bmi1": "bmi", "shani": "sha"}.get(name, name)


def identity(name: str | None) -> dict:
    """What this process's device is (called in a session, a fork of the server); named by its
    address and the port TVM's server bound, unless `name` is given."""
    import platform

    import tvm
    from tvm.rpc.server import PopenRPCServerState
    from tvm.target.codegen import llvm_get_system_cpu, llvm_get_system_triple

    from tuning.hardware.cpu import cpu_model

    state = PopenRPCServerState.current
    address = state.custom_addr or (platform.node() if state.host in ("0.0.0.0", "::", "") else state.host)
    name = name or f"{address}:{state.port}"
    return {"name": name, "cpu_model": cpu_model(), "isa": _isa(), "mcpu": str(llvm_get_system_cpu()),
            "triple": str(llvm_get_system_triple()), "num_threads": os.environ.get("TVM_NUM_THREADS", ""),
            "cpus": sorted(os.sched_getaffinity(0)), "hostname": platform.node(), "tvm_version": tvm.__version__}


def _isa() -> list[str] | None:
    """The device's instruction-set extensions from /proc/cpuinfo (None where it has no flags line)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    flags = {isa_name(flag) for flag in line.split(":", 1)[1].split()}
                    return sorted(flags & ISA_EXTENSIONS)
    except OSError:
        pass
    return None


def prepare_server(name: str | None) -> None:
    """The server_init_callback: runs in the server process before it binds its port. Registers the
    identity function, and keeps the server serving after a session that ended abnormally."""
    import tvm_ffi
    from tvm.rpc import server

    tvm_ffi.register_global_func(IDENTITY_FUNCTION, lambda: json.dumps(identity(name)), override=True)
    server._serving = _surviving(server._serving)


def _surviving(serving):
    """TVM's `_serving` raises when a session's process exits non-zero (a client that vanished
    mid-call, a kernel that crashed), which ends the server's listening thread: the server stays
    up but never serves or registers again. This one logs it and goes on."""
    import functools
    import logging

    @functools.wraps(serving)
    def serve(sock, addr, opts, load_library):
        folder = os.getcwd()
        try:
            serving(sock, addr, opts, load_library)
        except RuntimeError as error:
            logging.getLogger("RPCServer").warning("session from %s ended abnormally (%s); serving again", addr, error)
            os.chdir(folder)

    return serve


def build_parser(prog: str | None = None):
    parser = new_parser("python -m tuning.hardware.rpc_server", __doc__.split("\n\n")[0], prog)
    parser.add_argument("--tracker", required=True, help="the tracker, host:port")
    parser.add_argument("--key", required=True, help="the device key this server registers under")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=9091, help="the first port to try (TVM searches upward)")
    parser.add_argument("--port-end", type=int, default=None, help="the end of the port search, exclusive "
                        "(default: --port + 100)")
    parser.add_argument("--custom-addr", default=None, help="the address reported to the tracker, if not --host")
    parser.add_argument("--name", default=None, help="the device's name in records (default: address:port, "
                        "the host's name for an address of every interface)")
    parser.add_argument("--cpus", default=None, help="pin the server to these cores, e.g. 0 or 0,1")
    parser.add_argument("--threads", type=int, default=None, help="TVM_NUM_THREADS of its kernels")
    return parser


def main(argv=None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    host, _, port = args.tracker.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"rpc-server: --tracker expects host:port, got {args.tracker!r}")
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    if args.threads:
        os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from tvm import rpc

    server = rpc.Server(args.host, args.port, args.port_end or args.port + 100, tracker_addr=(host, int(port)),
                        key=args.key, custom_addr=args.custom_addr, server_init_callback=_callback(args.name))
    print(f"rpc-server: {args.custom_addr or args.host}:{server.port} registered under key {args.key!r} with the "
          f"tracker at {args.tracker}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.proc.join()
    finally:
        server.terminate()


def _callback(name: str):
    import functools

    return functools.partial(prepare_server, name)


if __name__ == "__main__":
    main()
