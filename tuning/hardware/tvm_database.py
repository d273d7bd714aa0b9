"""Export measured schedules as a MetaSchedule JSON database (imports TVM).

`tvm.s_tir.meta_schedule.tir_integration.compile_tir(db, mod, target)` (and the
Relax pipelines) can apply what tunelab found, like any MetaSchedule result.
"""
from __future__ import annotations

from pathlib import Path

KEEP_BEST = 16  # per task: enough to pick from, small enough to replay quickly
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")  # what JSONDatabase writes


def write_database(hardware, records_by_task, out_dir, unmeasured=()) -> list[str]:
    """The best measured records of each task; and each unmeasured choice (task, config, predicted
    seconds), whose run seconds in the database are the prediction (MetaSchedule keeps only records
    with run seconds)."""
    from tvm.s_tir import meta_schedule as ms

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=str(out_dir))
    for task, records in records_by_task:
        measured = sorted((r for r in records if r.result.ok), key=lambda r: r.result.cost)
        _commit(database, hardware.schedules(task), [(tuple(r.config), r.result.costs) for r in measured[:KEEP_BEST]])
    for task, config, predicted in unmeasured:
        _commit(database, hardware.schedules(task), [(tuple(config), [predicted])])
    return [str(out_dir / name) for name in DATABASE_FILES]


def _commit(database, schedules, configs_and_seconds) -> None:
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    workload = database.commit_workload(schedules.mod)
    args_info = ArgInfo.from_prim_func(schedules.mod["main"])
    for config, seconds in configs_and_seconds:
        sch, _ = schedules.schedule(config)
        database.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, workload, [float(c) for c in seconds], schedules.target, args_info))
