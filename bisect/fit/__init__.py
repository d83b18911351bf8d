"""``oom-bisect fit``: what makes the failing workflow fit."""
