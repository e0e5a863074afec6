"""setflow's runtime, in rooms: sessions/ (a session's state: Redis store, SQL records, the
engine), jobs/ (a job's life: rows, dispatch, routing, events, the job context), api/ (HTTP);
beside them the shared leaves (settings, errors, keys, db, tables, embedded)."""
