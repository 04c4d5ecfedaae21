"""OpenSSH host certificates (PROTOCOL.certkeys): read by `cryptography`, checked here for a host name.

paramiko negotiates the `*-cert-v01@openssh.com` host-key algorithms and checks the server's signature with
the certified key, but leaves the certificate itself unchecked: its type, validity window, principals,
critical options and the CA's signature are checked here, as OpenSSH checks a host certificate.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import paramiko
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    SSHCertificate,
    SSHCertificateType,
    load_ssh_public_identity,
)

CERT_SUFFIX = "-cert-v01@openssh.com"


@dataclass(frozen=True)
class HostCertificate:
    """A certificate a server presented, and the key blob of the CA that signed it (as known_hosts holds it)."""

    cert: SSHCertificate
    ca_blob: bytes

    @classmethod
    def parse(cls, key_type: str, blob: bytes) -> "HostCertificate":
        """Raises ValueError when blob is not a certificate nodedeck can read."""
        try:
            cert = load_ssh_public_identity(key_type.encode() + b" " + base64.b64encode(blob))
            if not isinstance(cert, SSHCertificate):
                raise ValueError(f"{key_type} is not a certificate")
            ca = cert.signature_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
        except UnsupportedAlgorithm as e:
            raise ValueError(f"unsupported certificate type {key_type} ({e})") from None
        return cls(cert, base64.b64decode(ca.split()[1]))

    @property
    def key_id(self) -> str:
        return self.cert.key_id.decode(errors="replace")

    @property
    def principals(self) -> tuple[str, ...]:
        return tuple(p.decode(errors="replace") for p in self.cert.valid_principals)

    def problem(self, principal: str, now: float) -> str | None:
        """Why this certificate is not valid for principal now (None when it is), signature included."""
        cert, key_id = self.cert, repr(self.key_id)
        if cert.type != SSHCertificateType.HOST:
            return f"{key_id} is not a host certificate"
        if now < cert.valid_after:
            return f"{key_id} is not valid yet"
        if now >= cert.valid_before:
            return f"{key_id} has expired"
        if principal not in self.principals:
            return f"{key_id} is for {', '.join(self.principals) or 'no host'}, not {principal}"
        if cert.critical_options:
            return f"{key_id} has critical options nodedeck does not know"
        try:
            cert.verify_cert_signature()
        except (InvalidSignature, UnsupportedAlgorithm, ValueError):
            return f"{key_id} has a bad signature"
        return None


def host_certificate(key: paramiko.PKey) -> HostCertificate | None:
    """The certificate the server presented with its host key, if it presented one."""
    blob = getattr(key, "public_blob", None)
    if blob is None or not blob.key_type.endswith(CERT_SUFFIX):
        return None
    return HostCertificate.parse(blob.key_type, blob.key_blob)
