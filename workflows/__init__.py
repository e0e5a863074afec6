"""Product logic as plain functions: agent, report, narrative (arrives with the workflows issue)."""
