"""Install states for the bisect: resolving them, checking them out, their envs."""
