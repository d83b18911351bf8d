"""Where ComfyUI's Windows builds keep their installs and logs (portable build and Desktop)."""

from __future__ import annotations
