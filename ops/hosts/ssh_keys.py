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
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import paramiko
from paramiko.agent import AgentSSH

PassphrasePrompt = Callable[[Path], "str | None"]
_OPENSSH_MAGIC = b"openssh-key-v1\0"
AGENT_TIMEOUT = 10.0


@dataclass(frozen=True)
class KeyFile:
    """An IdentityFile as found on disk: its public key blob (when readable) and whether it is encrypted.

    public_only: the private key is not there (the IdentityFile names a .pub file, or only
    path.pub exists), as when the key lives in an agent; it is offered only through the agent.
    """

    path: Path
    public_blob: bytes | None
    encrypted: bool
    public_only: bool = False


def _public_line_blob(text: bytes) -> bytes | None:
    """The key blob of an OpenSSH public key line (`type base64 [comment]`)."""
    fields = text.split()
    if len(fields) < 2 or not fields[0].startswith((b"ssh-", b"ecdsa-", b"sk-")):
        return None
    try:
        return base64.b64decode(fields[1], validate=True)
    except ValueError:
        return None


def _ssh_string(data: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = struct.unpack(">I", data[pos : pos + 4])
    return data[pos + 4 : pos + 4 + n], pos + 4 + n


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _openssh_header(text: bytes) -> tuple[bytes | None, bool]:
    """(public key blob, encrypted) from an openssh-key-v1 private key, read without decrypting it."""
    body = b"".join(line for line in text.splitlines() if line and not line.startswith(b"-----"))
    try:
        raw = base64.b64decode(body)
        if not raw.startswith(_OPENSSH_MAGIC):
            return None, False
        cipher, pos = _ssh_string(raw, len(_OPENSSH_MAGIC))
        _kdf, pos = _ssh_string(raw, pos)
        _kdf_opts, pos = _ssh_string(raw, pos)
        blob, _ = _ssh_string(raw, pos + 4)  # after the number of keys (always 1)
        return blob, cipher != b"none"
    except (ValueError, struct.error):
        return None, False


def inspect_key_file(path: Path) -> KeyFile:
    """Read path's public half without decrypting: from path.pub, the openssh-key-v1 header, or the plain key."""
    pub = _read(path.with_name(path.name + ".pub"))
    pub_blob = _public_line_blob(pub) if pub else None
    text = _read(path)
    if text is None:
        return KeyFile(path, pub_blob, False, public_only=True)
    line_blob = _public_line_blob(text)
    if line_blob is not None:  # the IdentityFile names a public key
        return KeyFile(path, line_blob, False, public_only=True)
    if b"-----BEGIN OPENSSH PRIVATE KEY-----" in text:
        blob, encrypted = _openssh_header(text)
    else:
        blob, encrypted = None, b"ENCRYPTED" in text
    if pub_blob is None and blob is None and not encrypted:
        try:
            blob = paramiko.PKey.from_path(path).asbytes()
        except (paramiko.SSHException, ValueError, TypeError, OSError):
            blob = None
    return KeyFile(path, pub_blob or blob, encrypted)


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
        files = [
            inspect_key_file(p) for p in self.identity_files if p.is_file() or p.with_name(p.name + ".pub").is_file()
        ]
        agent_keys = self._agent.get_keys() if self._agent is not None else ()
        matched: list[Offer] = []
        others: list[Offer] = []
        used: set[Path] = set()
        for key in agent_keys:
            owner = next((f for f in files if f.public_blob == key.blob and f.path not in used), None)
            if owner is not None:
                used.add(owner.path)
                matched.append(Offer(f"{owner.path} (from ssh-agent)", key))
            elif not self.identities_only:
                others.append(Offer(f"agent key {key.fingerprint}", key))
        yield from matched
        yield from others
        for f in files:
            if f.path in used:
                continue
            if f.public_only:
                self.problems.append(f"key {f.path}: only its public key is here and no agent holds it")
            else:
                yield Offer(str(f.path), None, f.path)

    def load(self, offer: Offer, prompt: PassphrasePrompt | None) -> paramiko.PKey | None:
        """The key of a file offer, or None (the reason is added to problems)."""
        path = offer.path
        assert path is not None
        encrypted = inspect_key_file(path).encrypted
        passphrase = None
        if encrypted:
            passphrase = prompt(path) if prompt is not None else None
            if not passphrase:
                self.problems.append(f"key {path} needs its passphrase: add it to ssh-agent")
                return None
        try:
            return paramiko.PKey.from_path(path, passphrase.encode() if passphrase else None)
        except (paramiko.PasswordRequiredException, TypeError):  # paramiko >= 3.2 raises TypeError
            self.problems.append(f"key {path} needs its passphrase: add it to ssh-agent")
        except (paramiko.SSHException, ValueError) as e:
            reason = "wrong passphrase" if passphrase else str(e)
            self.problems.append(f"key {path}: {reason}")
        except OSError as e:
            self.problems.append(f"key {path}: {e.strerror or e}")
        return None
