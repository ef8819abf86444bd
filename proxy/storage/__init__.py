"""Where records live: the RecordStore protocol, SQLite, the HNSW index."""
