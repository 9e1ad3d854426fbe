"""Provides the reliability scenarios (state machines, bad inputs, kill -9, damaged files, serve under
faults) that the tests run short and `magnitude-bench soak` runs long."""
