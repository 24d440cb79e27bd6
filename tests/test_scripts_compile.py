"""Every benchmark and eval script is valid Python for the interpreter running the tests: most of them run only
on a GPU, so a syntax error would otherwise first show there (an unterminated docstring once cost a GPU run)."""
import pathlib
import py_compile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for folder in ("benchmarks", "evals") for p in (ROOT / folder).glob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_compiles(path, tmp_path):
    py_compile.compile(str(path), cfile=str(tmp_path / "out.pyc"), doraise=True)


def test_scripts_found():
    assert len(SCRIPTS) > 20 and any(p.name == "decode_linear.py" for p in SCRIPTS)
