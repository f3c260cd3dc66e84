"""Typed errors. The CLI prints them as `Error: ...` and exits 1, without a traceback."""


class MlxmemError(Exception):
    """An expected failure with a message meant for the person using mlxmem."""


class ModelNotFoundError(MlxmemError):
    """A model alias or path that cannot be resolved or is not on disk (and cannot be fetched)."""


class ModelLoadError(MlxmemError):
    """A model that exists but cannot be loaded (corrupt weights, unsupported architecture)."""


class InputError(MlxmemError):
    """User input that cannot be used as is (empty message, invalid text)."""


class DuplicateFactError(InputError):
    """A fact that an existing one already says."""


class StoreError(MlxmemError):
    """The database cannot be opened or written (held by another process, corrupt)."""


class StaleError(StoreError):
    """A write derived from data that was deleted meanwhile; it was discarded."""


class NotFoundError(MlxmemError):
    """A fact, message or conversation id that does not exist."""
