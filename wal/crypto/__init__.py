"""Encryption at rest and compression of a store's values, blobs, archive objects and exports.

`wal.open(path, encryption=KEY_OR_PROVIDER, compression="zstd")`; the envelope, the keys and
why no nonce repeats: `wal.crypto.sealing`; the store classes: `wal.crypto.store`.
"""

from wal.crypto.sealing import Keyring, Sealer, key_id, train_dictionary

__all__ = ["Keyring", "Sealer", "key_id", "train_dictionary"]
