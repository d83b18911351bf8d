"""What an install consists of, its history, and what changed between states."""
