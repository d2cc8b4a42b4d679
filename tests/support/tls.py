"""A certificate authority and a broker certificate for 127.0.0.1, made with the openssl
command, as many Kafka clusters' own are made: the CA's basic constraints are not marked
critical (Java's keytool and older openssl configurations write them so). Kafka's own clients
accept such a CA, and so do Python 3.11 and 3.12 by default; Python 3.13's default context
refuses it (``VERIFY_X509_STRICT``)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

_CA_CONFIG = """\
[req]
distinguished_name = dn
x509_extensions = ca
prompt = no
[dn]
CN = kp-scorer test CA
[ca]
basicConstraints = CA:TRUE
subjectKeyIdentifier = hash
"""

_BROKER_EXTENSIONS = """\
[broker]
subjectAltName = IP:127.0.0.1,DNS:localhost
"""


@dataclass(frozen=True)
class BrokerCertificates:
    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        """What a TLS listener of the broker presents."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_broker_certificates(folder: Path) -> BrokerCertificates:
    """The CA and the broker's certificate, signed by it, in ``folder`` (skips the test where
    the openssl command is missing)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make certificates")
    (folder / "ca.cnf").write_text(_CA_CONFIG)
    (folder / "broker.ext").write_text(_BROKER_EXTENSIONS)
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, request = folder / "broker.pem", folder / "broker.key", folder / "broker.csr"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-config", str(folder / "ca.cnf"), "-keyout", str(ca_key), "-out", str(ca),
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(key), "-out", str(request),
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-out", str(cert),
        "-extfile", str(folder / "broker.ext"), "-extensions", "broker",
    )  # fmt: skip
    return BrokerCertificates(ca, cert, key)


def handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> None:
    """A TLS handshake of ``client`` with a loopback listener presenting ``server``; raises
    the client's ssl.SSLError when it refuses the certificate."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            connection, _ = listener.accept()
            try:
                with server.wrap_socket(connection, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass  # the client refused the certificate
            finally:
                connection.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                client.wrap_socket(raw, server_hostname="127.0.0.1"),
            ):
                pass
        finally:
            thread.join(10)
