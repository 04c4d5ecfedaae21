"""Issue 39 item 1: nodedeck's own environment on a node (the venv `node setup` made, and the wheels it pushed)
is its own class, listed with its size, left out and not counted against SAFE by default; an option keeps it.
The user's own env (`node setup --python`) is the user's work and stays in. Against the loopback sshd, through
the CLI, with the setup recorded in the node's state as `node setup` records it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

from cli.main import main
from ops.setup.record import TrainerSetup, save
from ops.state import StateStore


def _venv(path: Path) -> None:
    """A venv as `python3 -m venv` makes it: its bin/python3 is a symlink to /usr/bin/python3, outside any root."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = next(path.glob("lib/python3*/site-packages"))
    for i in range(30):
        (site / f"pkg{i}.py").write_text("x = 1\n" * 50)


def _node(tmp_path: Path, sshd) -> tuple[Path, Path]:
    """A node root after `node setup` and a stage run: the venv, the wheel pushed, a stage's log and outputs."""
    root = tmp_path / "node-work"
    own = root / ".nodedeck"
    _venv(own / "venv")
    (own / "wheels").mkdir(parents=True)
    (own / "wheels" / "nodedeck-0.1.0-py3-none-any.whl").write_bytes(b"PK" + b"w" * 5000)
    (own / "runs").mkdir()
    (own / "runs" / "nd-demo-prep_native-r1.log").write_text("prepared 64 records\n")
    (own / "runs" / "nd-demo-prep_native-r1.sh").write_text("#!/bin/sh\nnodedeck-train prep\n")
    (root / "demo" / "data" / "prep").mkdir(parents=True)
    (root / "demo" / "data" / "prep" / "native.jsonl").write_text('{"a": 1}\n' * 64)
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.gpu1]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{root}"\n')
    return root, cfg


def _record(python: str, env: str | None) -> None:
    store = StateStore.for_node("gpu1")
    save(store, TrainerSetup(python=python, bin_dir=os.path.dirname(python), version="0.1.0", env=env))
    store.close()


def _decommission(cfg: Path, dest: Path, *flags: str) -> tuple[int, dict, str]:
    """`nodedeck decommission gpu1 --dest DEST --yes --json`, then again as text: (status, verdict, text)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["--config", str(cfg), "decommission", "gpu1", "--dest", str(dest), "--yes", "--json", *flags])
    verdict = json.loads(out.getvalue().splitlines()[-1])
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert main(["--config", str(cfg), "decommission", "gpu1", "--dest", str(dest), "--yes", *flags]) == rc
    return rc, verdict, text.getvalue()


def test_the_setups_own_venv_is_left_out_and_safe_by_default(sshd, tmp_path):
    root, cfg = _node(tmp_path, sshd)
    _record(str(root / ".nodedeck/venv/bin/python"), str(root / ".nodedeck/venv"))
    dest = tmp_path / "dest"
    rc, verdict, text = _decommission(cfg, dest)
    assert rc == 0 and verdict["safe"], verdict["missing"]
    files = dest / "files"
    assert (files / ".nodedeck/runs/nd-demo-prep_native-r1.log").read_text() == "prepared 64 records\n"
    assert (files / ".nodedeck/runs/nd-demo-prep_native-r1.sh").exists()
    assert (files / "demo/data/prep/native.jsonl").exists()
    assert not (files / ".nodedeck/venv").exists() and not (files / ".nodedeck/wheels").exists()
    own = {x["path"] for x in verdict["excluded"] if x["class"] == "nodedeck_env"}
    assert ".nodedeck/venv/pyvenv.cfg" in own and ".nodedeck/wheels/nodedeck-0.1.0-py3-none-any.whl" in own
    assert not any(m["path"].startswith(".nodedeck/venv") for m in verdict["missing"])
    assert "nodedeck's own environment" in text and "--include nodedeck_env" in text, text
    listed = text.split("[2/7]")[0].splitlines()  # the inventory's table: the class with its files and size
    assert any(line.split()[:2] == ["nodedeck_env", "36"] and "KiB" in line for line in listed), listed


def test_an_env_elsewhere_is_found_where_the_setup_recorded_it(sshd, tmp_path):
    """`node setup --env DIR`: the env is where the record says, not at the default place."""
    root, cfg = _node(tmp_path, sshd)
    _venv(root / "envs" / "nd")
    _record(str(root / "envs/nd/bin/python"), str(root / "envs/nd"))
    rc, verdict, _ = _decommission(cfg, tmp_path / "dest")
    assert rc == 0 and verdict["safe"], verdict["missing"]
    own = {x["path"] for x in verdict["excluded"] if x["class"] == "nodedeck_env"}
    assert "envs/nd/pyvenv.cfg" in own


def test_the_users_own_env_named_with_python_is_kept_and_the_link_hint_works(sshd, tmp_path):
    """`node setup --python` installs into the user's env: it is the user's work. Its python symlink leads out of
    the roots (to /usr/bin/python3, itself a link): the hint names the file it ends at, and following it is SAFE."""
    root, cfg = _node(tmp_path, sshd)
    _venv(root / "myenv")
    _record(str(root / "myenv/bin/python"), None)
    rc, verdict, text = _decommission(cfg, tmp_path / "dest")
    assert rc == 1
    missing = {m["path"]: m["reason"] for m in verdict["missing"]}
    assert "myenv/bin/python3" in missing and not any(p.startswith(".nodedeck/venv") for p in missing)
    real = os.path.realpath("/usr/bin/python3")
    assert f"add --root {real} to keep it" in missing["myenv/bin/python3"], missing
    assert (tmp_path / "dest/files/myenv/lib").is_dir()
    rc, verdict, _ = _decommission(cfg, tmp_path / "dest", "--root", real)
    assert rc == 0 and verdict["safe"], verdict["missing"]


def test_the_option_keeps_nodedecks_env_too(sshd, tmp_path):
    root, cfg = _node(tmp_path, sshd)
    _record(str(root / ".nodedeck/venv/bin/python"), str(root / ".nodedeck/venv"))
    dest = tmp_path / "dest"
    rc, verdict, _ = _decommission(cfg, dest, "--include", "nodedeck_env", "--accept-outside-links")
    assert rc == 0 and verdict["safe"], verdict["missing"]
    assert (dest / "files/.nodedeck/venv/pyvenv.cfg").exists()
    assert os.readlink(dest / "files/.nodedeck/venv/bin/python3") == "/usr/bin/python3"
    assert not any(x["class"] == "nodedeck_env" for x in verdict["excluded"])
