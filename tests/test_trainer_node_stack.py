"""The node stack: the `node` extra pins exactly what SpecForge 0.2.0's wheel requires, the docs say
the same, and `--backend sglang` refuses another stack in one line before any process group exists."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.tiny import tiny_target_dir
from tests.test_trainer_hidden_states import write_tokenized
from trainer import capture_sglang
from trainer.hidden_states import cli as hs_cli

REPO = Path(__file__).resolve().parents[1]


def _node_extra() -> dict[str, str]:
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["node"]
    pins = {}
    for req in extra:
        name, _, version = req.partition("==")
        assert version, f"the node extra must pin {req!r} exactly"
        pins[name.strip()] = version.strip()
    return pins


def test_the_node_extra_pins_the_stack_the_capture_is_written_for():
    assert _node_extra() == capture_sglang.NODE_STACK


@pytest.mark.skipif(importlib.util.find_spec("specforge") is None, reason="specforge is not installed here")
def test_the_stack_is_what_specforges_own_wheel_requires():
    meta = importlib.metadata.metadata("specforge")
    assert meta["Version"] == capture_sglang.NODE_STACK["specforge"]
    pinned = {m.group(1).lower(): m.group(2) for r in meta.get_all("Requires-Dist")
              if (m := re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", r.strip()))}
    assert {k: v for k, v in capture_sglang.NODE_STACK.items() if k != "specforge"} == \
        {k: pinned[k] for k in ("sglang", "torch", "transformers")}


def test_docs_tell_users_the_same_install():
    readme = (REPO / "README.md").read_text()
    doc = capture_sglang.__doc__ or ""
    for text in (readme, doc):
        assert "nodedeck[trainer,node]" in text
        assert "pip install sglang" not in text and "--no-deps specforge" not in text
    for name, version in capture_sglang.NODE_STACK.items():  # each pin, in the docstring and in the README
        assert f"{name}=={version}" in doc.lower() or f"{name} {version}" in doc.lower()
        assert f"{name} {version}" in readme.lower()


def _fake_dist(root: Path, name: str, version: str, package: bool = True) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if package:
        (root / name).mkdir(exist_ok=True)
        (root / name / "__init__.py").write_text(f"__version__ = {version!r}\n")


@pytest.fixture
def isolated_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("sglang", "specforge"):
            del sys.modules[name]


def _never_init(*_a, **_k):
    raise AssertionError("the process group was started before the refusal")


def test_another_sglang_is_refused_in_one_line_before_the_process_group(tmp_path, capsys, monkeypatch,
                                                                        isolated_modules):
    fake = tmp_path / "site"
    _fake_dist(fake, "sglang", "0.5.23")   # the release `pip install sglang` brings today
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.setattr(capture_sglang, "_init_tensor_parallel", _never_init)
    write_tokenized(tmp_path / "tok.jsonl", 2)
    rc = hs_cli.main(["--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"),
                  "--out", str(tmp_path / "hs"), "--backend", "sglang"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "sglang==0.5.14 (found 0.5.23)" in err[0] and "nodedeck[trainer,node]" in err[0]
    assert not (tmp_path / "hs").exists()


@pytest.mark.skipif(importlib.util.find_spec("specforge") is None, reason="specforge is not installed here")
def test_a_boundary_that_does_not_import_is_refused_in_one_line(tmp_path, capsys, monkeypatch, isolated_modules):
    fake = tmp_path / "site"
    _fake_dist(fake, "sglang", "0.5.14")   # the right version number, but not the modules the boundary imports
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.setattr(capture_sglang, "_init_tensor_parallel", _never_init)
    write_tokenized(tmp_path / "tok.jsonl", 2)
    rc = hs_cli.main(["--model", str(tiny_target_dir()), "--data", str(tmp_path / "tok.jsonl"),
                  "--out", str(tmp_path / "hs"), "--backend", "sglang"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "SGLang boundary, which does not import here" in err[0]
