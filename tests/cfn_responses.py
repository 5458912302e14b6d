"""CloudFormation's end of a custom resource: the pre-signed response URL, served on loopback.

CloudFormation hands the provider an HTTPS URL and waits for one ``PUT`` of a JSON body
(``Status``, ``Reason``, ``PhysicalResourceId``, ``StackId``, ``RequestId``,
``LogicalResourceId``, ``NoEcho``, ``Data``; at most 4096 bytes in all: "Custom resource
response objects", CloudFormation user guide). :class:`ResponseServer` is that URL's server: TLS
with a certificate made for the test (the provider framework's Node.js process trusts it through
``NODE_EXTRA_CA_CERTS``), every request recorded as it arrived, and answered ``200`` as S3 does.
"""

from __future__ import annotations

import datetime
import json
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

#: CloudFormation's limit on a response body.
RESPONSE_LIMIT = 4096
HOST = "localhost"


@dataclass(frozen=True)
class Answer:
    """One request that reached the response URL."""

    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    at: float

    @property
    def body(self) -> dict[str, Any]:
        return dict(json.loads(self.raw))


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``localhost`` (and 127.0.0.1), and its key."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(HOST), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "response-url.pem", folder / "response-url.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class ResponseServer:
    """An HTTPS server on 127.0.0.1 that records every request to it."""

    def __init__(self, folder: Path) -> None:
        self.certificate, key = _certificate(folder)
        self.answers: list[Answer] = []
        self._lock = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server._lock:
                    server.answers.append(Answer("PUT", self.path, dict(self.headers.items()), raw, time.monotonic()))
                    server._lock.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ResponseServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def url(self, request_id: str) -> str:
        """A pre-signed-looking URL (no port: CloudFormation's never name one) for one request."""
        return f"https://{HOST}/cloudformation-custom-resource-response/{request_id}?X-Amz-Signature=0f0e"

    def for_request(self, request_id: str) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if urlsplit(a.path).path.endswith(f"/{request_id}")]

    def wait(self, request_id: str, timeout_s: float) -> Answer:
        """The first answer to ``request_id`` (fails if none arrives within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                found = [a for a in self.answers if urlsplit(a.path).path.endswith(f"/{request_id}")]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer to request {request_id} within {timeout_s} s")
                self._lock.wait(left)
