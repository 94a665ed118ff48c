"""Benchmark harnesses (UCI regression protocol, speed)."""
