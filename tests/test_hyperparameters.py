"""A hyperparameter is declared once (tuning/core/component.py `Hyper`, a class's `hyperparameters`): the
option's YAML, the `__init__` defaults, the validation (`ranges`, `options`) and the docstring's table
all agree with the declaration."""
from __future__ import annotations

import inspect
import re

import pytest
from omegaconf import OmegaConf

from configs import CONF, group_yamls
from tuning.core.component import Component, Hyper, declaration_problems, hyper_table, import_class, same_value

SEARCH_YAMLS = group_yamls("search")


def declared_class(path):
    cls = import_class(OmegaConf.load(path)["_target_"])
    if not cls.hyperparameters:
        if path.is_relative_to(CONF):
            pytest.fail(f"{path.name}: {cls.__name__} declares no `hyperparameters`")
        pytest.skip(f"{cls.__name__} declares no `hyperparameters` (a method of its own config directory)")
    return cls


def deviates(text: str, key: str) -> bool:
    """Whether the YAML says, in a comment, that its value of `key` deviates from the declared default:
    a comment on the key's own line, or a comment line naming the key, containing "deviation"."""
    for line in text.splitlines():
        code, _, comment = line.partition("#")
        if "deviation" in comment.lower() and (code.strip().startswith(f"{key}:") or
                                               (not code.strip() and re.search(rf"\b{key}\b", comment))):
            return True
    return False


@pytest.mark.parametrize("path", SEARCH_YAMLS, ids=lambda p: p.stem)
def test_the_yaml_gives_the_declared_hyperparameters_and_defaults(path):
    cls = declared_class(path)
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    node.pop("defaults", None), node.pop("_target_")
    assert list(node) == list(cls.hyperparameters), f"{path.name}: keys differ from {cls.__name__}.hyperparameters"
    text = path.read_text()
    differ = {key: (value, cls.hyperparameters[key].default) for key, value in node.items()
              if not same_value(value, cls.hyperparameters[key].default) and not deviates(text, key)}
    assert not differ, f"{path.name}: (YAML, declared) without a comment saying it is a deviation: {differ}"


@pytest.mark.parametrize("path", SEARCH_YAMLS, ids=lambda p: p.stem)
def test_init_defaults_validation_and_docstring_come_from_the_declaration(path):
    cls = declared_class(path)
    assert declaration_problems(cls) == []
    for key, h in cls.hyperparameters.items():
        assert h.help and h.cite, f"{cls.__name__}.{key}: say what it is (help) and where its value comes from (cite)"
        if h.low is not None or h.high is not None:
            assert cls.ranges[key] == (h.low, h.high)
        else:
            assert key not in cls.ranges
        assert cls.options.get(key) == (None if h.choices is None else tuple(h.choices))
    doc = inspect.getdoc(cls)
    assert hyper_table(cls) in doc
    for key in cls.hyperparameters:
        assert re.search(rf"^    {key} = ", doc, re.M), key


def test_the_derived_ranges_give_the_messages_they_gave():
    from tuning.search.gbfs import GreedyBestFirst
    from tuning.search.ppo import PPO
    from tuning.search.sa import SimulatedAnnealing

    assert SimulatedAnnealing.check_params({"n_iter": 0}, "search") == ["search.n_iter: must be >= 1, got 0"]
    assert SimulatedAnnealing.check_params({"refine_share": 1.5}, "search") == [
        "search.refine_share: must be >= 0.0 and <= 1.0, got 1.5"]
    assert PPO.check_params({"clip": 0}, "search") == ["search.clip: must be >= 1e-06, got 0"]
    assert GreedyBestFirst.check_params({"start": "middle"}, "search") == [
        "search.start: expected one of untiled, random, got 'middle'"]
    assert GreedyBestFirst.check_params({"moves": "factor"}, "search")[0].startswith("search.moves:")


def test_a_component_declares_a_key_once_and_keeps_what_it_inherits():
    class Base(Component):
        ranges = {"inherited": (0, 1)}
        options = {"kind": ("a", "b")}

    class Declared(Base):
        hyperparameters = {"size": Hyper(4, low=1, cite="a paper", help="how many"),
                           "mode": Hyper("x", choices=("x", "y"), cite="tunelab's", help="which")}

        def __init__(self, size: int = 4, mode: str = "x"):
            self.size, self.mode = size, mode

    assert Declared.ranges == {"size": (1, None), "inherited": (0, 1)}
    assert Declared.options == {"kind": ("a", "b"), "mode": ("x", "y")}
    assert Base.ranges == {"inherited": (0, 1)} and Base.hyperparameters == {}
    assert Declared.check_params({"size": 0, "mode": "z"}, "g") == [
        "g.size: must be >= 1, got 0", "g.mode: expected one of x, y, got 'z'"]
    assert declaration_problems(Declared) == []

    class Drifted(Declared):
        hyperparameters = dict(Declared.hyperparameters)

        def __init__(self, size: int = 5, extra: int = 1):
            pass

    assert declaration_problems(Drifted) == [
        "Drifted.mode: declared, not an __init__ parameter", "Drifted.extra: an __init__ parameter with no declaration",
        "Drifted.size: __init__ default 5, declared 4"]

    with pytest.raises(TypeError, match="size in both"):
        class Twice(Component):
            hyperparameters = {"size": Hyper(4, low=1)}
            ranges = {"size": (0, None)}


def test_values_compare_as_config_values():
    assert same_value((1.0, 0.0), [1.0, 0.0]) and same_value(("a", "b"), ["a", "b"])
    assert not same_value(True, 1) and not same_value((1, 2), [1]) and same_value(1e-3, 0.001)


def test_a_yaml_says_where_it_deviates():
    text = "# about\n# Deviation: rho 3 is the code's, not the paper's\nrho: 3\nstart: random  # deviation: ours\nk: 1\n"
    assert deviates(text, "rho") and deviates(text, "start") and not deviates(text, "k")
