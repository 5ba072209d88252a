"""Certificates and keys for the test control plane: CA, apiserver serving cert, client identities."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpusched.testenv.binaries import ControlPlaneError

CertBackend = Literal["auto", "cryptography", "openssl"]
#: The Service network of the test cluster; its first address goes into the serving certificate.
SERVICE_CIDR = "10.0.0.0/24"

# ------------------------------------------------------------------------------------------ certificates


@dataclass(frozen=True)
class _Identity:
    """A client certificate and its key."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every certificate and key the control plane uses (PEM files)."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    admin: _Identity
    scheduler: _Identity
    controller_manager: _Identity


_SERVING_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def _serving_ips() -> tuple[str, ...]:
    first_service_ip = next(ipaddress.ip_network(SERVICE_CIDR).hosts())
    return ("127.0.0.1", str(first_service_ip))


_CLIENTS: dict[str, tuple[str, str | None]] = {
    # name -> (CN, O)
    "admin": ("gpusched-admin", "system:masters"),
    "scheduler": ("system:kube-scheduler", None),
    "controller-manager": ("system:kube-controller-manager", None),
}


def _pki_paths(d: Path) -> Pki:
    def ident(name: str) -> _Identity:
        return _Identity(d / f"{name}.crt", d / f"{name}.key")

    return Pki(
        ca_cert=d / "ca.crt",
        ca_key=d / "ca.key",
        serving_cert=d / "apiserver.crt",
        serving_key=d / "apiserver.key",
        sa_key=d / "sa.key",
        sa_pub=d / "sa.pub",
        admin=ident("admin"),
        scheduler=ident("scheduler"),
        controller_manager=ident("controller-manager"),
    )


def _cryptography_available() -> bool:
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def generate_pki(directory: Path, backend: CertBackend = "auto") -> Pki:
    """Make a CA, the apiserver serving certificate, the service-account key pair and client certificates."""
    directory.mkdir(parents=True, exist_ok=True)
    if backend == "auto":
        backend = "cryptography" if _cryptography_available() else "openssl"
    pki = _pki_paths(directory)
    if backend == "cryptography":
        _pki_with_cryptography(pki)
    else:
        _pki_with_openssl(pki)
    for path in directory.iterdir():
        if path.suffix == ".key":
            path.chmod(0o600)
    return pki


def _pki_with_cryptography(pki: Pki) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(hours=1), now + dt.timedelta(days=365)

    def new_key(path: Path) -> ec.EllipticCurvePrivateKey:
        key = ec.generate_private_key(ec.SECP256R1())
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return key

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = new_key(pki.ca_key)
    ca_name = name("gpusched-test-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def leaf(
        cert_path: Path,
        key_path: Path,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
    ) -> None:
        key = new_key(key_path)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=True,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert_path.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))

    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in _SERVING_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _serving_ips()]
    leaf(pki.serving_cert, pki.serving_key, name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, sans)
    for ident, (cn, org) in zip(
        (pki.admin, pki.scheduler, pki.controller_manager), _CLIENTS.values(), strict=True
    ):
        leaf(ident.cert, ident.key, name(cn, org), ExtendedKeyUsageOID.CLIENT_AUTH)

    sa_key = new_key(pki.sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ControlPlaneError("neither the 'cryptography' package nor the 'openssl' command is available")
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _pki_with_openssl(pki: Pki) -> None:
    d = pki.ca_cert.parent

    def new_key(path: Path) -> None:
        _openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path), cwd=d
        )

    def config(stem: str, cn: str, org: str | None, extensions: list[str]) -> Path:
        dn = ([f"O = {org}"] if org else []) + [f"CN = {cn}"]
        text = "\n".join(
            ["[req]", "distinguished_name = dn", "prompt = no", "[dn]", *dn, "[ext]", *extensions, ""]
        )
        path = d / f"{stem}.cnf"
        path.write_text(text)
        return path

    days = "365"
    new_key(pki.ca_key)
    ca_cnf = config(
        "ca",
        "gpusched-test-ca",
        None,
        [
            "basicConstraints = critical,CA:TRUE",
            "keyUsage = critical,digitalSignature,keyCertSign,cRLSign",
            "subjectKeyIdentifier = hash",
        ],
    )
    _openssl(
        "req", "-x509", "-new", "-key", str(pki.ca_key), "-out", str(pki.ca_cert), "-days", days,
        "-config", str(ca_cnf), "-extensions", "ext", cwd=d,
    )  # fmt: skip

    def leaf(stem: str, cert: Path, key: Path, cn: str, org: str | None, usage: str, san: str = "") -> None:
        new_key(key)
        extensions = [
            "basicConstraints = critical,CA:FALSE",
            "keyUsage = critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage = {usage}",
            "authorityKeyIdentifier = keyid",
        ]
        if san:
            extensions.append(f"subjectAltName = {san}")
        cnf = config(stem, cn, org, extensions)
        csr = d / f"{stem}.csr"
        _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-config", str(cnf), cwd=d)
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", days, "-out", str(cert),
            "-extfile", str(cnf), "-extensions", "ext", cwd=d,
        )  # fmt: skip

    san = ",".join([f"DNS:{n}" for n in _SERVING_DNS] + [f"IP:{ip}" for ip in _serving_ips()])
    leaf("apiserver", pki.serving_cert, pki.serving_key, "kube-apiserver", None, "serverAuth", san)
    for (stem, (cn, org)), ident in zip(
        _CLIENTS.items(), (pki.admin, pki.scheduler, pki.controller_manager), strict=True
    ):
        leaf(stem, ident.cert, ident.key, cn, org, "clientAuth")
    new_key(pki.sa_key)
    _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub), cwd=d)




# ------------------------------------------------------------------------------- certificates issued later


def issue_certificate(
    pki: Pki,
    stem: str,
    *,
    cn: str,
    org: str | None = None,
    server: bool = False,
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> _Identity:
    """A leaf certificate signed by ``pki``'s CA, written beside it as ``<stem>.crt``/``<stem>.key``: a client
    certificate (CN = user, O = group), or with ``server`` a serving certificate for ``dns`` and ``ips``.
    Used for identities the control plane does not need at start: the kubelet's client and serving
    certificates, the apiserver's client certificate towards kubelets."""
    d = pki.ca_cert.parent
    ident = _Identity(d / f"{stem}.crt", d / f"{stem}.key")
    if _cryptography_available():
        _issue_with_cryptography(pki, ident, cn, org, server, dns, ips)
    else:
        _issue_with_openssl(pki, stem, ident, cn, org, server, dns, ips)
    ident.key.chmod(0o600)
    return ident


def _issue_with_cryptography(
    pki: Pki, ident: _Identity, cn: str, org: str | None, server: bool, dns: tuple[str, ...],
    ips: tuple[str, ...],
) -> None:  # fmt: skip
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ControlPlaneError(f"{pki.ca_key} is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    ident.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    now = dt.datetime.now(dt.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=True,
                data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(aki, critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    ident.cert.write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def _issue_with_openssl(
    pki: Pki, stem: str, ident: _Identity, cn: str, org: str | None, server: bool, dns: tuple[str, ...],
    ips: tuple[str, ...],
) -> None:  # fmt: skip
    d = pki.ca_cert.parent
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(ident.key), cwd=d
    )  # fmt: skip
    extensions = [
        "basicConstraints = critical,CA:FALSE",
        "keyUsage = critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage = {'serverAuth' if server else 'clientAuth'}",
        "authorityKeyIdentifier = keyid",
    ]
    san = ",".join([f"DNS:{n}" for n in dns] + [f"IP:{ip}" for ip in ips])
    if san:
        extensions.append(f"subjectAltName = {san}")
    dn = ([f"O = {org}"] if org else []) + [f"CN = {cn}"]
    cnf = d / f"{stem}.cnf"
    cnf.write_text(
        "\n".join(["[req]", "distinguished_name = dn", "prompt = no", "[dn]", *dn, "[ext]", *extensions, ""])
    )
    csr = d / f"{stem}.csr"
    _openssl("req", "-new", "-key", str(ident.key), "-out", str(csr), "-config", str(cnf), cwd=d)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
        "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "365", "-out", str(ident.cert),
        "-extfile", str(cnf), "-extensions", "ext", cwd=d,
    )  # fmt: skip
