"""Simulations for people: the bench around the core, its runner, and the demos."""
