"""setflow runtime: sessions, storage, database, API, CLI (grows with the next issues)."""
