"""ComfyUI itself: its API, its processes, its interpreter, finding installs."""
