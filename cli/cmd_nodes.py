"""`nodedeck nodes`, `nodedeck run`, `nodedeck push`: the configured nodes, commands and uploads."""

from __future__ import annotations

import getpass
import posixpath
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from cli.common import host_key_flag, json_flag, number, open_node
from cli.output import emit_json, emit_table
from ops.errors import HostError, NodedeckError, UserError
from ops.hints import current
from ops.hosts.base import Host
from ops.hosts.ssh_target import SSHTarget, jump_chain, resolve
from ops.nodes import NodeConfig, load_nodes
from ops.setup import record as setup_record
from ops.setup.wheel import version_string
from ops.textsafe import printable


def register(sub) -> None:
    p = sub.add_parser("nodes", help="list the configured nodes (--check: connect and measure)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="connect to every node and show its state and latency")
    mode.add_argument(
        "--resolved", action="store_true",
        help="show each node's SSH settings as resolved from ssh_config (what `ssh -G` prints); connects nowhere",
    )
    p.add_argument("--timeout", type=number(float, unit="seconds"), default=15.0,
                   help="seconds per node for --check (default 15)")
    host_key_flag(p)
    json_flag(p)
    p.set_defaults(func=cmd_nodes)

    p = sub.add_parser("run", help="run a command on a node: nodedeck run NODE -- CMD ARGS...")
    p.add_argument("node")
    p.add_argument("argv", nargs="+", metavar="CMD", help="the command and its arguments (after --)")
    p.add_argument("--timeout", type=number(float, unit="seconds"), default=300.0,
                   help="seconds before giving up (default 300)")
    p.add_argument("--cwd", help="directory to run in on the node")
    host_key_flag(p)
    json_flag(p, "print exit status and output as JSON")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("push", help="upload a file to a node (creates the remote directory)")
    p.add_argument("node")
    p.add_argument("local", help="local file")
    p.add_argument("remote", help="remote file, or a directory (ending in /) to put it in")
    p.add_argument("--verify", action="store_true", help="compare sha256 computed on the node")
    host_key_flag(p)
    json_flag(p, "print the transfer as JSON")
    p.set_defaults(func=cmd_push)


_PROMPT_LOCK = threading.Lock()


def _tty_passphrase(path: Path) -> str | None:
    """Ask on the terminal for the passphrase of an encrypted key no agent holds (one prompt at a time)."""
    with _PROMPT_LOCK:
        try:
            return getpass.getpass(f"Enter passphrase for key {path}: ") or None
        except EOFError:
            return None


def _prompting(host: Host) -> Host:
    """host, set to ask for key passphrases when stdin is a terminal (never otherwise: scripts get one line)."""
    from ops.hosts.ssh import SSHHost  # lazy: paramiko (0.25 s) loads only for a node reached over ssh

    if isinstance(host, SSHHost) and sys.stdin.isatty():
        host.passphrase_prompt = _tty_passphrase  # asked only for a key it cannot otherwise use
    return host


def _check(args, node: NodeConfig) -> dict:
    """Connect to node, then time one command round trip."""
    try:
        with open_node(args, node) as handle:
            host = _prompting(handle.host)
            try:
                host.run(["true"], timeout=args.timeout).check()
                t0 = time.monotonic()
                host.run(["true"], timeout=args.timeout).check()
                latency = round((time.monotonic() - t0) * 1000, 1)
                return {"state": host.info().state.value, "latency_ms": latency, "error": None,
                        **_trainer(handle, args.timeout)}
            except NodedeckError as e:
                return {"state": host.info().state.value, "latency_ms": None, "error": str(e), "trainer": None,
                        "trainer_warning": None}
    except NodedeckError as e:  # the node's settings themselves are bad
        return {"state": "error", "latency_ms": None, "error": str(e), "trainer": None, "trainer_warning": None}


def _trainer(handle, timeout: float) -> dict:
    """The trainer `node setup` recorded for the node, as its `nodedeck-train --version` says now, and a
    warning when that is not this machine's nodedeck (or there is none)."""
    setup = setup_record.load(handle.store)
    again = current().command("node", "setup", handle.name)
    if setup is None:     # this machine is not a node to set up unless plans run on it (then plan check says so)
        return {"trainer": None, "trainer_warning": None if handle.node.ssh is None else
                f"no trainer set up: run `{again}`"}
    res = handle.host.run([setup.trainer, "--version"], timeout=timeout)
    said = printable(res.text.strip().splitlines()[-1] if res.ok and res.text.strip() else "", 200)
    if not res.ok or not said.startswith("nodedeck-train "):
        return {"trainer": None, "trainer_warning": f"{printable(setup.trainer)} does not run any more: "
                f"run `{again}`"}
    theirs, ours = said[len("nodedeck-train "):], version_string()
    warning = None if theirs == ours else (f"the node's trainer is {theirs}, this nodedeck is {ours}: "
                                           f"run `{again}`")
    return {"trainer": theirs, "trainer_warning": warning}


@dataclass(frozen=True)
class ResolvedSSH:
    """A target as `nodedeck nodes --resolved` shows it: the fields `ssh -G` prints, under its names."""

    hostname: str
    port: int
    user: str
    identityfile: tuple[str, ...]  # as ssh -G prints them (unexpanded)
    identityfile_expanded: tuple[str, ...]  # the files nodedeck reads
    identitiesonly: str
    identityagent: str | None
    proxyjump: str | None
    jumps: tuple[str, ...]  # each jump host as user@hostname:port, first hop first
    proxycommand: str | None
    userknownhostsfile: tuple[str, ...]
    globalknownhostsfile: tuple[str, ...]
    stricthostkeychecking: str
    hashknownhosts: str
    hostkeyalias: str | None

    @classmethod
    def of(cls, t: SSHTarget, jumps: tuple[SSHTarget, ...] = ()) -> "ResolvedSSH":
        """t as shown; jumps: its jump hosts, first hop first (jump_chain)."""
        def listed(paths: tuple[Path, ...]) -> tuple[str, ...]:
            return tuple(str(p) for p in paths) or ("none",)

        return cls(
            hostname=t.hostname, port=t.port, user=t.user, identityfile=t.identity_files_raw,
            identityfile_expanded=tuple(str(p) for p in t.identity_files),
            identitiesonly="yes" if t.identities_only else "no", identityagent=t.identity_agent,
            proxyjump=",".join(t.proxy_jump) or None, jumps=tuple(f"{h.user}@{h.hostname}:{h.port}" for h in jumps),
            proxycommand=t.proxy_command, userknownhostsfile=listed(t.user_known_hosts),
            globalknownhostsfile=listed(t.global_known_hosts), stricthostkeychecking=t.strict_host_key_checking,
            hashknownhosts="yes" if t.hash_known_hosts else "no", hostkeyalias=t.host_key_alias,
        )


def _resolved(node: NodeConfig) -> dict:
    """node's SSH settings as OpenSSH resolves them (`ssh -G`), or the one line refusing its ssh_config."""
    if node.ssh is None:
        return {"name": node.name, "kind": node.kind, "ssh": None, "error": None}
    try:
        target = resolve(node.ssh, node.ssh_config, port=node.port)
        resolved = ResolvedSSH.of(target, jump_chain(target))
    except NodedeckError as e:
        return {"name": node.name, "kind": node.kind, "ssh": None, "error": str(e)}
    return {"name": node.name, "kind": node.kind, "ssh": asdict(resolved), "error": None}


def _cmd_resolved(args, nodes: dict[str, NodeConfig]) -> int:
    rows = [_resolved(n) for n in nodes.values()]
    if args.json:
        emit_json(rows)
    else:
        table = []
        for r in rows:
            s = r["ssh"]
            if s is None:
                table.append([r["name"], "" if r["error"] else "(this machine)", "", "", "", "", "", "", r["error"]])
                continue
            proxy = (f"jump {' -> '.join(s['jumps'])}" if s["jumps"]
                     else f"command {s['proxycommand']}" if s["proxycommand"] else "")
            policy = f"strict={s['stricthostkeychecking']} hash={s['hashknownhosts']}"
            if s["hostkeyalias"]:
                policy += f" alias={s['hostkeyalias']}"
            table.append([
                r["name"], s["hostname"], s["port"], s["user"], " ".join(s["identityfile_expanded"]), proxy,
                " ".join(s["userknownhostsfile"] + s["globalknownhostsfile"]), policy, "",
            ])
        emit_table(["name", "hostname", "port", "user", "identity files", "proxy", "known hosts", "host keys",
                    "error"], table)
    return 2 if any(r["error"] for r in rows) else 0


def cmd_nodes(args) -> int:
    nodes = load_nodes(args.config)
    if nodes.errors:   # first and alone: a table without the wrong node would read as the whole file
        *before, last = [line for lines in nodes.errors.values() for line in lines]
        for error in before:
            print(f"nodedeck: {error}", file=sys.stderr)
        raise UserError(last)
    if args.resolved:
        return _cmd_resolved(args, nodes)
    rows = [
        {
            "name": n.name,
            "kind": n.kind,
            "target": n.target,
            "ssh": n.ssh,
            "port": n.port,
            "root": n.root,
            "watch": list(n.watch_paths),
            "max_parallel": n.max_parallel,
            "metrics_url": list(n.metrics_url),
        }
        for n in nodes.values()
    ]
    if args.check:
        with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
            checks = list(pool.map(lambda n: _check(args, n), nodes.values()))
        for row, check in zip(rows, checks):
            row.update(check)
    if args.json:
        emit_json(rows)
    else:
        headers = ["name", "kind", "target", "root"] + (["state", "latency", "trainer", "error"] if args.check else [])
        emit_table(
            headers,
            [
                [r["name"], r["kind"], r["target"], r["root"]]
                + (
                    [r["state"], f"{r['latency_ms']:.0f} ms" if r["latency_ms"] is not None else "",
                     r.get("trainer") or "-", r["error"]]
                    if args.check
                    else []
                )
                for r in rows
            ],
        )
        for r in rows:
            if r.get("trainer_warning"):
                print(f"nodedeck: warning: {r['name']}: {r['trainer_warning']}", file=sys.stderr)
    return 1 if args.check and any(r["error"] for r in rows) else 0


def cmd_run(args) -> int:
    with open_node(args) as handle:
        node = handle.node
        try:
            result = _prompting(handle.host).run(args.argv, timeout=args.timeout, cwd=args.cwd)
        except HostError as e:   # cut short: what the command had printed still reaches the user, then the error
            if args.json:
                emit_json({"node": node.name, "argv": list(args.argv), "returncode": None,
                           "stdout": e.partial_stdout.decode(errors="replace"),
                           "stderr": e.partial_stderr.decode(errors="replace"), "error": str(e)})
            else:
                _write_output(e.partial_stdout, e.partial_stderr)
            raise
    status = result.returncode if 0 <= result.returncode <= 255 else 255
    if args.json:
        emit_json(
            {
                "node": node.name,
                "argv": list(result.argv),
                "returncode": result.returncode,
                "stdout": result.stdout.decode(errors="replace"),
                "stderr": result.stderr.decode(errors="replace"),
                "duration_s": round(result.duration_s, 3),
            }
        )
        return status
    _write_output(result.stdout, result.stderr)
    return status


def _write_output(stdout: bytes, stderr: bytes) -> None:
    for stream, data in ((sys.stdout, stdout), (sys.stderr, stderr)):
        stream.flush()
        stream.buffer.write(data)
        stream.buffer.flush()


def remote_destination(host: Host, local: Path, remote: str) -> str:
    """REMOTE itself, or REMOTE/<local name> when REMOTE ends in / or is a directory on the node."""
    if remote.endswith("/"):
        return remote + local.name
    st = host.stat(remote)
    if st is not None and st.is_dir:
        return posixpath.join(remote, local.name)
    return remote


def cmd_push(args) -> int:
    with open_node(args) as handle:
        node = handle.node
        _prompting(handle.host)
        local = Path(args.local)
        if not local.is_file():
            raise UserError(f"{local}: not a file")
        t = handle.host.push(local, remote_destination(handle.host, local, args.remote), verify=args.verify)
    rate = t.size / max(t.duration_s, 1e-9) / 2**20
    if args.json:
        emit_json(
            {
                "node": node.name,
                "local": t.local,
                "remote": t.remote,
                "size": t.size,
                "sha256": t.sha256,
                "duration_s": round(t.duration_s, 3),
                "mib_per_s": round(rate, 1),
            }
        )
    else:
        check = f", sha256 {t.sha256} matches" if t.sha256 else ""
        print(
            f"pushed {t.local} -> {node.name}:{t.remote} "
            f"({t.size / 2**20:.1f} MiB in {t.duration_s:.1f}s, {rate:.1f} MiB/s{check})"
        )
    return 0
