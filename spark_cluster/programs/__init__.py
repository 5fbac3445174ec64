"""Programs that run on the nodes, shipped by name as `python -c` text: standard library only
(torch where the all-gather needs it), Python 3.8 compatible, nothing installed on the node first.
Data to the package: they import nothing of it, and core.programs builds the line that runs one.
"""
