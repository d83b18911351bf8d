"""The operating system's OOM killers and their evidence."""
