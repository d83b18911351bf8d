"""A bisect session: its files, its step loop and its report."""
