"""docs/python.md's "ten lines" run as written (and README.md shows the same block): the block is read from the document, so
the document cannot drift from code that works."""
import re
import runpy

import pytest

from parity_support import REPO

HEADING = "## Check your PyTorch denoiser against ldlm in ten lines"


def ten_lines() -> str:
    text = (REPO / "docs" / "python.md").read_text(encoding="utf-8")
    section = text[text.index(HEADING):]
    block = re.search(r"\n```python\n(.*?)\n```\n", section, re.S)
    assert block, "docs/python.md: no ```python block under " + HEADING
    return block.group(1) + "\n"


def test_the_block_is_ten_lines():
    lines = [line for line in ten_lines().splitlines() if line.strip()]
    assert len(lines) <= 10, f"the 'ten lines' are {len(lines)} lines"


def test_the_ten_lines_run(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch", reason="the ten lines compare with a PyTorch model")
    monkeypatch.chdir(tmp_path)  # the block writes mine.safetensors where it runs
    script = tmp_path / "ten_lines.py"
    script.write_text(ten_lines(), encoding="utf-8")
    runpy.run_path(str(script), run_name="__main__")
    assert "max |ldlm - mine| =" in capsys.readouterr().out
    assert (tmp_path / "mine.safetensors").exists()


def test_the_readme_shows_the_same_ten_lines():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"\n```python\n(.*?)\n```\n", readme, re.S)
    assert blocks, "README.md: no ```python block (the ten lines of docs/python.md belong there)"
    assert blocks[0] + "\n" == ten_lines(), "README.md's ```python block differs from docs/python.md's ten lines"
