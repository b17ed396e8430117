"""Runners start the workers and coordinate a run: `local` (a process pool) for now."""
