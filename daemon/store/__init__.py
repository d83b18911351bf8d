"""The daemon's durable state in SQLite, and the prompts it saw run."""
