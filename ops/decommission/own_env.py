"""nodedeck's own environment on a node: what `nodedeck node setup` made there, which it makes again.

That is the venv (`<root>/.nodedeck/venv`, or where `--env DIR` put it, as the node's recorded setup says) and
the files setup leaves beside it: the wheels it pushed (`<root>/.nodedeck/wheels`, `wheelhouse`), its pip
constraints and its locks (ops/setup/lock.py). An env named with `node setup
--python` is the user's own and is never one of them. The stage logs and scripts in `<root>/.nodedeck/runs` are
the user's record, not part of it. The inventory puts every file, directory and link under these paths in class
`nodedeck_env`, left out by default (classify.py, policy.py).
"""

from __future__ import annotations

import posixpath

from ops.errors import HostError
from ops.hosts.base import Host
from ops.setup.lock import LOCKS
from ops.setup.record import TrainerSetup

SETUP_DIR = ".nodedeck"
DEFAULT_ENV = f"{SETUP_DIR}/venv"
SETUP_FILES = tuple(f"{SETUP_DIR}/{name}" for name in ("wheels", "wheelhouse", LOCKS, "constraints.txt"))


def own_paths(root: str, setup: TrainerSetup | None) -> tuple[str, ...]:
    """Where nodedeck's own environment lies on a node whose work dir is `root` and whose recorded setup is
    `setup` (None: none recorded here): the default venv (unless the user's `--python` lives there), the env
    the setup made, and the files setup leaves beside it."""
    base = root.rstrip("/") or "/"
    default = posixpath.join(base, DEFAULT_ENV)
    users = setup is not None and setup.env is None and setup.python.startswith(default + "/")
    out = [] if users else [default]
    if setup is not None and setup.env and setup.env.rstrip("/") not in out:
        out.append(setup.env.rstrip("/"))
    return (*out, *(posixpath.join(base, f) for f in SETUP_FILES))


# Each path (a leading ~ is the node user's home) as the node resolves it, NUL-terminated, in order; an empty
# field where it cannot. `-m`: the path need not exist (a venv not made yet resolves all the same).
_REALPATH_SH = r"""
for p in "$@"; do
  case $p in "~") p=$HOME ;; "~/"*) p=$HOME/${p#"~/"} ;; esac
  realpath -z -m -- "$p" 2>/dev/null || printf '\0'
done
"""


def node_realpaths(host: Host, paths: list[str]) -> list[str | None]:
    """Every path with each symlink followed on the node (None where the node gave no absolute path)."""
    if not paths:
        return []
    try:
        res = host.run(["bash", "-c", _REALPATH_SH, "nodedeck-realpath", *paths], timeout=60)
    except HostError:
        return [None] * len(paths)
    got = res.stdout.split(b"\0")[: len(paths)]
    out: list[str | None] = []
    for i in range(len(paths)):
        text = got[i].decode("utf-8", "surrogateescape") if i < len(got) else ""
        out.append(text if text.startswith("/") and len(text) < 4096 else None)
    return out


def under(path: str, dirs: tuple[str, ...]) -> bool:
    """`path` is one of `dirs` or inside one."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)
