"""The quickstart notebook: stored without outputs, matches its generator, runs top to bottom."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")


def test_notebook_is_stored_without_outputs_and_matches_its_generator():
    nbformat = pytest.importorskip("nbformat")
    stored = nbformat.read(NOTEBOOK, as_version=4)
    for cell in stored.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    sys.path.insert(0, os.path.join(ROOT, "notebooks"))
    try:
        import make_quickstart
    finally:
        sys.path.pop(0)
    generated = make_quickstart.build()
    assert [c.source for c in stored.cells] == [c.source for c in generated.cells], (
        "notebooks/quickstart.ipynb is out of date: run python notebooks/make_quickstart.py"
    )


@pytest.mark.scenario(
    slow="the notebook's every cell in a kernel of its own: train, export, translate"
)
def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

    # A `python3` kernel spec for this interpreter, found first through JUPYTER_PATH, so the
    # notebook runs with the environment under test whatever kernels the machine has.
    kernel_dir = tmp_path / "jupyter" / "kernels" / "python3"
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (tests)",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # A short run on a smaller corpus: the notebook's code paths, not its BLEU.
    workdir = tmp_path / "run"
    monkeypatch.setenv("QUICKSTART_WORKDIR", str(workdir))
    monkeypatch.setenv("QUICKSTART_STEPS", "6")
    monkeypatch.setenv(
        "QUICKSTART_SET",
        ";".join(
            [
                "data.train=synthetic:split=train,size=400,max_words=10",
                "data.dev=synthetic:split=dev,size=8,max_words=10",
                "data.test=synthetic:split=test,size=8,max_words=10",
                "data.vocab_size=300",
                "data.tokens_per_batch=512",
                "decode.batch_size=8",
                "decode.max_extra_length=8",
            ]
        ),
    )

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=600,
        # Run where Jupyter would: in notebooks/ (all outputs go to QUICKSTART_WORKDIR).
        resources={"metadata": {"path": os.path.join(ROOT, "notebooks")}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell

    images = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    # Positional encoding, learning rate, encoder self-attention, decoder cross-attention.
    assert len(images) == 4
    for name in (
        "positional_encoding",
        "learning_rate",
        "encoder_self_attention",
        "decoder_cross_attention",
    ):
        assert (workdir / "figures" / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    assert (workdir / "saved_models" / "quickstart" / "1" / "saved_model.pb").exists()
    assert (workdir / "classifier.keras").exists()
    text = "".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )
    assert "translation:" in text and "saved and reloaded" in text
