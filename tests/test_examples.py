"""The quickstart notebook in examples/ runs, top to bottom, as a user runs them (a fresh folder, no tunelab
state): each code cell in order in one namespace, figures drawn off screen."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def code_of(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    return "\n\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")


def test_the_quickstart_notebook_tunes_compares_and_plots(tmp_path):
    notebook = EXAMPLES / "quickstart.ipynb"
    cells = json.loads(notebook.read_text())["cells"]
    assert all(not cell.get("outputs") for cell in cells), "commit the notebook without outputs"
    script = tmp_path / f"{notebook.stem}.py"
    script.write_text(code_of(notebook) + "\n\nresult = comparison\n"
                      "print('METHODS', sorted(set(result.tables['budgets'].method)))\n"
                      "fig.savefig('plot.png')\n")
    env = {**os.environ, "MPLBACKEND": "Agg", "TUNELAB_OUTPUTS": str(tmp_path / "outputs")}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "METHODS ['random', 'sa']" in done.stdout
    assert (tmp_path / "plot.png").stat().st_size > 10_000
    assert "warning: budget" not in done.stderr  # every run of the notebook feeds its search
