"""The decommission wizard on LocalHost: full run, dry run, rerun, change detection, verdict."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from cli.main import main
from ops.decommission.inputs import Options
from ops.decommission.transfer import part_path
from ops.decommission.wizard import Decommission
from ops.errors import UserError
from ops.hosts.local import LocalHost
from tests.support.decommission_tree import MTIME_NS, local_files, make_tree, run_wizard, snapshot


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "node"
    root.mkdir()
    files = make_tree(root)
    return root, files


def _nodes_toml(tmp_path, root) -> str:
    p = tmp_path / "nodes.toml"
    p.write_text(f'[nodes.local]\nroot = "{root}"\n')
    return str(p)


def test_full_run_preserves_everything_and_leaves_the_node_untouched(node, tmp_path):
    root, files = node
    before = snapshot(root)
    dest = tmp_path / "dest"
    d = run_wizard(root, dest)
    assert d.verdict.safe, d.verdict.missing
    assert local_files(dest) == files
    for path in files:
        st = os.stat(dest / "files" / path)
        assert st.st_mtime_ns == MTIME_NS
        assert st.st_mode & 0o777 == os.stat(root / path).st_mode & 0o777
    assert os.readlink(dest / "files" / "latest") == "checkpoints/step-100"
    assert (dest / "files" / "empty dir").is_dir()
    assert not (dest / ".partial").exists()
    manifest = json.loads((dest / "manifest.json").read_text())
    recs = {f["path"]: f for f in manifest["files"]}
    assert set(recs) == set(files)
    assert all(r["verified"] and r["verified_by"] == "sha256" and r["source"] == f"files/{p}" for p, r in recs.items())
    assert recs["data/train.jsonl"]["class"] == "datasets"
    progress = (dest / "PROGRESS.md").read_text()
    assert "SAFE TO SHUT DOWN" in progress and "step=2, loss=2.25" in progress
    assert "No plan stage states" in progress
    assert (dest / "system-info.txt").read_text().startswith("System information of node local")
    assert snapshot(root) == before
    assert not (root / "pwned").exists() and not Path("pwned").exists()


def test_dry_run_creates_nothing_and_exits_1(node, tmp_path, capsys):
    root, _ = node
    before = snapshot(root)
    dest = tmp_path / "dest"
    rc = main(["--config", _nodes_toml(tmp_path, root), "decommission", "local", "--dest", str(dest), "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 1
    assert not dest.exists()
    assert "would download 14 files" in out and "DRY RUN: nothing was preserved" in out
    assert re.search(r"^    checkpoints +1 files +3\.0 MiB$", out, re.M), out  # the inventory's classes
    assert snapshot(root) == before


def test_rerun_resumes_partials_skips_verified_and_refetches_corrupt(node, tmp_path):
    root, files = node
    dest = tmp_path / "dest"
    run_wizard(root, dest)
    ckpt = "checkpoints/step-100/model.safetensors"
    corrupt = "hidden_states/shard_0000.safetensors"
    data = bytearray((dest / "files" / corrupt).read_bytes())
    data[100] ^= 0xFF  # same size, other bytes: only the sha256 can tell
    (dest / "files" / corrupt).write_bytes(bytes(data))
    half = len(files[ckpt]) // 2
    (dest / "files" / ckpt).unlink()
    part = part_path(dest, ckpt)
    part.parent.mkdir(parents=True)
    part.write_bytes(files[ckpt][:half])
    d = run_wizard(root, dest)
    assert d.verdict.safe, d.verdict.missing
    assert local_files(dest) == files
    moved = {p: fs.job.transferred for p, fs in d.files.items() if fs.job.transferred}
    assert moved == {ckpt: len(files[ckpt]) - half, corrupt: len(files[corrupt])}
    assert d.files[ckpt].job.offset == half


def test_files_changed_after_the_listing_are_not_claimed_safe(node, tmp_path):
    root, files = node
    dest = tmp_path / "dest"

    def meddle(ev):
        if ev.step == "download" and ev.kind == "start":
            with open(root / "run train.sh", "ab") as f:
                f.write(b"echo more\n")
            with open(root / "logs/train.log", "ab") as f:  # a growing log: preserved up to the length listed
                f.write(b"step 3\n")
            os.utime(root / "data/train.jsonl", ns=(MTIME_NS + 10**9, MTIME_NS + 10**9))
            (root / "late.txt").write_text("new\n")

    d = run_wizard(root, dest, on_event=meddle)
    assert not d.verdict.safe
    reasons = {m.path: m.reason for m in d.verdict.missing}
    assert reasons["run train.sh"].startswith("changed during download: size changed")
    assert "mtime moved" in reasons["data/train.jsonl"]
    assert "appeared on the node after the listing" in reasons["late.txt"]
    assert len(reasons) == 3
    assert (dest / "files/logs/train.log").read_bytes() == files["logs/train.log"]
    assert "logs/train.log: grew during the copy; preserved up to the 14 bytes listed" in " ".join(d.verdict.warnings)
    assert d.verdict.headline == ("NOT SAFE TO SHUT DOWN: 12 of 14 files verified; "
                                  "not preserved: 2 file(s), 1 other item(s)")
    # a rerun lists the node afresh: now everything holds
    d = run_wizard(root, dest)
    assert d.verdict.safe, d.verdict.missing


def test_verdict_lists_what_is_missing_and_exclusions_separately(node, tmp_path, capsys):
    root, _ = node
    dest = tmp_path / "dest"

    def vanish(ev):
        if ev.step == "download" and ev.kind == "start":
            (root / "data/train.jsonl").unlink()

    d = run_wizard(root, dest, on_event=vanish, exclude={"hidden_states"})
    v = d.verdict
    assert not v.safe
    assert [m.path for m in v.missing] == ["data/train.jsonl"]
    assert "deleted on the node during the download; download failed: missing" in v.missing[0].reason
    assert [x.path for x in v.excluded] == ["hidden_states/shard_0000.safetensors"]
    assert not (dest / "files/hidden_states/shard_0000.safetensors").exists()
    manifest = json.loads((dest / "manifest.json").read_text())
    rec = {f["path"]: f for f in manifest["files"]}["hidden_states/shard_0000.safetensors"]
    assert rec["action"] == "excluded" and rec["source"] is None and not rec["verified"]


def test_bad_input_is_one_line(node, tmp_path, capsys):
    root, _ = node
    cfg = _nodes_toml(tmp_path, root)
    dest = str(tmp_path / "dest")
    assert main(["--config", cfg, "decommission", "local", "--dest", dest, "--include", "weights", "--yes"]) == 2
    assert "--include weights: unknown class" in capsys.readouterr().err
    assert main(["--config", cfg, "decommission", "local", "--dest", dest, "--root", "/no/such/dir", "--yes"]) == 2
    assert "--root /no/such/dir: not found on local" in capsys.readouterr().err
    assert main(["--config", cfg, "decommission", "local", "--dest", dest, "--s3", "http://x", "--yes"]) == 2
    assert "expected s3://bucket" in capsys.readouterr().err
    (tmp_path / "afile").write_text("x")
    assert main(["--config", cfg, "decommission", "local", "--dest", str(tmp_path / "afile/sub"), "--yes"]) == 2
    assert "afile is not a directory" in capsys.readouterr().err
    with pytest.raises(UserError, match="both"):
        Decommission(LocalHost(), "local", str(root), Options(Path(dest), include={"logs"}, exclude={"logs"}))
    assert not Path(dest).exists()


def test_plan_outputs_outside_the_root_and_stage_states_are_preserved(node, tmp_path, capsys):
    from ops.state import StateStore

    root, files = node
    elsewhere = tmp_path / "scratch" / "hs"
    elsewhere.mkdir(parents=True)
    (elsewhere / "shard_0.safetensors").write_bytes(b"h" * 4096)
    plan = tmp_path / "plan.toml"
    plan.write_text(
        '[plan]\nname = "p1"\n\n[vars]\nhs = "%s"\n\n'
        '[[stage]]\nid = "prep"\ntitle = "Prepare"\ncommand = "true"\noutputs = ["${root}/data/train.jsonl"]\n\n'
        '[[stage]]\nid = "hidden"\ntitle = "Hidden states"\ncommand = "true"\ndepends_on = ["prep"]\n'
        'outputs = ["${hs}"]\n' % elsewhere
    )
    store = StateStore.for_node("local")
    store.set_stage_state("prep", "completed", detail="2 lines", plan="p1")
    store.set_stage_state("hidden", "failed", detail="exit 1", plan="p1")
    store.close()
    dest = tmp_path / "dest"
    rc = main(["--config", _nodes_toml(tmp_path, root), "decommission", "local", "--dest", str(dest), "--yes",
               "--plan", str(plan)])
    assert rc == 0, capsys.readouterr()
    assert (dest / "files/hs/shard_0.safetensors").read_bytes() == b"h" * 4096
    progress = (dest / "PROGRESS.md").read_text()
    assert "Plan `p1`:" in progress
    assert "| prep | completed | 2 lines |" in progress and "| hidden | failed | exit 1 |" in progress
    manifest = json.loads((dest / "manifest.json").read_text())
    origins = {r["path"]: (r["origin"], r["status"], r["label"]) for r in manifest["inventory"]["roots"]}
    assert origins[str(elsewhere)] == ("plan", "ok", "hs")
    assert origins[str(root / "data/train.jsonl")][1] == f"inside {root}"
