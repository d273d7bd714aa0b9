"""Device strings ("cpu", "cpu:0", "cuda:1") as TVM devices (imports TVM only in tvm_device).

Every function of tuning/hardware/ that touches a device takes it in this form: a device kind TVM
knows, optionally followed by ":index"; a bare kind means index 0, so "cpu" and "cpu:0" are the
same device.
"""
from __future__ import annotations


def parse_device(device: str) -> tuple[str, int]:
    """("cuda", 1) for "cuda:1", ("cpu", 0) for "cpu"; ValueError naming the string otherwise."""
    kind, _, index = str(device).partition(":")
    if not kind or (index and not index.isdigit()):
        raise ValueError(f"device {device!r}: expected a device kind with an optional index, "
                         f"e.g. 'cpu', 'cpu:0' or 'cuda:1'")
    return kind, int(index or 0)


def device_kind(device: str) -> str:
    """The kind of a device string: "cuda" for "cuda:1"."""
    return parse_device(device)[0]


def tvm_device(device: str):
    """The tvm device of a device string (ValueError for a kind TVM does not know)."""
    import tvm

    kind, index = parse_device(device)
    try:
        return tvm.device(kind, index)
    except ValueError:
        raise ValueError(f"device {device!r}: TVM knows no device kind {kind!r}") from None


def device_name(device: str) -> str | None:
    """The name a device of this host reports (e.g. "NVIDIA H100 80GB HBM3"); None when this host
    has no such device (e.g. a CUDA device where no driver or CUDA runtime is loaded)."""
    dev = tvm_device(device)
    try:
        return str(dev.device_name) if dev.exist else None
    except Exception:  # noqa: BLE001 - TVM raises where the device's API is not enabled at all
        return None
