"""The TLS context every Kafka client gets, from KP_SSL_CAFILE, KP_SSL_CERTFILE and
KP_SSL_KEYFILE.

The settings check builds it once before anything starts (:func:`tls_problem`), so that a file
that is not what its variable says stops the start with one line naming that variable: OpenSSL
alone says ``[SSL] PEM lib`` when the first client connects, and asks on the terminal for the
passphrase of an encrypted key (there is no setting for one).
"""

from __future__ import annotations

import ssl

from worker.logs import error_line
from worker.settings import Settings

TLS_PROTOCOLS = ("SSL", "SASL_SSL")


class TLSFileError(ValueError):
    """A TLS file cannot be loaded; the message names its variable."""


def tls_context(settings: Settings) -> ssl.SSLContext:
    """The context of the TLS files in the settings, or :class:`TLSFileError`."""
    try:
        context = ssl.create_default_context(
            cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None
        )
    except OSError as exc:
        raise TLSFileError(
            f"KP_SSL_CAFILE: not a readable PEM file of CA certificates: {error_line(exc)}"
        ) from None
    # Python 3.13's default adds VERIFY_X509_STRICT, which refuses certificates that Kafka's
    # own clients and Python 3.11 accept (a CA whose basic constraints are not marked
    # critical, as keytool writes them): the same CA file must connect on every supported
    # Python. The chain and the host name are verified as before.
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    if settings.ssl_certfile:
        keyfile = settings.ssl_keyfile
        key_variable = "KP_SSL_KEYFILE" if keyfile else "KP_SSL_CERTFILE"

        def encrypted() -> str:
            raise TLSFileError(
                f"{key_variable}: the private key is encrypted; give it unencrypted "
                "(there is no setting for a passphrase)"
            )

        try:
            context.load_cert_chain(
                str(settings.ssl_certfile), str(keyfile) if keyfile else None, encrypted
            )
        except OSError as exc:
            where = (
                "KP_SSL_CERTFILE and KP_SSL_KEYFILE: cannot load the client certificate and "
                "its private key"
                if keyfile
                else "KP_SSL_CERTFILE: cannot load the client certificate and its private key "
                "(after it in the same file, or in KP_SSL_KEYFILE)"
            )
            raise TLSFileError(f"{where}: {error_line(exc)}") from None
    return context


def tls_problem(settings: Settings) -> str | None:
    """Why the TLS files of a TLS connection cannot be loaded, or None."""
    if settings.security_protocol not in TLS_PROTOCOLS:
        return None
    try:
        tls_context(settings)
    except TLSFileError as exc:
        return str(exc)
    return None
