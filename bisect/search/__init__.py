"""The search and its verdicts, pure: no git, no processes, no files."""
