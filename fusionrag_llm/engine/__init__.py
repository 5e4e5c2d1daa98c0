"""The inference engine: resolves chunk KV, selects what to recompute, prefills sparsely, decodes."""
