"""The memory where other assistants work: an MCP server (`mlxmem mcp`) and a plugin for
simonw's `llm`, both over one set of operations (`memory.MemoryTools`) that call the same
Store methods as `mlxmem memory` and `mlxmem history`. Nothing here searches, deletes or
caches on its own: a delete is the store's durable erase, and every read is a store read, so
what another process deleted is gone at the next call."""
