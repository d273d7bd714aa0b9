"""CUDA kernels compiled for real, on a host with nvcc and no GPU (imports TVM).

This TVM builds CUDA device code as a module that carries the CUDA C source (its "fallback" module:
the CUDA runtime is not linked into the compiler), and `export_library` writes that source into the
library: nothing is compiled, and a GPU host without TVM's compiler could not run it. Here the source
of every CUDA import is compiled by nvcc to a cubin for the target's `arch` (a kernel that does not
compile is an error now, before it travels), and the library is exported with the cubin in the
source's place. The library format is tvm-ffi's (`__tvm_ffi__library_bin`: the byte count, the
import tree as CSR vectors, then per module its kind and its bytes); a CUDA module's bytes are its
format, its function table and its code, in that order, the layout the CUDA runtime's loader
(`ffi.Module.load_from_bytes.cuda`) reads. So the exported library loads and runs with TVM's runtime
alone (libtvm_runtime.so, libtvm_runtime_cuda.so and tvm_ffi) on a host with the GPU.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

MIN_ARCH = 75  # the oldest arch nvcc 13 compiles for; the lab's floor whatever nvcc is installed
ARCH_PATTERN = re.compile(r"^sm_(\d{2,3})a?$")
CUBIN = "cubin"


def arch_number(arch: str) -> int | None:
    """90 for "sm_90" or "sm_90a"; None for anything that is not an sm_ arch."""
    match = ARCH_PATTERN.match(str(arch))
    return int(match.group(1)) if match else None


def cuda_roots() -> list[Path]:
    """Where nvcc may be: $CUDA_HOME, /usr/local/cuda, NVIDIA's pip wheels (the [cuda] extra). (libcudart
    is found by gpu_pack_runner.find_cudart, which a pack's script runs on its own.)"""
    roots = [Path(p) for p in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if p]
    return roots + [Path(p, "nvidia", sub) for p in sys.path if p for sub in ("cu13", "cuda_nvcc")]


def nvcc_path() -> str | None:
    """nvcc on PATH, else in one of cuda_roots()."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in cuda_roots():
        if Path(root, "bin", "nvcc").is_file():
            return str(Path(root, "bin", "nvcc"))
    return None


@lru_cache(maxsize=None)
def nvcc_archs() -> tuple[int, ...]:
    """The compute capabilities this host's nvcc compiles for (its --list-gpu-arch), e.g. (75, 80, 90)."""
    nvcc = nvcc_path()
    if nvcc is None:
        return ()
    try:
        listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(sorted({int(m) for m in re.findall(r"compute_(\d+)", listed)}))


def no_nvcc(key: str = "hardware.arch") -> str | None:
    """Why no CUDA kernel can be compiled on this host, whatever the arch (no nvcc); None when nvcc is here."""
    if nvcc_path() is not None:
        return None
    return (f"{key}: compiling CUDA kernels needs nvcc: install the CUDA toolkit (nvcc on PATH, or "
            f"$CUDA_HOME) or pip install 'tunelab[cuda]'")


def uncompilable(arch: str, key: str = "hardware.arch") -> str | None:
    """Why kernels for `arch` cannot be compiled on this host (no nvcc, or an arch it does not
    know), naming the key; None when they can."""
    number = arch_number(arch)
    if number is None or number < MIN_ARCH:
        return f"{key}: {arch!r} is not an sm_XX arch of {MIN_ARCH} or later (e.g. sm_80, sm_90)"
    if nvcc_path() is None:
        return no_nvcc(key)
    if number not in nvcc_archs():
        known = ", ".join(f"sm_{a}" for a in nvcc_archs())
        return f"{key}: this host's nvcc does not compile for {arch} (it knows {known})"
    return None


# ---- compiling ------------------------------------------------------------------------------------
class CompileError(RuntimeError):
    """nvcc refused the kernels' source (the message is its output)."""


def compile_source(source: str, arch: str, workdir: Path) -> bytes:
    """CUDA C source -> cubin for `arch`, by nvcc (-O3, as TVM's own nvcc path)."""
    workdir.mkdir(parents=True, exist_ok=True)
    source_file, cubin_file = workdir / "kernels.cu", workdir / "kernels.cubin"
    source_file.write_text(source)
    command = [nvcc_path() or "nvcc", "--cubin", "-O3", f"-arch={arch}", "-o", str(cubin_file), str(source_file)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise CompileError(f"nvcc for {arch} failed:\n{(done.stderr or done.stdout)[-4000:]}")
    return cubin_file.read_bytes()


def export_compiled(lib, arch: str, path: str | os.PathLike) -> None:
    """Export `lib` (built for a cuda target) to `path` with every CUDA import compiled to a cubin."""
    import tvm

    path = Path(path)
    workdir = path.with_name(path.name + ".build")
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if not any(m.kind == "cuda" for m in lib.imports):
            lib.export_library(str(path))
            return
        blob = tvm.runtime._ffi_api.ModulePackImportsToTensor(lib).numpy().tobytes()  # the library's blob
        blob = with_cubins(blob, lambda source: compile_source(source, arch, workdir))
        blob_file = workdir / "library.bin"
        blob_file.write_bytes(blob)

        def pack_imports(_mod, _is_system_lib, _prefix, workspace_dir):
            assembly = Path(workspace_dir, "library_bin.S")
            assembly.write_text(blob_assembly(blob_file.resolve()))
            return str(assembly)

        lib.export_library(str(path), fpack_imports=pack_imports)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# ---- the library blob ----------------------------------------------------------------------------
LIBRARY_SYMBOL = "__tvm_ffi__library_bin"


class _Reader:
    def __init__(self, data: bytes, offset: int = 0):
        self.data, self.offset = data, offset

    def u64(self) -> int:
        if self.offset + 8 > len(self.data):
            raise ValueError("library blob ends inside a number")
        (value,) = struct.unpack_from("<Q", self.data, self.offset)
        self.offset += 8
        return value

    def chunk(self) -> bytes:
        size = self.u64()
        if self.offset + size > len(self.data):
            raise ValueError("library blob ends inside a string")
        value = self.data[self.offset:self.offset + size]
        self.offset += size
        return value

    def skip(self, size: int) -> None:
        if self.offset + size > len(self.data):
            raise ValueError("library blob ends inside a table")
        self.offset += size

    def u64_vector(self) -> list[int]:
        return [self.u64() for _ in range(self.u64())]


def _chunk(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


def parse_blob(blob: bytes) -> tuple[list[int], list[int], list[tuple[str, bytes | None]]]:
    """(indptr, child indices, [(kind, bytes or None for "_lib")]) of a library blob."""
    reader = _Reader(blob)
    size = reader.u64()
    if size + 8 != len(blob):
        raise ValueError(f"library blob says {size} bytes, holds {len(blob) - 8}")
    indptr, children = reader.u64_vector(), reader.u64_vector()
    modules: list[tuple[str, bytes | None]] = []
    while reader.offset < len(blob):
        kind = reader.chunk().decode()
        modules.append((kind, None if kind == "_lib" else reader.chunk()))
    return indptr, children, modules


def write_blob(indptr: list[int], children: list[int], modules: list[tuple[str, bytes | None]]) -> bytes:
    body = b"".join([struct.pack("<Q", len(indptr)), *(struct.pack("<Q", v) for v in indptr),
                     struct.pack("<Q", len(children)), *(struct.pack("<Q", v) for v in children)]
                    + [_chunk(kind.encode()) + (b"" if data is None else _chunk(data)) for kind, data in modules])
    return struct.pack("<Q", len(body)) + body


def parse_cuda_module(data: bytes) -> tuple[str, bytes, bytes]:
    """(format, function table bytes, code) of a CUDA module's saved bytes. The table is read to
    find where the code starts and kept as bytes: per kernel its key, its name, its argument types
    (4 bytes each), its launch parameter tags and its argument tags (4 bytes each)."""
    reader = _Reader(data)
    fmt = reader.chunk().decode()
    table_start = reader.offset
    for _ in range(reader.u64()):
        reader.chunk(), reader.chunk()
        reader.skip(4 * reader.u64())
        for _ in range(reader.u64()):
            reader.chunk()
        reader.skip(4 * reader.u64())
    table_end = reader.offset
    code = reader.chunk()
    if reader.offset != len(data):
        raise ValueError("a CUDA module's bytes go on after its code")
    return fmt, data[table_start:table_end], code


def cuda_module_bytes(fmt: str, table: bytes, code: bytes) -> bytes:
    return _chunk(fmt.encode()) + table + _chunk(code)


def with_cubins(blob: bytes, compile_source_to_cubin) -> bytes:
    """The blob with each CUDA module holding CUDA source ("cuda") recompiled to a cubin."""
    indptr, children, modules = parse_blob(blob)
    rebuilt = []
    for kind, data in modules:
        if kind == "cuda" and data is not None:
            fmt, table, code = parse_cuda_module(data)
            if fmt == "cuda":
                data = cuda_module_bytes(CUBIN, table, compile_source_to_cubin(code.decode()))
        rebuilt.append((kind, data))
    return write_blob(indptr, children, rebuilt)


def cuda_formats(blob: bytes) -> list[str]:
    """The code format of each CUDA module in a blob ("cubin" once compiled, "cuda" for source)."""
    return [parse_cuda_module(data)[0] for kind, data in parse_blob(blob)[2] if kind == "cuda" and data]


def blob_assembly(blob_file: Path) -> str:
    """An assembler file defining the library symbol as the blob file's bytes."""
    return (f"  .section .rodata\n  .balign 16\n  .globl {LIBRARY_SYMBOL}\n  .type {LIBRARY_SYMBOL}, @object\n"
            f"{LIBRARY_SYMBOL}:\n  .incbin \"{blob_file}\"\n  .size {LIBRARY_SYMBOL}, . - {LIBRARY_SYMBOL}\n"
            f"  .section .note.GNU-stack,\"\",@progbits\n")


def blob_of_library(path: str | os.PathLike) -> bytes:
    """The library blob an exported shared library carries (read from its ELF symbol table with nm)."""
    listed = subprocess.run(["nm", "-S", "--defined-only", str(path)], capture_output=True, text=True,
                            check=True).stdout
    for line in listed.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == LIBRARY_SYMBOL:
            address, size = int(parts[0], 16), int(parts[1], 16)
            return _read_at_address(Path(path), address, size)
    raise ValueError(f"{path}: no {LIBRARY_SYMBOL} symbol")


def _read_at_address(path: Path, address: int, size: int) -> bytes:
    """The bytes at a virtual address of an ELF shared object (its section table: objdump -h)."""
    sections = subprocess.run(["objdump", "-h", str(path)], capture_output=True, text=True, check=True).stdout
    for line in sections.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0].isdigit():
            vma, offset, length = int(parts[3], 16), int(parts[5], 16), int(parts[2], 16)
            if vma <= address < vma + length:
                with path.open("rb") as handle:
                    handle.seek(offset + address - vma)
                    return handle.read(size)
    raise ValueError(f"{path}: address {address:#x} is in no section")
