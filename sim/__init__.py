"""Simulations for people: the cocotb bench around the core (``testbench``), its runner,
the simulated network device and demos; ``models`` (what the design is checked against),
``bench`` (the benchmarks of ``make bench`` and ``make resources``) and ``softroce`` (a
Linux Soft-RoCE guest as a real peer)."""
