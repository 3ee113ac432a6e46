"""The PyTorch reference of ldlm (docs/model.md), as a package.

Import it with the repository's tools/ directory on the path, and run its scripts as
modules, from anywhere:

    PYTHONPATH=tools /usr/bin/python3 -m reference.generate --only sampling
    from reference import ldlm_torch, ldlm_init

Modules: ldlm_torch (the model), ldlm_init (the deterministic parameter generator),
safetensors_io, sampling (the reference sampler), generate (the dumps of tests/data).
Importing the package imports none of them, so `reference.safetensors_io` alone does
not load torch's model code.
"""
