"""The simulated lab: DGX Sparks as network namespaces with real sshd and stand-in NVIDIA tools."""
