"""A throw-away certificate authority and the certificates it signs, for every local TLS peer.

The local stack's webhook and extender (the CA plays the cluster's caBundle), tests of the services' TLS,
benchmarks, and the real control plane (``hami_sim.realk8s``: kube-apiserver's serving certificate, the
admin's and the nodes' client certificates).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "TlsFiles", "write_serving_certificate"]

_VALID: Final = datetime.timedelta(days=1)
_SKEW: Final = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca: Path  # what the peer trusts (the webhook configuration's caBundle, the extender's caFile)
    cert: Path
    key: Path


def _name(common: str, organisations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organisations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class CertificateAuthority:
    """A CA kept in ``folder`` (``ca.crt``, ``ca.key``): made once, loaded again by a later instance, so a
    restarted peer keeps trusting what the first one signed."""

    def __init__(self, folder: Path, name: str = "hami local CA") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.cert_file = folder / "ca.crt"
        key_file = folder / "ca.key"
        if self.cert_file.exists() and key_file.exists():
            key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError(f"{key_file}: not an EC private key")
            self._key = key
            self._cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
            return
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        key_file.write_bytes(_pem_key(self._key))
        key_file.chmod(0o600)
        self.cert_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    @property
    def pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def _issue(
        self,
        stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName],
    ) -> TlsFiles:
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _VALID)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        files = TlsFiles(ca=self.cert_file, cert=self.folder / f"{stem}.crt", key=self.folder / f"{stem}.key")
        files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files.key.write_bytes(_pem_key(key))
        files.key.chmod(0o600)
        return files

    def serving(self, stem: str, hosts: tuple[str, ...] = ("127.0.0.1",), common: str = "") -> TlsFiles:
        """A server certificate naming ``hosts`` (IP addresses or DNS names) as subject alternative names."""
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        return self._issue(stem, _name(common or stem), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> TlsFiles:
        """A client certificate: kube-apiserver reads the user from CN and the groups from O."""
        return self._issue(stem, _name(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH, [])


def write_serving_certificate(folder: Path, host: str = "127.0.0.1") -> TlsFiles:
    """A certificate for ``host``, valid for a day, signed by the CA of ``folder`` (made there if absent)."""
    return CertificateAuthority(folder).serving("tls", (host,), common="hami-webhook")
