"""Run time: what a compiled program needs to run, apart from compile-time code.

- `loader`: emitted Triton source -> live kernels (compiled or interpreted), from memory;
- `host`: host code read once into launch plans per shape class;
- `plan`: a launch plan's steps and the buffers it reuses per stream;
- `launch`: one kernel launch of a plan (the launch-argument list, the direct launcher, TMA descriptors);
- `checks`: argument checks at the kernel boundary (`AttnfuseArgumentError`);
- `runner`: the forward and backward of one compiled program (what its ops call);
- `op`: the `torch.library` custom ops of a compiled program (forward, backward, fakes, autograd);
- `cache`: the disk cache of compiled programs (per user, validated, never imported).

Importing these modules changes no environment variable and imports no Triton: Triton
is imported when the first kernel is loaded.
"""
