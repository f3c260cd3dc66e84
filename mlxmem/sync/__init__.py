"""Sync between a person's devices through a shared folder, and export/import."""
