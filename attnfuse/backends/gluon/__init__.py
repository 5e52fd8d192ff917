"""Gluon backend (compile time): `tile_hopper` kernels -> Gluon source, sm_90a checks."""
