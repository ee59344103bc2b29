"""The serving certificate, reloaded when its files change (HAMi uses controller-runtime's certwatcher).

One :class:`ssl.SSLContext` serves every connection; loading a new chain into it affects the handshakes
that follow, so a rotated certificate (cert-manager renewing a Secret) is picked up without a restart.
A half-written pair (the certificate updated, the key not yet) fails to load and is retried on the next
check, while the old pair keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from hami_common.errors import InvalidInput

__all__ = ["ReloadingCertificate"]

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int, int], ...]


@dataclass(eq=False)
class ReloadingCertificate:
    cert_file: Path
    key_file: Path | None = None  # None: the key is in the certificate file
    context: ssl.SSLContext = field(init=False)
    reloads: int = 0
    _stamp: Stamp = field(init=False, default=())

    def __post_init__(self) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            self._stamp = self._current_stamp()
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as err:  # a bad pair at start-up is fatal, with a clear message
            raise InvalidInput(f"cannot load the serving certificate {self.cert_file}: {err}") from err

    def _current_stamp(self) -> Stamp:
        paths = [self.cert_file] if self.key_file is None else [self.cert_file, self.key_file]
        stats = [os.stat(path) for path in paths]
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)

    def check(self) -> bool:
        """Reload if either file changed since the last good load; True when a new pair is now served.

        Runs on the event loop on purpose: the files are small, and the context must not change under a
        handshake that another thread is doing.
        """
        try:
            stamp = self._current_stamp()
            if stamp == self._stamp:
                return False
            # Try the pair on a scratch context first: a failed load can leave a context half-changed.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as err:
            log.warning("serving certificate not reloaded (keeping the previous one): %s", err)
            return False
        self._stamp = stamp
        self.reloads += 1
        log.info("serving certificate reloaded from %s", self.cert_file)
        return True

    async def watch(self, interval: float) -> None:
        """Check every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.check()
