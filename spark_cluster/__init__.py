"""spark-cluster: one vLLM server across DGX Sparks joined by their QSFP link."""

__version__ = "0.1.0"
