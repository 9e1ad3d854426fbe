"""Benchmarks: the admission stall, the prefill curve, throughput against llama.cpp, fork TTFT."""
