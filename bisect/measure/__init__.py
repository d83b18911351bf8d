"""One measurement: a fresh ComfyUI in the workspace replaying the prompt."""
