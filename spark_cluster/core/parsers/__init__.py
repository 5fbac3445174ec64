"""Parsers for what a broken node shows: kernel log, module flavour, DKMS, package history, RDMA ports.

Each takes the text the real tool prints (samples under tests/data/host-outputs/) and never
raises: what cannot be read is left out, and the checks call it unknown.
"""
