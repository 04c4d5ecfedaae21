"""The keys offered to a server, in OpenSSH's order (sshconnect2.c, pubkey_prepare).

1. agent keys that match a configured IdentityFile (in the agent's order),
2. the agent's other keys, unless `IdentitiesOnly yes`,
3. the IdentityFiles not in the agent, loaded from disk.

The agent is the one IdentityAgent names (a path, `$VAR`, `SSH_AUTH_SOCK` or
`none`), else $SSH_AUTH_SOCK. An encrypted key file is never decrypted without
a passphrase: it is skipped with one line saying to add it to ssh-agent, or,
when the caller passes a prompt (the CLI on a terminal), asked for.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import paramiko
from paramiko.agent import AgentSSH

PassphrasePrompt = Callable[[Path], "str | None"]
AGENT_TIMEOUT = 10.0


def public_blob(path: Path) -> bytes | None:
    """The public key OpenSSH pairs with an IdentityFile, read without decrypting anything, as `ssh-keygen -e`
    exports it (sshkey_load_public: the file as a public key, path.pub, else the private key's own header or the
    plain key); None when it has none (an encrypted PEM key with no .pub beside it)."""
    src = path if path.is_file() else path.with_name(path.name + ".pub")
    try:   # -P "": never a prompt (nor /dev/tty: a session of its own has none)
        out = subprocess.run(["ssh-keygen", "-e", "-P", "", "-f", str(src)], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=AGENT_TIMEOUT, start_new_session=True).stdout
        # RFC 4716: ---- BEGIN ... ----, `Comment: "..."`, the key in base64, ---- END ... ----
        body = b"".join(line for line in out.splitlines()[1:-1] if b":" not in line)
        return base64.b64decode(body, validate=True) or None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _public_only(path: Path) -> bool:
    """Whether only the public key of an IdentityFile is here: path is missing (path.pub is not) or is a public key."""
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return True
    return head.startswith((b"ssh-", b"ecdsa-", b"sk-"))


class _AgentAt(AgentSSH):
    """An ssh-agent reached through an explicit socket path (paramiko's Agent only reads $SSH_AUTH_SOCK)."""

    def __init__(self, path: str):
        super().__init__()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(AGENT_TIMEOUT)
        try:
            sock.connect(path)
            self._connect(sock)
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        self._close()


def agent_socket(identity_agent: str | None) -> str | None:
    """The agent socket path ssh would use for this IdentityAgent value (None: no agent)."""
    if identity_agent is None or identity_agent == "SSH_AUTH_SOCK":
        return os.environ.get("SSH_AUTH_SOCK") or None
    if identity_agent == "none":   # as ssh.c compares it
        return None
    if identity_agent.startswith("$"):
        return os.environ.get(identity_agent[1:]) or None
    return identity_agent


@dataclass(frozen=True)
class Offer:
    """One key to try: a ready key (agent or unencrypted file) or a file still to be decrypted."""

    label: str
    key: paramiko.PKey | None
    path: Path | None = None


class KeyRing:
    """The keys for one hop, open for the duration of authentication (agent keys sign over the socket)."""

    def __init__(self, identity_files: tuple[Path, ...], identities_only: bool, identity_agent: str | None):
        self.identity_files = identity_files
        self.identities_only = identities_only
        self.socket = agent_socket(identity_agent)
        self.problems: list[str] = []
        self._agent: _AgentAt | None = None

    def __enter__(self) -> "KeyRing":
        if self.socket:
            try:
                self._agent = _AgentAt(self.socket)
            except (OSError, paramiko.SSHException) as e:
                self.problems.append(f"ssh-agent at {self.socket}: {getattr(e, 'strerror', None) or e}")
        return self

    def __exit__(self, *exc) -> None:
        if self._agent is not None:
            self._agent.close()
            self._agent = None

    def offers(self) -> Iterator[Offer]:
        """The keys to try, in OpenSSH's order."""
        files = [p for p in self.identity_files if p.is_file() or p.with_name(p.name + ".pub").is_file()]
        agent_keys = self._agent.get_keys() if self._agent is not None else ()
        blobs = {p: public_blob(p) for p in files} if agent_keys else {}
        matched: list[Offer] = []
        others: list[Offer] = []
        used: set[Path] = set()
        for key in agent_keys:
            owner = next((p for p in files if blobs[p] == key.blob and p not in used), None)
            if owner is not None:
                used.add(owner)
                matched.append(Offer(f"{owner} (from ssh-agent)", key))
            elif not self.identities_only:
                others.append(Offer(f"agent key {key.fingerprint}", key))
        yield from matched
        yield from others
        for p in files:
            if p in used:
                continue
            if _public_only(p):
                self.problems.append(f"key {p}: only its public key is here and no agent holds it")
            else:
                yield Offer(str(p), None, p)

    def load(self, offer: Offer, prompt: PassphrasePrompt | None) -> paramiko.PKey | None:
        """The key of a file offer, or None (the reason is added to problems). An encrypted key (paramiko says so
        as it reads it) is decrypted only with a passphrase from prompt."""
        path = offer.path
        assert path is not None
        passphrase = None
        while True:
            try:
                return paramiko.PKey.from_path(path, passphrase.encode() if passphrase else None)
            except (paramiko.PasswordRequiredException, TypeError):  # paramiko >= 3.2 raises TypeError
                if passphrase is None and prompt is not None and (passphrase := prompt(path)):
                    continue
                self.problems.append(f"key {path} needs its passphrase: add it to ssh-agent")
            except (paramiko.SSHException, ValueError) as e:
                reason = "wrong passphrase" if passphrase else str(e)
                self.problems.append(f"key {path}: {reason}")
            except OSError as e:
                self.problems.append(f"key {path}: {e.strerror or e}")
            return None
