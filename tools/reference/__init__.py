"""The PyTorch reference of ldlm (docs/model.md): ldlm_torch, ldlm_init, safetensors_io, sampling."""
