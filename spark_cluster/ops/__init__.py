"""Work on nodes: up's stages, Ray, vLLM, follow, down, logs, sync, linktest, repair, watch."""
