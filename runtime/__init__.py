"""FT-HSDP runtime: replica worker, control plane and scale simulator (no torch import here)."""
