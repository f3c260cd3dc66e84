"""Throwing away derived copies of the person's text after they delete or edit something."""

from __future__ import annotations

from mlxmem import paths


def forget_caches() -> int:
    """Delete every file under the KV cache directory; return how many.

    A KV cache mirrors a prompt, so it may hold a deleted fact or turn. The cache is only an
    optimization: the engine rebuilds it from the store on the next call.
    """
    root = paths.cache_dir()
    removed = 0
    # Deepest first, so that emptied folders can go too.
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)
            removed += 1
    return removed
