"""The one owner of storage: where a study's and a trial's files live, local or in a bucket.

`open_storage` resolves a path or URI once into a `Storage` (a ``pyarrow.fs`` file system and a
path); every reader and writer of study and trial folders goes through it (atomic writes,
listing, streams, `hold_lock`), Ray Tune and Train get the same pair (`Storage.ray_args`), and
`check_nodes_see` refuses storage that some node of a cluster cannot see.
"""

from calibtune._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        ["Storage", "StorageError", "check_location", "open_storage", "resolve_region"],
        "._storage",
    ),
    **dict.fromkeys(
        ["StorageLockLostError", "StorageLockedError", "hold_lock", "lease_note", "lease_s"],
        "._lock",
    ),
    **dict.fromkeys(["StorageNotSharedError", "check_nodes_see"], "._probe"),
    **dict.fromkeys(["disk_full_text", "forget_full", "full_paths", "note_full"], "._atomic"),
    **dict.fromkeys(["atomic_filesystem"], "._local"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
