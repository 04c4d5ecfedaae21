"""A resumed download over the loopback sshd hashes nothing an earlier run already verified, and still
catches a copy changed here since."""

from __future__ import annotations

import os
from pathlib import Path

from ops.decommission.for_node import decommission_on
from ops.decommission.inputs import Options
from ops.decommission.localtree import DestTree
from ops.decommission.transfer import part_path
from ops.nodes import get_node, load_nodes, open_host
from tests.support.decommission_tree import MiB, local_files, make_tree


def _run(node, dest: Path):
    host = open_host(node)
    d = decommission_on(host, node, Options(dest, streams=2))
    d.run()
    host.close()
    return d


def test_a_resumed_download_rehashes_nothing_already_verified(sshd, tmp_path, monkeypatch):
    import ops.decommission.verify as verify

    root = tmp_path / "node"
    root.mkdir()
    files = make_tree(root, {"big/a.bin": 3 * MiB, "big/b.bin": 2 * MiB})
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.tn]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{root}"\n')
    node = get_node(load_nodes(cfg), "tn")
    dest = tmp_path / "dest"
    assert _run(node, dest).verdict.safe

    # run 2 stands for a resume: one file is partial again, one was changed here (same size)
    a = dest / "files/big/a.bin"
    part = part_path(dest, "big/a.bin")
    part.parent.mkdir(exist_ok=True)
    part.write_bytes(a.read_bytes()[:MiB])
    a.unlink()
    tampered = dest / "files/run train.sh"
    tampered.write_bytes(b"X" * len(files["run train.sh"]))
    hashed_on_node: list[str] = []
    hashed_here: list[str] = []
    real_digests, real_local = verify.node_digests, DestTree.hash_local

    def on_node(host, items, **kw):
        hashed_on_node.extend(p for p, _ in items)
        return real_digests(host, items, **kw)

    def here(self, path):
        hashed_here.append(path)
        return real_local(self, path)

    monkeypatch.setattr(verify, "node_digests", on_node)
    monkeypatch.setattr(DestTree, "hash_local", here)
    d2 = _run(node, dest)
    assert d2.verdict.safe, d2.verdict.missing
    assert local_files(dest) == files
    assert hashed_here == ["run train.sh"]  # changed here since it was proven: checked, found wrong, fetched again
    assert {os.path.basename(p) for p in hashed_on_node} == {"run train.sh"}
    assert d2.files["big/a.bin"].job.transferred == 2 * MiB  # resumed from the partial file
    assert all(d2.files[p].job.transferred == 0 for p in files if p not in ("big/a.bin", "run train.sh"))

    hashed_here.clear()
    hashed_on_node.clear()
    d3 = _run(node, dest)  # nothing changed anywhere: nothing hashed, nothing fetched
    assert d3.verdict.safe, d3.verdict.missing
    assert hashed_here == [] and hashed_on_node == []
    assert all(fs.job.transferred == 0 for fs in d3.files.values())
