"""The workflow a bisect replays, whatever file the user has."""
