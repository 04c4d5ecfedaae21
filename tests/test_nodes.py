"""nodes.toml: parsing, validation with file:line, the implicit local node, open_host."""

from __future__ import annotations

import os

import pytest

from ops.errors import UserError
from ops.hosts.local import LocalHost
from ops.hosts.ssh import SSHHost
from ops.nodes import DEFAULT_ROOT, NodeConfig, get_node, load_nodes, open_host
from ops.paths import config_dir

FULL = """\
# two rented nodes
[nodes.gpu1]
ssh = "gpu1"
port = 2200
root = "/data/work"
ssh_config = "~/.ssh/config"
watch = ["/data", "/"]
max_parallel = 8
metrics_url = "http://127.0.0.1:30000/metrics"
connect_timeout = 5

[nodes."gpu-2"]
ssh = "ubuntu@10.0.0.7"
metrics_url = ["http://127.0.0.1:30000/metrics", "http://127.0.0.1:8000/metrics"]

[nodes.local]
root = "~/elsewhere"
watch = "/tmp"
"""


def write(tmp_path, text):
    path = tmp_path / "nodes.toml"
    path.write_text(text)
    return path


def test_full_example(tmp_path):
    nodes = load_nodes(write(tmp_path, FULL))
    assert list(nodes) == ["local", "gpu1", "gpu-2"]
    assert nodes["gpu1"] == NodeConfig(
        name="gpu1", ssh="gpu1", port=2200, root="/data/work", ssh_config="~/.ssh/config",
        watch_paths=("/data", "/"), max_parallel=8, metrics_url=("http://127.0.0.1:30000/metrics",),
        connect_timeout=5.0,
    )
    g2 = nodes["gpu-2"]
    assert (g2.kind, g2.ssh, g2.port, g2.root, g2.max_parallel, g2.watch_paths) == (
        "ssh", "ubuntu@10.0.0.7", None, DEFAULT_ROOT, 4, ("/",))
    assert len(g2.metrics_url) == 2 and g2.target == "ubuntu@10.0.0.7"
    assert nodes["gpu1"].target == "gpu1 (port 2200)"
    local = nodes["local"]
    assert (local.kind, local.ssh, local.root, local.watch_paths) == (
        "local", None, os.path.expanduser("~/elsewhere"), ("/tmp",))


def test_missing_files(tmp_path):
    nodes = load_nodes()  # no file in the (isolated) XDG config dir
    assert list(nodes) == ["local"] and nodes["local"].root == os.path.expanduser(DEFAULT_ROOT)
    with pytest.raises(UserError, match="no such nodes file"):
        load_nodes(tmp_path / "absent.toml")
    config_dir().mkdir(parents=True)
    (config_dir() / "nodes.toml").write_text('[nodes.a]\nssh = "a"\n')
    assert list(load_nodes()) == ["local", "a"]
    with pytest.raises(UserError, match=r"unknown node 'b' \(known: a, local\)"):
        get_node(load_nodes(), "b")


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ('[nodes.gpu1]\nssh = "gpu1"\nrot = "/x"\n', 3, "nodes.gpu1.rot: unknown key 'rot'"),
        ('[nodes.gpu1]\nssh = "g"\n\n[nodes.gpu2]\nssh = "h"\nport = "22"\n', 6,
         "nodes.gpu2.port: expected a whole number"),
        ('[nodes.gpu1]\nssh = "g"\nport = true\n', 3, "nodes.gpu1.port: expected a whole number"),
        ('[nodes.gpu1]\nssh = "g"\nport = 70000\n', 3, "from 1 to 65535"),
        ('[nodes.gpu1]\nssh = "g"\nmax_parallel = 0\n', 3, "nodes.gpu1.max_parallel"),
        ('[nodes.gpu1]\nssh = "g"\nwatch = [1]\n', 3, "nodes.gpu1.watch: expected a string or a list"),
        ('[nodes.gpu1]\nssh = "g"\nroot = "work"\n', 3, "absolute path"),
        ('[nodes.gpu1]\nssh = "g"\nmetrics_url = "localhost:30000"\n', 3, "http:// or https://"),
        ('[nodes.gpu1]\nssh = ""\n', 2, "nodes.gpu1.ssh: expected a non-empty string"),
        ('\n[nodes.gpu1]\nroot = "/x"\n', 2, 'nodes.gpu1: missing key "ssh"'),
        ('[nodes.local]\nssh = "x"\n', 2, "the local node is this machine"),
        ('[nodes."bad name"]\nssh = "x"\n', 1, "node names may hold only"),
        ('[nodes]\ngpu1 = "x"\n', None, "nodes.gpu1: expected a table"),
        ('[nodes.gpu1]\nssh = "x"\n[other]\na = 1\n', 3, "unknown top-level key 'other'"),
        ('[nodes.gpu1]\nssh = "x\n', 2, "illegal character"),
        ('[nodes.gpu1]\nssh = "x"\nssh = "y"\n', 3, "Cannot overwrite a value"),
    ],
)
def test_bad_input_is_one_line_with_file_and_line(tmp_path, text, line, fragment):
    """A bad file fails to load; a bad node section fails only the commands that name that node."""
    path = write(tmp_path, text)
    try:
        nodes = load_nodes(path)
    except UserError as e:
        msg = str(e)
    else:
        assert len(nodes.errors) == 1 and ("local" in nodes or "local" in nodes.errors)
        with pytest.raises(UserError) as e:
            get_node(nodes, next(iter(nodes.errors)))
        msg = str(e.value)
    assert "\n" not in msg and fragment.lower() in msg.lower()
    assert msg.startswith(f"{path}:{line}:" if line else f"{path}")


def test_open_host(tmp_path, sshd):
    path = write(
        tmp_path,
        f'[nodes.testnode]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\n'
        'root = "~/nd-work"\nconnect_timeout = 3\n',
    )
    nodes = load_nodes(path)
    local = open_host(nodes["local"])
    assert isinstance(local, LocalHost) and local.name == "local"
    audit = []
    host = open_host(nodes["testnode"], audit=lambda h, c: audit.append(c))
    try:
        assert isinstance(host, SSHHost) and host.connect_timeout == 3.0
        assert host.target.port == sshd.port and host.target.hostname == "127.0.0.1"
        assert host.run(["echo", "up"]).check().text == "up\n"
        assert audit == ["echo up"]
        assert nodes["testnode"].root_on(host) == host.home() + "/nd-work"
        assert nodes["local"].root_on(local) == nodes["local"].root
    finally:
        host.close()
