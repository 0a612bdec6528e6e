"""Encryption at rest and compression of a store's values, blobs, archive objects and exports.

`wal.open(path, encryption=KEY_OR_PROVIDER, compression="zstd")`. The envelope, the keys and
why no nonce repeats: `wal.crypto.sealing` (a floor of its own, below the log: it knows nothing
of stores). Sealed stores: `wal.store.sealed`; their archives: `wal.archive.sealed`.
"""

from wal.crypto.sealing import Keyring, Sealer, key_id, train_dictionary

__all__ = ["Keyring", "Sealer", "key_id", "train_dictionary"]
