"""Engine and device benchmarks: programs that print a table and write JSON (not load generation)."""
