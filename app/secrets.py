"""API keys of endpoints: in the platform's keyring (keyring: macOS Keychain, Windows Credential Locker, the Secret
Service on Linux) where there is one, else kept for this session only. Never in settings.ini."""
from __future__ import annotations

import logging

import keyring
from keyring.errors import KeyringError

log = logging.getLogger(__name__)

SERVICE = "speclens-endpoint"
_session: dict[str, str] = {}


def keyring_available() -> bool:
    """Whether a real keyring backend is there (keyring's 'fail' backend, priority 0, keeps nothing)."""
    try:
        return keyring.get_keyring().priority > 0
    except Exception:   # a backend that cannot even say: none to trust
        return False


def get_key(url: str) -> str:
    """The key stored for ``url`` ("" when none)."""
    if url in _session:
        return _session[url]
    if not keyring_available():
        return ""
    try:
        return keyring.get_password(SERVICE, url) or ""
    except KeyringError as exc:
        log.warning("could not read the API key of %s from the keyring: %s", url, exc)
        return ""


def set_key(url: str, key: str) -> str:
    """Store ``key`` for ``url``; returns where it went, in words, for the settings dialog to say."""
    _session[url] = key
    if not keyring_available():
        return "kept until SpecLens closes (no keyring on this system; it is never written to settings.ini)"
    try:
        if key:
            keyring.set_password(SERVICE, url, key)
        else:
            try:
                keyring.delete_password(SERVICE, url)
            except keyring.errors.PasswordDeleteError:
                pass
    except KeyringError as exc:
        log.warning("could not store the API key of %s in the keyring: %s", url, exc)
        return f"kept until SpecLens closes (the keyring refused it: {exc})"
    return f"stored in the system keyring ({type(keyring.get_keyring()).__name__})"
