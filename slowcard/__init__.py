"""slowcard: find the slow card (rank, device, DP domain, expert) in large-model clusters."""

__version__ = "0.1.0"
