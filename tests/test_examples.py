"""The quickstart notebook in examples/ runs, top to bottom, in a real Jupyter kernel (nbclient + ipykernel) in a
fresh folder with no tunelab state, as a user runs it: every cell in order, matplotlib left to the kernel's own
inline backend, and the plot cells show their figures (the lab never changes the caller's backend)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def executed(notebook: Path, folder: Path, monkeypatch) -> dict:
    """The notebook run by a Jupyter kernel in `folder` (its TUNELAB_OUTPUTS under it), with its outputs."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("TUNELAB_OUTPUTS", str(folder / "outputs"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's own choice: inline figures
    book = nbformat.read(notebook, as_version=4)
    client = nbclient.NotebookClient(book, kernel_name="python3", timeout=600,
                                     resources={"metadata": {"path": str(folder)}})
    client.execute()
    return book


def outputs_of(cell) -> list[str]:
    """The mime types and streams a cell printed."""
    kinds = []
    for output in cell.get("outputs", []):
        kinds += list(output.get("data", {})) or [output.get("name", output["output_type"])]
    return kinds


def streamed(cell, name: str) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == name)


def test_the_quickstart_notebook_tunes_compares_and_shows_its_plots(tmp_path, monkeypatch):
    notebook = EXAMPLES / "quickstart.ipynb"
    cells = json.loads(notebook.read_text())["cells"]
    assert all(not cell.get("outputs") for cell in cells), "commit the notebook without outputs"
    book = executed(notebook, tmp_path, monkeypatch)
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    plots = [cell for cell in code if "plt." in cell.source or ".plot(" in cell.source]
    assert plots, "the notebook has a plot cell"
    for cell in plots:  # an inline figure, not "<Figure size ...>" text nor nothing
        assert "image/png" in outputs_of(cell), (cell.source, outputs_of(cell))
    budgets = next(cell for cell in code if "tunelab.compare(" in cell.source)
    assert "text/html" in outputs_of(budgets)  # the budgets table as a frame
    assert "sa" in str(budgets.outputs) and "random" in str(budgets.outputs)
    assert not any("warning: budget" in streamed(cell, "stderr") for cell in code)  # every run feeds its search
