"""TLS between peers: a self-signed certificate per node, pinned by the others.

Each node's peer server makes an EC P-256 key and a self-signed certificate at
start (a few ms, never written to disk but for the instant `ssl` loads it),
whose subject alternative name is the address it serves on. It publishes the
certificate and its SHA-256 fingerprint in the job's store next to that
address. A client checks the certificate against the fingerprint, then gives
obstore exactly that certificate as a trusted root for that one peer: rustls
accepts the peer only if it proves it holds the key of that certificate and the
certificate names the address dialled. No CA is involved; a relay or a node
presenting any other self-signed certificate is refused in the handshake, before
the token is sent.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass, field

#: How long a node's certificate is valid: longer than any job, renewed at each start.
VALID_DAYS = 365


class PinnedCertificateError(RuntimeError):
    """A peer's published certificate does not match its published fingerprint."""


@dataclass(frozen=True)
class NodeCertificate:
    """A node's certificate (PEM) and private key (PEM, kept out of ``repr``)."""

    cert_pem: str
    key_pem: str = field(repr=False)

    @property
    def sha256(self) -> str:
        return fingerprint(self.cert_pem)


def make_certificate(host: str) -> NodeCertificate:
    """A fresh EC P-256 key and a self-signed certificate naming ``host`` (an IP or DNS name)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"unstall peer {host}")])
    try:
        san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        san = x509.DNSName(host)
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # clocks a little apart
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName([san]), critical=False)
        # an end-entity certificate: rustls refuses a CA certificate used as a server's
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return NodeCertificate(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode(),
    )


def fingerprint(cert_pem: str) -> str:
    """SHA-256 of the certificate's DER encoding, hex (as ``openssl x509 -fingerprint``)."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert_pem)).hexdigest()


def check_pinned(node: int, cert_pem: str, sha256: str) -> str:
    """``cert_pem`` if its fingerprint is ``sha256``; else a `PinnedCertificateError`."""
    try:
        got = fingerprint(cert_pem)
    except ValueError:
        got = "not a PEM certificate"
    if got != sha256:
        raise PinnedCertificateError(
            f"node {node}'s published certificate has SHA-256 {got}, not the published "
            f"fingerprint {sha256}: its entry in the job's store was altered or mixed up"
        )
    return cert_pem


def server_context(cert: NodeCertificate) -> ssl.SSLContext:
    """A TLS 1.3 server context for ``cert``: `ssl` loads keys from files only, so the key
    lives in a private temporary file (mode 0600) for the instant it is read."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    with tempfile.TemporaryDirectory(prefix="unstall-peer-tls-") as tmp:
        path = os.path.join(tmp, "node.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(cert.key_pem + cert.cert_pem)
        ctx.load_cert_chain(path)
    return ctx


def client_context(cert_pem: str) -> ssl.SSLContext:
    """A stdlib client context trusting only ``cert_pem`` (tests and tools; the peer
    client itself is obstore's)."""
    ctx = ssl.create_default_context(cadata=cert_pem)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx
