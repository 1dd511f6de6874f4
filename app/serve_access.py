"""Serving on the local network from the window: the API key other machines must send, kept in the
system keyring as the remote endpoints' keys are (app.remote: never in a file, never in a plain-text
keyring), and the address they reach this machine at."""
from __future__ import annotations

import logging
import secrets
import socket

log = logging.getLogger("colibri.serve")

KEYRING_SERVICE = "colibri-serve"
KEYRING_ENTRY = "api_key"
LAN_HOST = "0.0.0.0"  # every interface: the network's machines reach it at lan_address()


def serve_key() -> tuple[str, bool]:
    """The server's key and whether the keyring keeps it: the one kept, else a new random one (kept
    if a keyring will; for this session only if not)."""
    from keyring.errors import KeyringError

    from app.remote import RemoteError, _keyring
    try:
        kr = _keyring()
        key = kr.get_password(KEYRING_SERVICE, KEYRING_ENTRY)
        if key:
            return key, True
        key = secrets.token_urlsafe(24)
        kr.set_password(KEYRING_SERVICE, KEYRING_ENTRY, key)
        return key, True
    except (RemoteError, KeyringError) as e:
        log.info("the server's API key is kept for this session only: %s", e)
        return secrets.token_urlsafe(24), False


def lan_address() -> str:
    """This machine's address on its network (the interface of its default route; no packet is
    sent), or 127.0.0.1 when it has none."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()
