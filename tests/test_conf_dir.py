"""A checkout reads its own conf/, even where another checkout is the installed one (a git worktree on
PYTHONPATH runs its own configs, not the installed checkout's)."""
import subprocess
import sys
from pathlib import Path

from tuning.config.conf_dir import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]


def test_this_checkout_reads_its_own_conf():
    assert CONF_DIR == ROOT / "conf"


def test_a_copy_of_the_package_on_pythonpath_reads_the_conf_beside_it(tmp_path):
    copy = tmp_path / "checkout"
    (copy / "tuning" / "config").mkdir(parents=True)
    (copy / "conf").mkdir()
    (copy / "conf" / "config.yaml").write_text("defaults: []\n")
    (copy / "tuning" / "__init__.py").write_text("")
    (copy / "tuning" / "config" / "__init__.py").write_text("")
    (copy / "tuning" / "config" / "conf_dir.py").write_text((ROOT / "tuning/config/conf_dir.py").read_text())
    out = subprocess.run([sys.executable, "-c", "import tuning.config.conf_dir as c; print(c.CONF_DIR)"],
                         env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout.strip()
    assert Path(out) == copy / "conf"


def test_hydra_finds_the_lab_s_sweeper_from_outside_the_checkout(tmp_path):
    """In an editable install the lab's plugins are mapped by setuptools' finder, which Hydra cannot
    list; `tunelab run hparams_search=...` typed outside the checkout found no lab sweeper."""
    probe = ("import tunelab\n"
             "from hydra.core.plugins import Plugins\n"
             "from hydra.plugins.sweeper import Sweeper\n"
             "print(sorted(p.__module__ for p in Plugins.instance().discover(Sweeper)))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}).stdout
    assert "hydra_plugins.tunelab_optuna_sweeper.optuna_sweeper" in out, out
