"""Priors shipped with the package: MetaSchedule's pack-sum XGBoost pre-trained on the lab's own
measurements (`python -m tuning.tools.pretrain ... --save tuning/cost_model/priors/NAME`), read as
`tuning.prior=package:NAME`.

    NAME.ubj    the booster's bytes, read by xgboost alone: nothing in the file runs
    NAME.json   what it was trained on: each kernel with its host, what was held out, and the
                leave-one-kernel-out Spearman correlations (docs/methods.md §The first-round prior)

A name is a plain word; a reference naming no shipped file, or a file xgboost cannot read, is an
error naming `tuning.prior` before any work.
"""
from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

PREFIX = "package:"
NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


class PriorError(ValueError):
    pass


def packaged(reference: str | None) -> bool:
    """Whether `reference` names a prior shipped with the package (package:NAME)."""
    return isinstance(reference, str) and reference.startswith(PREFIX)


def names(folder=None) -> list[str]:
    """The shipped priors' names (`folder`: another folder of priors, for tests)."""
    folder = folder or resources.files(__name__)
    return sorted(entry.name[:-4] for entry in folder.iterdir() if entry.name.endswith(".ubj"))


def load(reference: str, folder=None) -> tuple[Any, dict]:
    """(xgboost Booster, what it was trained on) of a shipped prior; PriorError naming the shipped
    ones when there is no such prior or its file is not a readable booster."""
    import xgboost as xgb

    name = reference[len(PREFIX):] if packaged(reference) else reference
    folder = folder or resources.files(__name__)
    if not NAME.match(name) or not folder.joinpath(f"{name}.ubj").is_file():
        raise PriorError(f"no prior {reference!r} ships with tunelab (shipped: "
                         f"{', '.join(PREFIX + n for n in names(folder)) or 'none'})")
    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(folder.joinpath(f"{name}.ubj").read_bytes()))
    except xgb.core.XGBoostError as error:
        raise PriorError(f"{reference}: its {name}.ubj is not a readable xgboost booster "
                         f"({str(error).strip().splitlines()[0][:200] if str(error).strip() else 'unreadable'})") from None
    about_file = folder.joinpath(f"{name}.json")
    try:
        about = json.loads(about_file.read_text()) if about_file.is_file() else {}
    except ValueError:
        about = {}
    return booster, about if isinstance(about, dict) else {}
