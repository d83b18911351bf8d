"""Following ComfyUI's log files and putting their lines back into records."""
