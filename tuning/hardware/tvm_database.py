"""Export measured schedules as a MetaSchedule JSON database (imports TVM).

`tvm.s_tir.meta_schedule.tir_integration.compile_tir(db, mod, target)` (and the
Relax pipelines) can apply what tunelab found, like any MetaSchedule result.
"""
from __future__ import annotations

from pathlib import Path

KEEP_BEST = 16  # per task: enough to pick from, small enough to replay quickly


def write_database(hardware, records_by_task, out_dir) -> list[str]:
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=str(out_dir))
    for task, records in records_by_task:
        schedules = hardware.schedules(task)
        workload = database.commit_workload(schedules.mod)
        args_info = ArgInfo.from_prim_func(schedules.mod["main"])
        measured = sorted((r for r in records if r.result.ok), key=lambda r: r.result.cost)
        for record in measured[:KEEP_BEST]:
            sch, _ = schedules.schedule(tuple(record.config))
            database.commit_tuning_record(ms.database.TuningRecord(
                sch.trace, workload, [float(c) for c in record.result.costs], schedules.target, args_info))
    return [str(out_dir / "database_workload.json"), str(out_dir / "database_tuning_record.json")]
