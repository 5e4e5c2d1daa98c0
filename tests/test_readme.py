"""The README's examples that define something run here as written (on the random-weight ``tiny`` model)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block_after(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_method_plug_in_example_runs_through_the_engine(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FUSIONRAG_STORE", str(tmp_path / "store"))
    code = _python_block_after("## Add your own method")
    assert 20 <= len(code.strip().splitlines()) <= 40  # the README promises a short example
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)
    out, rag = scope["out"], scope["rag"]
    assert out.stats.method == "key_norm" and out.stats.recompute_ratio == 0.2  # its own default ratio
    assert out.stats.recomputed_tokens > 0  # its scores chose tokens
    assert out.stats.method_stats == {"layers_seen": rag.engine.model.cfg.num_layers}  # its hook ran per layer
    assert capsys.readouterr().out.strip() == f"{out.stats.recomputed_tokens} {out.stats.method_stats}"
