"""A run's measurement store (hardware.store), wired before tuning starts.

`wire_store` returns the hardware the run measures on and the StoreWriter callback that writes every
reading to the store; it leaves the hardware it was given as it was. With hardware.reuse (or
model.space=store) the returned hardware is a ReplayHardware that answers stored configs from the
store (tuning/hardware/replay.py); with model.space=store its spaces are the configs the store holds.
"""
from __future__ import annotations

from tuning.config import ConfigError
from tuning.engine.callbacks import StoreWriter
from tuning.hardware.replay import store_path, with_store, writes_store
from tuning.store import display_location, open_store


def wire_store(space: str, hardware, spec) -> tuple:
    """(hardware to measure on, StoreWriter or None); `space`: model.space (ModelSpec.space), `spec`: the
    evaluator's MeasureSpec."""
    path = store_path(hardware)
    if path is None:
        if space == "store":
            raise ConfigError("model.space: `store` needs a measurement store (hardware=replay "
                              "hardware.store=FILE, or hardware.store=FILE hardware.reuse=true)")
        return hardware, None
    hardware = with_store(hardware, memoise=space == "store")  # a store-defined space: answered from the store
    if space == "store":
        hardware.restrict_to_store(spec)
    writer = StoreWriter(open_store(path, "hardware.store", read_only=not writes_store(hardware)), hardware, spec)
    return hardware, writer


def check_store_space(space: str, tasks, hardware) -> None:
    """model.space=store (`space`: ModelSpec.space): every task needs at least one stored reading to tune."""
    if space != "store":
        return
    for task in tasks:
        if hardware.space(task).size == 0:
            raise ConfigError(f"model.space: the store {display_location(hardware.store)} holds no reading of "
                              f"{task.name} for this hardware and evaluator (tunelab dataset stats lists what it "
                              "holds)")

