"""treeflare: federated tree models on NVIDIA FLARE."""
__version__ = "0.1.0"
