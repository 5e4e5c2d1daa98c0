"""Content-addressed, tiered store of KV entries. Depends on torch and diskcache only."""
