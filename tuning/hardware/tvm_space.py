"""MetaSchedule design spaces as tunelab knob spaces (imports TVM).

Used in the main process (to build the Space and canonicalise configs) and in
the build worker (to turn a config into a schedule and a library). See
docs/tvm.md §MetaSchedule design spaces.
"""
from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import types
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from tuning.core.space import Knob, Space, factorizations, merge_sketches
from tuning.core.task import pair

# model.space=tiling (the GEMM-tiling paper's space; docs/tvm.md §The tiling space): MetaSchedule's
# llvm GEMM sketch without the write cache, i and j in 4 levels and k in 2 with the innermost cap
# lifted, and the one other decision fixed: explicit unroll up to 512 steps. Both fixed choices
# are the most common among the 25 fastest of 500 configs measured for gemm_512 in the lab's store
# (13 and 11 of 25).
TILING_UNROLL = 512

# model.space=wide (docs/tvm.md §The wide space): MetaSchedule's own llvm sketches, plus those of
# multi-level tilings its llvm defaults leave out, each generated with that MultiLevelTiling rule in
# place of the default one (req, levels, scope of the write cache; levels count the structure's tiles).
WIDE_TILINGS = (
    # the write cache at the inner tile levels: after the outer reduction tile (3) or the third
    # spatial tile (4), where the defaults stop at the first two
    ("SSRSRS", ("must", [3, 4], "global")),
    # the whole reduction inside the third spatial tile: an accumulator tile of the innermost spatial
    # factors, in local scope, written back once (a register-blocked kernel)
    ("SSSRS", ("must", [3], "local")),
)


def fast_tensor_intrin_import(target_kind: str = "llvm") -> None:
    """Import only the tensor intrinsics the target needs (0.5 s instead of ~45 s).

    `import tvm.s_tir.tensor_intrin` parses every target's intrinsics; MetaSchedule
    imports it eagerly. A package object with the real __path__ lets us import
    just one submodule and makes the later full import a no-op. A process that
    built cuda spaces first (no intrinsic) still gets the CPU's on its first llvm
    target."""
    if "tvm.s_tir.tensor_intrin" not in sys.modules:
        import tvm.s_tir

        path = os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin")
        package = types.ModuleType("tvm.s_tir.tensor_intrin")
        package.__path__ = [path]
        package.__package__ = "tvm.s_tir.tensor_intrin"
        sys.modules["tvm.s_tir.tensor_intrin"] = package
    if target_kind != "cuda":  # the cuda rules the lab uses need no intrinsic (space_generator)
        importlib.import_module("tvm.s_tir.tensor_intrin.x86")  # once: a no-op after the first time


# TOPI marks pooling blocks with a `schedule_rule` annotation naming a custom rule that only some
# targets register; MetaSchedule's ApplyCustomRule then warns "Unknown schedule rule ...", removes
# the annotation and lets the default rules schedule the block. The fallbacks below do exactly that
# (the same Unannotate instruction in the trace, so the same spaces), without the warning.
POOL_RULES = ("pool_max", "pool_avg", "adaptive_pool_max", "adaptive_pool_avg")


@contextmanager
def interrupts_kept():
    """Wrap the Python callbacks handed to one TVM call (`keep(function)`), so that Ctrl-C inside
    them still stops the run. An exception that is not an Exception (KeyboardInterrupt, SIGTERM's
    Terminated) raised in a callback comes back out of TVM as a plain RuntimeError: the "does not
    schedule" handlers here would swallow it, go on tuning and keep the config as illegitimate.
    The original comes back out instead."""
    stopped: list[BaseException] = []

    def keep(function):
        def called(*args):
            try:
                return function(*args)
            except BaseException as stop:
                if not isinstance(stop, Exception):
                    stopped.append(stop)
                raise
        return called

    try:
        yield keep
    except Exception:
        if stopped:
            raise stopped[0] from None
        raise


@contextmanager
def interrupts_noticed():
    """Ctrl-C (or SIGTERM/SIGHUP, which the run turns into Terminated) during a long TVM call is
    raised inside whichever Python callback TVM runs next, and some passes catch what their callbacks
    raise: relax's FoldConstant treats a failed build of a constant (the Python `tirx.build`) as "do
    not fold" and goes on, so the interrupt is lost. TVM's own signal checks in C++ raise it with no
    callback at all, as a RuntimeError the space's "does not schedule" handlers would keep as the
    config's outcome (a run once tuned on after Ctrl-C). The run's handlers are wrapped to note what
    they raise; it is raised again when the block ends, however TVM or the block treated it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopped: list[BaseException] = []

    def noting(handler):
        def noted(signum, frame):
            try:
                handler(signum, frame)
            except BaseException as stop:
                stopped.append(stop)
                raise
        return noted

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig, handler in handlers.items():
        if callable(handler):
            signal.signal(sig, noting(handler))
    try:
        yield
    except Exception:
        if stopped:
            raise stopped[0] from None
        raise
    finally:
        for sig, handler in handlers.items():
            if callable(handler):
                signal.signal(sig, handler)
    if stopped:
        raise stopped[0]


def register_pool_fallbacks(target_key: str = "cpu") -> None:
    """The pooling fallbacks for one target key (ApplyCustomRule looks the rule up under each of
    the target's keys in turn; see `target_key`)."""
    import tvm_ffi

    def fallback(sch, block):
        sch.unannotate(block, "schedule_rule")
        return [sch]

    for rule in POOL_RULES:  # 0.27 looks up "s_tir.meta_schedule.cpu.meta_schedule.pool_max"
        name = f"s_tir.meta_schedule.{target_key}.meta_schedule.{rule}"
        if tvm_ffi.get_global_func(name, allow_missing=True) is None:
            tvm_ffi.register_global_func(name, fallback)


def target_key(target: dict) -> str:
    """The first of a target's keys ("cpu" for llvm, "cuda" for cuda): the one TVM tries first."""
    return str(make_target(target).keys[0])


def make_target(target: dict):
    import tvm

    return tvm.target.Target(dict(target))


# Where untuned TIR is built and run when it cannot run on the target's device.
HOST_TARGET = {"kind": "llvm"}


def untuned_runs_on(target: dict) -> bool:
    """Whether untuned TIR runs on the target's device: on every CPU target, on no GPU. Untuned TIR
    binds no GPU threads; TVM still builds it for a GPU target, as host code that would read the
    device's memory."""
    return "gpu" not in make_target(target).keys


def tune_context(mod, target: dict, task_name: str = "task", tiling=None):
    """MetaSchedule's TuneContext with its default design-space generator for `target` (with
    `tiling`, a WIDE_TILINGS entry, in place of the default multi-level tiling)."""
    from tvm.s_tir import meta_schedule as ms

    fast_tensor_intrin_import(target.get("kind", "llvm"))
    register_pool_fallbacks(target_key(target))
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)  # "cannot be tensorized" x3
    # A fixed rand_state: the sketches' own (sampled) decisions decide some knobs' ranges (a compute
    # location's loop count follows earlier choices), so every process must generate the same sketches.
    return ms.TuneContext(mod=mod, target=make_target(target), space_generator=space_generator(target, tiling),
                          task_name=task_name, rand_state=0)


def space_generator(target: dict, tiling=None):
    """MetaSchedule's post-order design-space generator with the target's default rules. A cuda
    target gets MetaSchedule's "cuda" rules (multi-level tiling bound to threads with shared-memory
    caching, cross-thread reduction, auto-bind, its postprocessors, GPU verification last), not
    the "cuda-tensorcore" set TVM picks for sm_80 and later, whose extra rules tile for tensor-core
    (wmma/mma) intrinsics and need every CUDA tensor intrinsic registered first: 8.5 s of imports in
    every process, for float16 workloads the lab does not tune (docs/gpus.md)."""
    from tvm.s_tir import meta_schedule as ms

    if tiling is not None:
        return ms.space_generator.PostOrderApply(sch_rules=rules_with(tiling), postprocs="llvm", mutator_probs="llvm")
    if target.get("kind") == "cuda":
        return ms.space_generator.PostOrderApply(sch_rules="cuda", postprocs="cuda", mutator_probs="cuda")
    return ms.space_generator.PostOrderApply()


def rules_with(tiling) -> list:
    """MetaSchedule's default llvm rules with a WIDE_TILINGS entry's multi-level tiling in place of theirs."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.schedule_rule import MultiLevelTiling, ReuseType

    structure, (req, levels, scope) = tiling
    rule = MultiLevelTiling(structure=structure, max_innermost_factor=64,
                            reuse_write=ReuseType(req=req, levels=levels, scope=scope))
    return [rule if isinstance(default, MultiLevelTiling) else default
            for default in ms.schedule_rule.ScheduleRule.create("llvm")]


def wide_sketches(mod, target: dict) -> list:
    """The extra sketches of model.space=wide: one design space per WIDE_TILINGS entry, the default
    llvm rules with that multi-level tiling in place of theirs (llvm targets only)."""
    if target.get("kind", "llvm") != "llvm":
        raise ValueError(f"model.space=wide: its extra tilings are MetaSchedule's llvm rules; the target is "
                         f"{target.get('kind')!r} (use model.space=full)")
    return [s.trace for tiling in WIDE_TILINGS
            for s in tune_context(mod, target, tiling=tiling).generate_design_space()]


def arg_shapes(func) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each of a PrimFunc's buffers, in parameter order."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return [(tuple(int(d) for d in info.shape), str(info.dtype)) for info in ArgInfo.from_prim_func(func)]


def arguments(func) -> list[list]:
    """arg_shapes as JSON-ready [shape, dtype] pairs (what a build reports and a pack records)."""
    return [[list(shape), dtype] for shape, dtype in arg_shapes(func)]


def workload_module(workload: dict):
    """The IRModule ("main" only) of a workload: a network's kernel as extracted, or a single operator."""
    import tvm

    if workload["op"] == "tir":
        return tvm.ir.load_json(workload["mod"])
    return tvm.IRModule({"main": prim_func(workload)})


def prim_func(workload: dict):
    """The untuned TIR function of a single-operator workload."""
    from tvm import te, topi

    dtype = workload.get("dtype", "float32")
    if workload["op"] == "gemm":
        M, N, K = workload["M"], workload["N"], workload["K"]
        A = te.placeholder((M, K), dtype, name="A")
        B = te.placeholder((K, N), dtype, name="B")
        k = te.reduce_axis((0, K), name="k")
        C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        return te.create_prim_func([A, B, C])
    if workload["op"] == "batch_matmul":
        b, M, N, K = workload["batch"], workload["M"], workload["N"], workload["K"]
        A = te.placeholder((b, M, K), dtype, name="A")
        B = te.placeholder((b, K, N), dtype, name="B")
        k = te.reduce_axis((0, K), name="k")
        C = te.compute((b, M, N), lambda n, i, j: te.sum(A[n, i, k] * B[n, k, j], axis=k), name="C")
        return te.create_prim_func([A, B, C])
    if workload["op"] == "conv2d":
        w = workload
        groups = w.get("groups", 1)
        kh, kw = pair(w["kernel"])
        X = te.placeholder((w["batch"], w["in_channels"], w["height"], w["width"]), dtype, name="X")
        W = te.placeholder((w["out_channels"], w["in_channels"] // groups, kh, kw), dtype, name="W")
        # square sizes stay ints, as before per-axis sizes existed: the same TIR for the stored workloads
        stride, padding, dilation = (_topi_size(w.get(k, default)) for k, default in
                                     (("stride", 1), ("padding", 0), ("dilation", 1)))
        if groups == 1:
            Y = topi.nn.conv2d_nchw(X, W, stride, padding, dilation)
        else:
            Y = topi.nn.group_conv2d_nchw(X, W, stride, padding, dilation, groups)
        return te.create_prim_func([X, W, Y])
    raise ValueError(f"unsupported op {workload['op']!r}")


def _topi_size(value):
    return value if isinstance(value, int) else tuple(value)


def tiling_sketch(traces):
    """The GEMM sketch without a write cache (model.space=tiling), or ValueError."""
    plain = [t for t in traces if not any(i.kind.name == "CacheWrite" for i in t.insts)]
    tiled = [t for t in plain if sum(i.kind.name == "SamplePerfectTile" for i in t.insts) == 3]
    if not tiled:
        raise ValueError("model.space=tiling: MetaSchedule gave no multi-level-tiling sketch without a write "
                         "cache for this workload")
    return tiled[0]


# The sampling instructions a sketch may hold, each read as one knob. `replay` hands a decision to
# every Sample* instruction in order, so one of any other kind would shift every decision after it.
SAMPLE_KINDS = ("SamplePerfectTile", "SampleCategorical", "SampleComputeLocation")


def check_sample_kinds(trace) -> None:
    """ValueError naming the first sampling instruction of `trace` that is not a knob kind."""
    for inst in trace.insts:
        kind = inst.kind.name
        if kind.startswith("Sample") and kind not in SAMPLE_KINDS:
            raise ValueError(f"MetaSchedule's sketch samples with {kind}, which tunelab does not read as a "
                             f"knob (it reads {', '.join(SAMPLE_KINDS)})")


def _structure(simplified) -> str:
    """A simplified trace's instructions without their decisions (what a sketch and the schedules
    replayed from it share)."""
    return str(simplified.as_json(remove_postproc=True)[0])


class TaskSchedules:
    """A task's design spaces, its knob Space, and config -> schedule."""

    def __init__(self, workload: dict, target: dict):
        self.mod = workload_module(workload)
        self.tiling = workload.get("space") == "tiling"
        context = tune_context(self.mod, target)
        self.context = context
        self.target = context.target
        self.sketches = [s.trace for s in context.generate_design_space()]
        if self.tiling:
            self.sketches = [tiling_sketch(self.sketches)]
        elif workload.get("space") == "wide":
            self.sketches += wide_sketches(self.mod, target)
        self.postprocs = list(context.space_generator.postprocs)
        for postproc in self.postprocs:
            postproc._initialize_with_tune_context(context)
        self.sketch_knobs = [self._read_knobs(trace) for trace in self.sketches]
        knobs, active = merge_sketches(self.sketch_knobs)
        self.space = Space(knobs, active, canonicalize=self.canonical, legitimacy=self.legitimate,
                           store_features=self.store_features, canonicalize_many=self.canonical_many)
        self.canonical_threads = max(1, int(target.get("num-cores", 1)))
        self._scheduled: OrderedDict = OrderedDict()  # config -> (schedule, effective) or the error

    # ---- reading the knobs ----------------------------------------------------
    def _read_knobs(self, trace) -> list[Knob]:
        """Replay the sketch and describe each sampling instruction's legal choices."""
        from tvm import s_tir

        check_sample_kinds(trace)
        fresh = s_tir.Schedule(self.mod)
        knobs: list[Knob] = []

        def describe(inst, inputs, attrs, decision):
            kind = inst.kind.name
            if kind == "SamplePerfectTile":
                extent = int(fresh.get(inputs[0]).extent)
                parts, max_innermost = int(attrs[0]), 0 if self.tiling else int(attrs[1])
                choices = tuple(factorizations(extent, parts, max_innermost))
                knobs.append(Knob(f"tile{len(knobs)}", "tile", choices))
            elif kind == "SampleCategorical":
                candidates = tuple(int(c) for c in attrs[0])
                choices = (candidates.index(TILING_UNROLL),) if self.tiling else tuple(range(len(candidates)))
                knobs.append(Knob(f"categorical{len(knobs)}", "categorical", choices))
            elif kind == "SampleComputeLocation":
                consumer = fresh.get_consumers(inputs[0])[0]
                n_loops = len(fresh.get_loops(consumer))
                knobs.append(Knob(f"location{len(knobs)}", "location", tuple(range(-2, n_loops))))
            return decision

        with interrupts_kept() as keep:
            trace.apply_to_schedule(fresh, remove_postproc=True, decision_provider=keep(describe))
        return knobs

    # ---- config -> schedule ------------------------------------------------------
    def _decisions(self, config) -> tuple[int, list]:
        sketch = config[0]
        slots = self.space.active[sketch]
        return sketch, [self.space.knobs[slot].choices[config[slot]] for slot in slots]

    def replay(self, config):
        """The schedule for a config, before postprocessing (raises on wrong-length decisions)."""
        from tvm import s_tir

        sketch, decisions = self._decisions(config)
        queue = list(decisions)

        def provide(inst, inputs, attrs, decision):
            if inst.kind.name.startswith("Sample"):
                return list(queue.pop(0)) if isinstance(queue[0], tuple) else queue.pop(0)
            return decision

        sch = s_tir.Schedule(self.mod)
        with interrupts_kept() as keep:
            self.sketches[sketch].apply_to_schedule(sch, remove_postproc=True, decision_provider=keep(provide))
        return sch

    def effective_config(self, sch, sketch: int) -> tuple:
        """Read the decisions TVM actually used back into choice indices."""
        return self._config_of(sch.trace, sketch)

    def _config_of(self, trace, sketch: int) -> tuple:
        """`trace`'s sampling decisions as `sketch`'s choice indices (ValueError where one is not a choice)."""
        values = [trace.decisions[inst] for inst in trace.insts if inst.kind.name.startswith("Sample")]
        if len(values) != len(self.space.active[sketch]):
            raise ValueError(f"the trace samples {len(values)} times, sketch {sketch} {len(self.space.active[sketch])}")
        config = [0] * len(self.space.knobs)
        config[0] = sketch
        for slot, value in zip(self.space.active[sketch], values):
            value = tuple(int(v) for v in value) if self.space.knobs[slot].kind == "tile" else int(value)
            config[slot] = self.space.knobs[slot].choices.index(value)
        return tuple(config)

    def config_of_trace(self, trace) -> tuple | None:
        """The config whose replay makes `trace`'s decisions: `trace` is a schedule of this task from
        MetaSchedule's design space (a tune_tir tuning record's, postprocessing included). Its sketch
        is the one with the same instructions, dead code and postprocessing left out, and each of its
        sampling decisions becomes its knob's choice index. Sampling kinds and order alone do not name
        the sketch: a GEMM's three sketches sample alike and differ only in where the write cache goes.
        None where no sketch has those instructions, or a decision is not among its knob's choices
        (model.space=tiling fixes the unroll)."""
        if "_structures" not in self.__dict__:
            self._structures = [_structure(sketch.simplified(remove_postproc=True)) for sketch in self.sketches]
        trace = trace.simplified(remove_postproc=True)
        structure = _structure(trace)
        for sketch, known in enumerate(self._structures):
            if known == structure:
                try:
                    return self._config_of(trace, sketch)
                except ValueError:
                    return None
        return None

    def canonical(self, config) -> tuple:
        """The config TVM replays `config` as (an illegal compute location repaired), or the config
        itself when TVM cannot replay it (building reports that)."""
        with interrupts_noticed():  # Ctrl-C inside TVM comes out as the RuntimeError caught below
            try:
                return self._replayed_decisions(config)
            except Exception:  # noqa: BLE001 - a config TVM cannot even replay stays itself; building reports it
                return tuple(config)

    def canonical_many(self, configs) -> list[tuple]:
        """canonical() of each config, replayed on `canonical_threads` threads (TVM releases the GIL
        while it replays a trace that calls no Python: 1.6-1.8x on two cores for a conv2d's sketches)."""
        if self.canonical_threads < 2 or len(configs) < 2:
            return [self.canonical(config) for config in configs]
        self._sampling_prefixes(), self._unscheduled()  # made here, not raced for by the threads
        with interrupts_noticed(), ThreadPoolExecutor(self.canonical_threads) as pool:
            return list(pool.map(self.canonical, configs))

    def _replayed_decisions(self, config) -> tuple:
        """Replay the sketch's instructions up to its last sampling one, with `config`'s decisions
        written into the trace (no Python callback, so no GIL), and read back what TVM used: every
        decision, repaired or not, is made by then."""
        sketch, decisions = self._decisions(config)
        trace, samples = self._sampling_prefixes()[sketch]
        if len(samples) != len(decisions):
            raise ValueError(f"sketch {sketch} samples {len(samples)} times, the config decides {len(decisions)}")
        for inst, decision in zip(samples, decisions):
            trace = trace.with_decision(inst, list(decision) if isinstance(decision, tuple) else decision,
                                        remove_postproc=True)
        sch = self._unscheduled().copy()  # a copy costs microseconds, a new Schedule ~0.4 ms
        trace.apply_to_schedule(sch, remove_postproc=True)
        return self.effective_config(sch, sketch)

    def _unscheduled(self):
        if "_fresh" not in self.__dict__:
            from tvm import s_tir

            self._fresh = s_tir.Schedule(self.mod)
        return self._fresh

    def _sampling_prefixes(self) -> list:
        """Each sketch cut after its last sampling instruction, with its sampling instructions."""
        if "_prefixes" not in self.__dict__:
            from tvm.s_tir.schedule import Trace

            prefixes = []
            for trace in self.sketches:
                insts = list(trace.insts)
                samples = [inst for inst in insts if inst.kind.name.startswith("Sample")]
                kept = insts[:insts.index(samples[-1]) + 1] if samples else []
                decisions = {inst: trace.decisions[inst] for inst in kept if inst in trace.decisions}
                prefixes.append((Trace(kept, decisions), samples))
            self._prefixes = prefixes  # whole or not at all: canonical_many's threads read it
        return self._prefixes

    def legitimate(self, config) -> bool:
        """The paper's J: the schedule replays and every postprocessor accepts it."""
        try:
            self.schedule(tuple(config))
        except Exception:  # noqa: BLE001 - any failure to schedule is "not legitimate"
            return False
        return True

    SCHEDULED_KEPT = 2048  # a search checks a config's legitimacy, then reads its features: schedule once

    def schedule(self, config):
        """(schedule, effective config) with postprocessors applied, or raises (the last
        SCHEDULED_KEPT outcomes are kept; callers must not modify the schedule)."""
        config = tuple(config)
        if config not in self._scheduled:
            with interrupts_noticed():  # an interrupt is raised here, never kept as the config's outcome
                try:
                    outcome = self._schedule(config)
                except Exception as error:  # noqa: BLE001 - kept and re-raised: the same outcome every time
                    outcome = error
            self._scheduled[config] = outcome
            if len(self._scheduled) > self.SCHEDULED_KEPT:
                self._scheduled.popitem(last=False)
        outcome = self._scheduled[config]
        if isinstance(outcome, Exception):
            raise outcome.with_traceback(None)  # a kept error: no frames pile up on re-raises
        return outcome

    def store_features(self, configs) -> list[np.ndarray]:
        """TVM's per-store features (MetaSchedule's PerStoreFeature, its defaults: 5 buffers per
        store, 10 arithmetic-intensity samples, 64-byte lines; 164 numbers a row) of each config's
        scheduled program; (0, 164) for a config that does not schedule."""
        from tvm.s_tir import meta_schedule as ms
        from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

        if "_extractor" not in self.__dict__:
            self._extractor = PerStoreFeature()
            self._args = ms.arg_info.ArgInfo.from_prim_func(self.mod["main"])
        out = [np.zeros((0, self._extractor.feature_vector_length), dtype=np.float32)] * len(configs)
        scheduled, where = [], []
        for i, config in enumerate(configs):
            try:
                scheduled.append(ms.MeasureCandidate(self.schedule(config)[0], self._args))
                where.append(i)
            except Exception:  # noqa: BLE001 - a config that does not schedule has no stores to describe
                continue
        with interrupts_noticed():
            extracted = self._extractor.extract_from(self.context, scheduled) if scheduled else []
        for i, rows in zip(where, extracted):
            out[i] = rows.numpy().astype(np.float32)
        return out

    def _schedule(self, config):
        sch = self.replay(config)
        effective = self.effective_config(sch, config[0])
        for postproc in self.postprocs:
            if not postproc.apply(sch):
                raise ValueError(f"postprocessor {type(postproc).__name__} rejected the schedule")
        return sch, effective
