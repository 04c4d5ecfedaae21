"""known_hosts checking like OpenSSH: unknown keys are refused unless accepted, changed keys always."""

from __future__ import annotations

import base64
import os
import re
import subprocess
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
KEYGEN_TIMEOUT = 30.0
_FOUND = re.compile(r"# Host .* found: line (\d+)")


@dataclass(frozen=True)
class _Entry:
    file: Path
    lineno: int
    key_type: str
    key_blob: bytes
    marker: str | None  # "@revoked", "@cert-authority" or None


def _read_entries(path: Path, name: str) -> list[_Entry]:
    """The lines of path that cover name, as OpenSSH matches them: `ssh-keygen -F` (hashed names, `*`/`?` globs
    in lower case with brackets literal, `!` vetoes; @cert-authority and @revoked lines too)."""
    if not path.is_file():
        return []
    try:
        out = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], stdin=subprocess.DEVNULL,
                             capture_output=True, timeout=KEYGEN_TIMEOUT).stdout
    except FileNotFoundError:
        raise HostKeyError("ssh-keygen: not found on PATH (nodedeck reads known_hosts through OpenSSH's "
                           "`ssh-keygen -F`: install the OpenSSH client)") from None
    except subprocess.TimeoutExpired:
        raise HostKeyError(f"{path}: ssh-keygen -F did not finish within {KEYGEN_TIMEOUT:g}s") from None
    entries, lineno = [], 0
    for line in out.decode(errors="replace").splitlines():   # `# Host NAME found: line N`, then that line
        if found := _FOUND.match(line):
            lineno = int(found[1])
            continue
        fields = line.split()
        marker = fields.pop(0) if fields and fields[0].startswith("@") else None
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except ValueError:
            continue
        entries.append(_Entry(path, lineno, fields[1], blob, marker))
    return entries


class KnownHosts:
    """The user's known_hosts files (first one is written) and the global ones."""

    def __init__(self, user_files: tuple[Path, ...], global_files: tuple[Path, ...] = ()):
        self.user_files = user_files
        self.global_files = global_files

    def _all_entries(self, name: str) -> list[_Entry]:
        return [e for path in (*self.user_files, *self.global_files) for e in _read_entries(path, name)]

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
