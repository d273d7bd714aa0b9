"""One task's rows of a measurement store: the (hardware, task, space) key, read and written by config."""
from __future__ import annotations

from tuning.store.base import MeasurementStore, Row, fingerprint, jsonable, space_signature


class TaskRows:
    """One task's rows for one backend under one MeasureSpec: the (hardware, task, space) key, read
    and written by config. The task is registered with the first write."""

    def __init__(self, store: MeasurementStore, hardware, spec, task, space):
        self.store, self.task, self.space = store, task, space
        self.hardware_key, self.description = fingerprint(hardware, spec)
        self.task_key, self.space_key = hardware.store_key(task), space_signature(space)
        self._registered = False

    @property
    def key(self) -> tuple[str, str, str]:
        return self.hardware_key, self.task_key, self.space_key

    def register(self) -> None:
        if not self._registered:
            self.store.register(self.hardware_key, self.description, self.task_key, self.task, self.space_key,
                                getattr(self.space, "base", self.space).size)
            self._registered = True

    def add(self, config, result, source: str, measured_at: float | None = None) -> None:
        self.register()
        config = tuple(config)
        self.store.add(*self.key, config, jsonable(self.space.decisions(config)), result, source, measured_at)

    def first(self, config) -> Row | None:
        return self.store.first(*self.key, config)

    def configs(self) -> list[tuple]:
        return self.store.configs(*self.key)

    def truth(self, config) -> float | None:
        return self.store.truth(*self.key, config)

    def holds(self, config, result) -> bool:
        """Whether this reading of `config` is stored already: the same costs, error and message (a
        run writes its rows with the store's clock, not its records', so the time cannot tell)."""
        return any(row.costs == list(result.costs) and row.error == result.error
                   and row.message == (result.message or "") for row in self.store.rows(*self.key, tuple(config)))


