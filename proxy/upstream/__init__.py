"""The upstream engine: client, prefix-cache hints, KV prewarm, coalescing, the local engine."""
