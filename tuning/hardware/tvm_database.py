"""Export measured schedules as a MetaSchedule JSON database (imports TVM).

`tvm.s_tir.meta_schedule.tir_integration.compile_tir(db, mod, target)` (and the
Relax pipelines) can apply what tunelab found, like any MetaSchedule result.
"""
from __future__ import annotations

from pathlib import Path

from tuning.core.outcome import fastest_by_config

KEEP_BEST = 16  # per task: enough to pick from, small enough to replay quickly
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")  # what JSONDatabase writes


def write_database(hardware, records_by_task, out_dir, unmeasured=(), chosen=None) -> list[str]:
    """The best measured configs of each task (database_rows), the one tunelab chose first when
    `chosen` ({task name: (config, seconds)}) names it; and each unmeasured choice (task, config,
    predicted seconds), whose run seconds in the database are the prediction (MetaSchedule keeps
    only records with run seconds)."""
    from tvm.s_tir import meta_schedule as ms

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in DATABASE_FILES:  # JSONDatabase appends: an earlier export's rows would outrank this one's
        (out_dir / name).unlink(missing_ok=True)
    database = ms.database.JSONDatabase(work_dir=str(out_dir))
    chosen = chosen or {}
    for task, records in records_by_task:
        _commit(database, hardware.schedules(task), database_rows(records, chosen.get(task.name)))
    for task, config, predicted in unmeasured:
        _commit(database, hardware.schedules(task), [(tuple(config), [predicted])])
    return [str(out_dir / name) for name in DATABASE_FILES]


def database_rows(records, chosen=None) -> list[tuple[tuple, list[float]]]:
    """(config, [run seconds]) rows in the order MetaSchedule will rank them, so that the schedule
    it applies (the lowest mean of a record's run seconds) is the one tunelab reports. Each config
    once, its run seconds its best record's median (tunelab's statistic: the mean of a record's
    repeats puts a config with one preempted repeat behind slower ones, and MetaSchedule would
    compile another kernel than the one the lab's estimate counts). With `chosen` (config, seconds:
    the re-measured best of the run's end), that config leads with those seconds and only configs
    slower than it by their own records follow: one faster by its tuning-time median is one the
    re-measurement passed over. KEEP_BEST rows at most."""
    rows = sorted(fastest_by_config(records).items(), key=lambda row: row[1])
    if chosen is not None:
        config, seconds = tuple(chosen[0]), float(chosen[1])
        rows = [(config, seconds), *((c, s) for c, s in rows if c != config and s > seconds)]
    return [(config, [seconds]) for config, seconds in rows[:KEEP_BEST]]


def _commit(database, schedules, configs_and_seconds) -> None:
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    workload = database.commit_workload(schedules.mod)
    args_info = ArgInfo.from_prim_func(schedules.mod["main"])
    for config, seconds in configs_and_seconds:
        sch, _ = schedules.schedule(config)
        database.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload, [float(c) for c in seconds], schedules.target, args_info))
