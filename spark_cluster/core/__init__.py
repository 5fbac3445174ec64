"""Pure core: inventory, recipes, plans, facts and their parsers, checks, vLLM log reading.

No SSH, no console, no I/O on nodes: every function here is tested with recorded outputs."""
