"""Encryption at rest for a sync folder: AES-256-GCM, the key derived from a passphrase with
scrypt. Each device has its own salt (in its device.json), so no file has two writers."""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from mlxmem.errors import InputError
from mlxmem.text import a_kind

PASSPHRASE_ENV = "MLXMEM_SYNC_PASSPHRASE"
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
NONCE_BYTES = 12
_CHECK = b"mlxmem sync key check"


class Cipher:
    """A device stream's key. seal() and open() bind each file to `aad` (device and number),
    so a file cannot be passed off as another."""

    def __init__(self, passphrase: str, salt: bytes):
        if not passphrase:
            raise InputError("the sync passphrase is empty")
        kdf = Scrypt(salt=salt, length=32, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
        self.salt = salt
        self._aead = AESGCM(kdf.derive(passphrase.encode("utf-8")))

    @classmethod
    def new(cls, passphrase: str) -> Cipher:
        return cls(passphrase, os.urandom(16))

    def seal(self, data: bytes, aad: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, data, aad.encode())

    def open(self, blob: bytes, aad: str) -> bytes | None:
        """The plaintext, or None if `blob` was not sealed with this key for `aad` (a wrong
        passphrase, a damaged or half-copied file)."""
        try:
            return self._aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad.encode())
        except (InvalidTag, ValueError):
            return None

    def describe(self, device: str) -> dict:
        """What device.json records: the KDF's parameters, the salt, and a check value that
        tells a wrong passphrase from a damaged file."""
        return {
            "cipher": "AES-256-GCM",
            "kdf": "scrypt",
            "n": SCRYPT_N,
            "r": SCRYPT_R,
            "p": SCRYPT_P,
            "salt": base64.b64encode(self.salt).decode(),
            "check": base64.b64encode(self.seal(_CHECK, device)).decode(),
        }

    @staticmethod
    def description_problem(info: object) -> str | None:
        """What is wrong with a device.json's "encryption" entry, or None."""
        if not isinstance(info, dict):
            return f"its encryption entry is {a_kind(info)}, not an object"
        for key in ("salt", "check"):
            try:
                if not base64.b64decode(info[key], validate=True):
                    return f"its encryption entry has an empty {key!r}"
            except KeyError:
                return f"its encryption entry has no {key!r}"
            except (TypeError, ValueError):
                return f"its encryption entry has a {key!r} that is not base64"
        return None

    @classmethod
    def from_description(cls, passphrase: str, info: dict, device: str) -> Cipher:
        """The key for a stream described by `info`; InputError if the passphrase is wrong or
        the description is damaged."""
        problem = cls.description_problem(info)
        if problem is not None:
            raise InputError(f"device {device}: {problem}")
        if info.get("cipher") != "AES-256-GCM" or info.get("kdf") != "scrypt":
            raise InputError(f"device {device} uses an encryption this mlxmem does not know")
        cipher = cls(passphrase, base64.b64decode(info["salt"]))
        if cipher.open(base64.b64decode(info["check"]), device) != _CHECK:
            raise InputError(
                f"wrong sync passphrase for device {device} (set {PASSPHRASE_ENV} to the one "
                "used on the other devices)"
            )
        return cipher
