"""Scheduler: task state machine, placement, resource accounting, network shell."""
