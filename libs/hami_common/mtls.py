"""Mutual TLS for the HTTPS APIs HAMi serves: the client CA setting and what it asks of every handshake.

The extender (kube-scheduler's client certificate, HAMi#3030) and the webhook (kube-apiserver's, where the
apiserver is configured to present one; docs/deploy.md) take the same setting, ``--tls-client-ca-file``
(``HAMI_TLS_CLIENT_CA_FILE``). With it, a client without a certificate that CA signed is refused in the TLS
handshake, before any byte of its request is read (issue 28 item 9: forged AdmissionReviews).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from hami_common.errors import InvalidInput
from hami_common.settings import setting

__all__ = ["ClientCaSettings", "require_client_certificates"]


@dataclass(frozen=True)  # no slots: service settings combine bases by multiple inheritance
class ClientCaSettings:
    """The client CA of a served HTTPS API."""

    tls_client_ca_file: str = setting(
        "", "PEM CA bundle; with it, every client must present a certificate it signed (mutual TLS)"
    )

    def client_ca(self, serving_tls: bool) -> str:
        """The client CA file, "" for none; one without a serving certificate to require it in is an error."""
        if self.tls_client_ca_file and not serving_tls:
            raise InvalidInput("--tls-client-ca-file needs --tls-cert-file (and its key): mutual TLS is TLS")
        return self.tls_client_ca_file


def require_client_certificates(context: ssl.SSLContext, ca_file: str) -> None:
    """Make ``context`` (a server's) refuse every client without a certificate ``ca_file`` signed."""
    try:
        context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as err:  # at start-up: fatal, with a clear message
        raise InvalidInput(f"cannot load the client CA {ca_file}: {err}") from err
    context.verify_mode = ssl.CERT_REQUIRED
