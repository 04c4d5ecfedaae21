"""known_hosts checking like OpenSSH: unknown keys are refused unless accepted, changed keys always."""

from __future__ import annotations

import base64
import binascii
import fnmatch
import os
import time
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeys

from ops.errors import HostKeyError
from ops.hosts.host_certificate import CERT_SUFFIX, host_certificate

# Signature algorithms that use a key stored under each known_hosts key type.
_ALGORITHMS = {
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"),
}


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _host_match(name: str, pattern: str) -> bool:
    """A known_hosts host pattern: a hashed name (`|1|salt|hash`), else OpenSSH's glob (match.c: `*` and `?`,
    brackets literal as in [host]:port) compared in lower case as OpenSSH lowers (A-Z only)."""
    if pattern.startswith("|1|"):
        return HostKeys.hash_host(name, pattern) == pattern
    return fnmatch.fnmatchcase(name.translate(_ASCII_LOWER), pattern.translate(_ASCII_LOWER).replace("[", "[[]"))


@dataclass(frozen=True)
class _Entry:
    file: Path
    lineno: int
    patterns: tuple[str, ...]
    key_type: str
    key_blob: bytes
    marker: str | None  # "@revoked", "@cert-authority" or None

    def matches(self, name: str) -> bool:
        """OpenSSH's match_pattern_list: some pattern matches name and no `!pattern` does."""
        plain = [p for p in self.patterns if not p.startswith("!")]
        return any(_host_match(name, p) for p in plain) and not any(
            _host_match(name, p[1:]) for p in self.patterns if p.startswith("!"))


def _read_entries(path: Path) -> list[_Entry]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    entries = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = None
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except (binascii.Error, ValueError):
            continue
        entries.append(_Entry(path, lineno, tuple(fields[0].split(",")), fields[1], blob, marker))
    return entries


class KnownHosts:
    """The user's known_hosts files (first one is written) and the global ones."""

    def __init__(self, user_files: tuple[Path, ...], global_files: tuple[Path, ...] = ()):
        self.user_files = user_files
        self.global_files = global_files

    def _all_entries(self, name: str) -> list[_Entry]:
        found: list[_Entry] = []
        for path in (*self.user_files, *self.global_files):
            found.extend(e for e in _read_entries(path) if e.matches(name))
        return found

    def preferred_algorithms(self, name: str, offered: tuple[str, ...],
                             supported: tuple[str, ...] = ()) -> tuple[str, ...]:
        """Reorder `offered` host-key algorithms so the types already known for name come first.

        When a @cert-authority line covers name, the certificate forms (from supported) come first of all.
        """
        entries = self._all_entries(name)
        certs = []
        if any(e.marker == "@cert-authority" for e in entries):
            certs = [a + CERT_SUFFIX for a in offered if a + CERT_SUFFIX in supported]
        known = []
        for e in entries:
            if e.marker is None:
                for alg in _ALGORITHMS.get(e.key_type, (e.key_type,)):
                    if alg in offered and alg not in known:
                        known.append(alg)
        return tuple(certs) + tuple(known) + tuple(a for a in offered if a not in known)

    def verify(
        self, name: str, label: str, key: paramiko.PKey, *, accept_new: bool, principal: str | None = None
    ) -> bool:
        """Check key for name; return True when it was newly added.

        A host certificate signed by a @cert-authority listed for name is checked
        (type, validity, principal, signature) instead; one from an unknown CA falls
        back to its plain key, as OpenSSH does. Raises HostKeyError for a revoked,
        changed or (unless accept_new) unknown key, or an invalid certificate.
        label names the host in messages, e.g. "gpu1 (10.0.0.5:22)".
        """
        blob, ktype = key.asbytes(), key.get_name()
        all_entries = self._all_entries(name)
        entries = [e for e in all_entries if e.marker != "@cert-authority"]
        for e in entries:
            if e.marker == "@revoked" and e.key_blob == blob:
                raise HostKeyError(f"{label}: host key {ktype} {key.fingerprint} is revoked in {e.file}:{e.lineno}")
        try:
            cert = host_certificate(key)
        except ValueError as err:
            raise HostKeyError(f"{label}: unreadable host certificate ({err})") from None
        if cert is not None:
            for e in entries:
                if e.marker == "@revoked" and e.key_blob == cert.ca_blob:
                    raise HostKeyError(f"{label}: the CA of its host certificate is revoked in {e.file}:{e.lineno}")
            cas = [e for e in all_entries if e.marker == "@cert-authority" and e.key_blob == cert.ca_blob]
            if cas:
                problem = cert.problem(principal or name, time.time())
                if problem is not None:
                    raise HostKeyError(f"{label}: host certificate {problem}; refusing to connect")
                return False
        plain = [e for e in entries if e.marker is None]
        if any(e.key_type == ktype and e.key_blob == blob for e in plain):
            return False
        same_type = [e for e in plain if e.key_type == ktype]
        if same_type:
            e = same_type[0]
            raise HostKeyError(
                f"{label}: HOST KEY CHANGED: {ktype} key is now {key.fingerprint}, "
                f"not the one in {e.file}:{e.lineno}; refusing to connect "
                f"(remove that line if the change is expected)"
            )
        if not accept_new:
            raise HostKeyError(
                f"{label}: unknown host key {ktype} {key.fingerprint}; "
                f"check it, then pass --accept-new-host-key to trust it"
            )
        return True

    def add(self, name: str, key: paramiko.PKey, *, hashed: bool = False) -> Path:
        """Append name's key to the first user known_hosts file (created 0600, dir 0700)."""
        if not self.user_files:
            raise HostKeyError(f"{name}: no known_hosts file to record the new host key in")
        path = self.user_files[0]
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        host = HostKeys.hash_host(name) if hashed else name
        line = f"{host} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())
        return path
