"""OpenSSH host certificates (PROTOCOL.certkeys): read one and check it for a host name.

paramiko negotiates the `*-cert-v01@openssh.com` host-key algorithms and checks
the server's signature with the certified key, but leaves the certificate itself
unchecked: type, validity window, principals and the CA's signature are checked here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import paramiko

CERT_SUFFIX = "-cert-v01@openssh.com"
_CERT_TYPE_HOST = 2
# Public-key fields (all SSH strings) between the nonce and the serial of a certificate, by base type.
_CERT_KEY_FIELDS = {"ssh-rsa": 2, "ssh-ed25519": 1, "ecdsa-sha2-nistp256": 2, "ecdsa-sha2-nistp384": 2,
                    "ecdsa-sha2-nistp521": 2}


@dataclass(frozen=True)
class HostCertificate:
    """The fields of an OpenSSH host certificate nodedeck checks (PROTOCOL.certkeys)."""

    cert_type: int
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical_options: bytes
    ca_blob: bytes
    signed: bytes  # the certificate up to its signature
    signature: bytes

    @classmethod
    def parse(cls, blob: bytes) -> "HostCertificate":
        """Raises ValueError when blob is not a certificate nodedeck can read."""
        pos = 0

        def string() -> bytes:
            nonlocal pos
            if pos + 4 > len(blob):
                raise ValueError("truncated certificate")
            (n,) = struct.unpack(">I", blob[pos : pos + 4])
            if pos + 4 + n > len(blob):
                raise ValueError("truncated certificate")
            pos += 4 + n
            return blob[pos - n : pos]

        def uint(size: int) -> int:
            nonlocal pos
            if pos + size > len(blob):
                raise ValueError("truncated certificate")
            pos += size
            return int.from_bytes(blob[pos - size : pos], "big")

        kind = string().decode(errors="replace")
        base = kind.removesuffix(CERT_SUFFIX)
        if base == kind or base not in _CERT_KEY_FIELDS:
            raise ValueError(f"unsupported certificate type {kind}")
        string()  # nonce
        for _ in range(_CERT_KEY_FIELDS[base]):
            string()
        uint(8)  # serial
        cert_type = uint(4)
        key_id = string().decode(errors="replace")
        packed, principals = string(), []
        i = 0
        while i < len(packed):
            (n,) = struct.unpack(">I", packed[i : i + 4])
            principals.append(packed[i + 4 : i + 4 + n].decode(errors="replace"))
            i += 4 + n
        valid_after, valid_before = uint(8), uint(8)
        critical = string()
        string()  # extensions
        string()  # reserved
        ca_blob = string()
        signed = blob[:pos]
        signature = string()
        return cls(cert_type, key_id, tuple(principals), valid_after, valid_before, critical, ca_blob,
                   signed, signature)

    def problem(self, principal: str, now: float) -> str | None:
        """Why this certificate is not valid for principal now (None when it is), signature included."""
        if self.cert_type != _CERT_TYPE_HOST:
            return f"{self.key_id!r} is not a host certificate"
        if now < self.valid_after:
            return f"{self.key_id!r} is not valid yet"
        if now >= self.valid_before:
            return f"{self.key_id!r} has expired"
        if principal not in self.principals:
            return f"{self.key_id!r} is for {', '.join(self.principals) or 'no host'}, not {principal}"
        if self.critical_options:
            return f"{self.key_id!r} has critical options nodedeck does not know"
        try:
            kind = paramiko.Message(self.ca_blob).get_text()
            ca = paramiko.PKey.from_type_string(kind, self.ca_blob)
            good = ca.verify_ssh_sig(self.signed, paramiko.Message(self.signature))
        except (paramiko.SSHException, ValueError, TypeError, struct.error):
            good = False
        return None if good else f"{self.key_id!r} has a bad signature"


def host_certificate(key: paramiko.PKey) -> HostCertificate | None:
    """The certificate the server presented with its host key, if it presented one."""
    blob = getattr(key, "public_blob", None)
    if blob is None or not blob.key_type.endswith(CERT_SUFFIX):
        return None
    return HostCertificate.parse(blob.key_blob)
