"""A certificate authority of the test's own and a certificate it signs for 127.0.0.1: an S3 server on
loopback (or a proxy in front of one) speaking TLS, as clients that refuse plain HTTP (LitData's obstore
client) need. Made with ``cryptography``, the library moto itself uses for its certificates."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

__all__ = ["server_certificate", "trusting"]


def _name(common: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def server_certificate(folder: Path) -> tuple[Path, Path, Path]:
    """(the authority's certificate, the server's certificate, the server's key), PEM files in ``folder``;
    the server's names 127.0.0.1 and is good for a day."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def signed(subject, public_key, *extensions):
        builder = x509.CertificateBuilder().subject_name(subject).issuer_name(_name("stallbench test CA"))
        builder = builder.public_key(public_key).serial_number(x509.random_serial_number())
        builder = builder.not_valid_before(now - datetime.timedelta(minutes=5))
        builder = builder.not_valid_after(now + datetime.timedelta(days=1))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(ca_key, hashes.SHA256())

    ca = signed(
        _name("stallbench test CA"),
        ca_key.public_key(),
        (x509.BasicConstraints(ca=True, path_length=0), True),
        (x509.KeyUsage(False, False, False, False, False, True, True, False, False), True),
    )
    server = signed(
        _name("127.0.0.1"),
        key.public_key(),
        (x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False),
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), False),
    )
    from cryptography.hazmat.primitives import serialization

    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem_key(key))
    paths[2].chmod(0o600)
    return paths


def trusting(ca: Path) -> dict[str, str]:
    """The environment that has boto3 (``AWS_CA_BUNDLE``), curl (``CURL_CA_BUNDLE``) and obstore
    (``SSL_CERT_FILE``) trust the authority whose certificate is ``ca``."""
    return dict.fromkeys(("AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"), str(ca))
