"""MetaSchedule's own tune_tir read back as lab configs (tvm_peers.metaschedule_configs): its records'
traces come from the lab's design space, so each maps to the config whose replay is that schedule."""
import logging

import numpy as np
import pytest

from tuning.core.measure import MeasureSpec
from tuning.core.task import gemm_task

pytestmark = pytest.mark.tvm

GEMM = gemm_task("gemm_64", 64, 64, 64)
SPEC = MeasureSpec(number=1, repeat=3, min_repeat_ms=20, cache_flush=False, timeout_s=10.0)


def test_tune_tir_records_are_lab_configs_that_replay_their_schedules(tmp_path, caplog):
    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from tuning.hardware.cpu import CPUHardware
    from tuning.hardware.tvm_peers import metaschedule_configs, tune_with_metaschedule
    from tuning.hardware.tvm_space import TaskSchedules

    target = CPUHardware(num_threads=1).target
    tune_with_metaschedule(GEMM.workload, target, tmp_path, 32, 0, SPEC, 1, trials_per_round=16)  # ~30 s
    records = ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    with caplog.at_level(logging.INFO, logger="tuning.hardware.tvm_peers"):
        configs = metaschedule_configs(GEMM.workload, target, tmp_path)
    assert len(records) >= 30
    # the others' parallel extent was changed by MetaSchedule's MutateParallel, which the lab's space fixes
    assert len(configs) >= 0.9 * len(records)
    assert (len(configs) < len(records)) == ("records in" in caplog.text)

    schedules = TaskSchedules(GEMM.workload, target)
    mapped = [(record, schedules.config_of_trace(record.trace)) for record in records]
    mapped = [(record, config) for record, config in mapped if config is not None]
    assert [(c, float(np.mean([float(s) for s in r.run_secs]))) for r, c in mapped] == configs
    assert len({config[0] for _, config in mapped}) > 1  # more than one sketch told apart
    for record, config in mapped[:8]:
        assert schedules.space.is_valid(config) and schedules.canonical(config) == config
        replayed = schedules.replay(config).trace
        assert [str(d) for d in samples(replayed)] == [str(d) for d in samples(record.trace)]
        ours = schedules.schedule(config)[0].mod  # postprocessed as a build is
        theirs = tvm.s_tir.Schedule(schedules.mod)
        record.trace.apply_to_schedule(theirs, remove_postproc=False)
        assert tvm_ffi.structural_equal(ours, theirs.mod)


def samples(trace) -> list:
    return [trace.decisions[inst] for inst in trace.insts if inst.kind.name.startswith("Sample")]
