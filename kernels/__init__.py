"""Triton kernels with pure-torch references (the references are the CPU path and the test oracle).

Depends on torch (and triton when present) only.
"""
