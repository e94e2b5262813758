"""FT-HSDP runtime: the replica worker on torchft, the control plane and the scale simulator.

This package's `__init__` imports nothing heavy; torch is imported only by the worker modules
that need it, so the control plane and the simulator run without torch.
"""
