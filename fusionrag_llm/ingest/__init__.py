"""Offline side: embeddings, neighbour search, chunking."""
