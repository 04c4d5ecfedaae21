"""A real OpenSSH sshd on 127.0.0.1 with keys made in a temp dir."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_banner(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-2.0"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on port {port} gave no SSH-2.0 banner within {timeout}s")


@dataclass
class SSHServer:
    """One sshd process; `ssh_config` names it as host alias `testnode`."""

    root: Path
    port: int
    user: str
    client_key: Path
    host_key: Path
    known_hosts: Path
    ssh_config: Path
    proc: subprocess.Popen | None = None
    made_keys: dict[str, Path] = field(default_factory=dict)   # fingerprint -> a host key new_host_key made

    alias = "testnode"

    @classmethod
    def create(cls, root: Path) -> "SSHServer":
        root.mkdir(parents=True, exist_ok=True)
        host_key = root / "ssh_host_ed25519_key"
        client_key = root / "id_ed25519"
        for key in (host_key, client_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (root / "authorized_keys").write_text((root / "id_ed25519.pub").read_text())
        port = free_port()
        user = getpass.getuser()
        pub = (root / "ssh_host_ed25519_key.pub").read_text().split()
        known_hosts = root / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
        (root / "sshd_config").write_text(
            "\n".join(
                [
                    f"Port {port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {root / 'authorized_keys'}",
                    f"PidFile {root / 'sshd.pid'}",
                    "StrictModes no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "PermitRootLogin yes",
                    "UsePAM no",
                    "MaxSessions 64",
                    "MaxStartups 64:30:128",
                    "Subsystem sftp internal-sftp",
                    *_run_env(),
                    "",
                ]
            )
        )
        ssh_config = root / "ssh_config"
        ssh_config.write_text(
            f"Host {cls.alias}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n"
            f"  IdentityFile {client_key}\n  UserKnownHostsFile {known_hosts}\n"
        )
        return cls(root, port, user, client_key, host_key, known_hosts, ssh_config)

    def start(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        cfg = self.root / "sshd_config"
        subprocess.run([SSHD, "-t", "-f", str(cfg)], check=True)
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-f", str(cfg), "-E", str(self.root / "sshd.log")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_banner(self.port)

    def stop(self) -> None:
        """Kill the listener and its connection processes, like a node going down."""
        if self.proc is None:
            return
        doomed = [self.proc.pid, *_sshd_descendants(self.proc.pid)]
        for pid in doomed:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def put_first_on_path(self, bindir: Path, home: Path) -> None:
        """Restart with bindir first on the PATH of every session (fake commands of a node that lies) and
        HOME at `home` (so no shell startup file of the user running the tests puts its own dirs first)."""
        cfg = self.root / "sshd_config"
        env = " ".join([*(e.split(" ", 1)[1] for e in _run_env()), f"HOME={home}",
                        f"PATH={bindir}:{os.environ.get('PATH', '')}"])
        lines = [line for line in cfg.read_text().splitlines() if not line.startswith("SetEnv ")]
        cfg.write_text("\n".join([*lines, f"SetEnv {env}", ""]))
        self.restart()

    def new_host_key(self) -> str:
        """Restart with a freshly made host key (a reinstalled node, or an attacker); its SHA256 fingerprint."""
        made = self.root / f"made_host_key_{len(self.made_keys)}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(made)], check=True)
        out = subprocess.run(["ssh-keygen", "-lf", str(made)], capture_output=True, text=True, check=True)
        fingerprint = out.stdout.split()[1]
        self.made_keys[fingerprint] = made
        self.serve_host_key(fingerprint)
        return fingerprint

    def serve_host_key(self, fingerprint: str) -> None:
        """Restart serving a host key new_host_key made earlier (a key that changed back)."""
        self.stop()
        made = self.made_keys[fingerprint]
        for suffix in ("", ".pub"):
            shutil.copy(f"{made}{suffix}", f"{self.host_key}{suffix}")   # with its mode: sshd wants 0600
        self.start()

    def trust_current_host_key(self) -> None:
        """Write the key it serves now into its known_hosts (the user accepting a change they expected)."""
        pub = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")


def _sshd_descendants(root_pid: int) -> list[int]:
    """PIDs of sshd processes below root_pid (connection handlers, not user jobs)."""
    parent: dict[int, int] = {}
    comm: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        parent[int(entry.name)] = int(fields[1])
        comm[int(entry.name)] = name
    found, frontier = [], [root_pid]
    while frontier:
        p = frontier.pop()
        for child, ppid in parent.items():
            if ppid == p and comm.get(child) == "sshd":
                found.append(child)
                frontier.append(child)
    return found


def _run_env() -> list[str]:
    """Sessions over this sshd use the test run's own tmux server and temporary directory (tests/conftest.py)."""
    given = [f"{name}={os.environ[name]}" for name in ("TMUX_TMPDIR", "TMPDIR") if name in os.environ]
    return [f"SetEnv {' '.join(given)}"] if given else []


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None
