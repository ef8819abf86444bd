"""Where records live: the RecordStore protocol (base), its SQLite (one replica) and Redis (shared
by replicas) implementations, the HNSW vector index, the label mirror, and the change feed that
keeps a replica's index level with a shared store."""
