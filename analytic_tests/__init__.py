"""Offline analytic tests: worked numbers, selection properties, forward counts, memory and timing arithmetic."""
