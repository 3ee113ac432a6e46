"""ldlm in Python: the Latent Diffusion Language Model of the C++ library (docs/python.md).

    import ldlm
    lm = ldlm.TextModel.demo()
    lm.infill("The <|mask|> sat on the mat.", seed=1)

    model = ldlm.load_model("weights.safetensors")
    x0 = model.denoiser(x_t, t, self_cond)   # float32 numpy [B, T, d], read and returned without a copy

The names below come from the compiled module ldlm._ldlm. `ldlm.dask` (batch generation
on a Dask cluster) is imported on demand, so `import ldlm` needs no Dask.
"""
from ldlm._ldlm import (  # noqa: F401
    CheckpointError,
    Config,
    ConfigError,
    Error,
    FormatError,
    InvalidArgument,
    IoError,
    Model,
    Module,
    NumericError,
    SamplingCancelled,
    ShapeError,
    TextModel,
    Tokenizer,
    load_model,
    params,
)

from ldlm._ldlm import __version__  # noqa: E402,F401  (the CMake project's version)

__all__ = [
    "CheckpointError", "Config", "ConfigError", "Error", "FormatError", "InvalidArgument", "IoError", "Model",
    "Module", "NumericError", "SamplingCancelled", "ShapeError", "TextModel", "Tokenizer", "load_model", "params",
]

# The compiled classes print as ldlm.X, the name users import them by.
for _name in __all__:
    globals()[_name].__module__ = "ldlm"
del _name
