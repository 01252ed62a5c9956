"""Persistent-volume semantics shared by the scheduler and the PV controller."""
