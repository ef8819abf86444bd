"""Embedding models: backends, packs and the micro-batching front."""
