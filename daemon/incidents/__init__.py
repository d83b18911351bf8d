"""Incidents and the crash snapshots that record them."""
