"""ldlm.TextModel on the built-in demo model, ldlm.Tokenizer, ldlm.Config and ldlm.params."""
import json

import numpy as np
import pytest

import ldlm
from parity_support import DEMO_WEIGHTS, REPO

SHORT = dict(length=8, steps=4, threads=2)


@pytest.fixture(scope="module")
def lm():
    return ldlm.TextModel.demo()


def test_texts_and_ids_agree(lm):
    texts = lm.generate(batch=2, seed=5, **SHORT)
    ids = lm.generate_ids(batch=2, seed=5, **SHORT)
    assert isinstance(texts, list) and len(texts) == 2 and all(isinstance(t, str) for t in texts)
    assert ids.dtype == np.int64 and ids.shape == (2, 8)
    assert [lm.detokenize(row) for row in ids] == texts
    assert lm.generate(batch=2, seed=5, **SHORT) == texts  # the same seed, the same text
    assert lm.generate(batch=2, seed=6, **SHORT) != texts


def test_continue_and_infill(lm):
    prompt = "The old man"
    (text,) = lm.continue_text(prompt, seed=1, **SHORT)
    assert text.startswith(prompt)
    ids = lm.continue_ids(lm.tokenize(prompt), seed=1, **SHORT)
    assert ids.shape == (1, len(lm.tokenize(prompt)) + 8) and lm.detokenize(ids[0]) == text
    (filled,) = lm.infill("The <|mask|> sat on the mat.", seed=1, steps=4)
    assert filled.startswith("The ") and filled.endswith(" sat on the mat.") and "<|mask|>" not in filled
    masked = lm.tokenize("The cat sat.")
    masked[1] = lm.info()["mask_id"]
    out = lm.infill_ids(masked, seed=1, steps=4, batch=3)
    assert out.shape == (3, len(masked)) and (out[:, 0] == masked[0]).all() and (out[:, 2:] == masked[2:]).all()


def test_on_step_sees_every_step(lm):
    seen = []
    lm.generate(batch=2, seed=1, on_step=lambda s: seen.append(s), **SHORT)
    assert [s["step"] for s in seen] == [1, 2, 3, 4] and all(s["steps"] == 4 for s in seen)
    assert all(len(s["texts"]) == 2 and s["ids"].shape == (2, 8) for s in seen)
    assert seen[-1]["t"] < seen[0]["t"]


def test_on_step_false_cancels_and_exceptions_propagate(lm):
    with pytest.raises(ldlm.SamplingCancelled, match="cancelled"):
        lm.generate(on_step=lambda s: False, **SHORT)

    def fail(step):
        raise ValueError("stop at step %d" % step["step"])

    with pytest.raises(ValueError, match="stop at step 1"):
        lm.generate(on_step=fail, **SHORT)


def test_bad_call_options_name_the_field(lm):
    with pytest.raises(ldlm.InvalidArgument, match="length"):
        lm.generate(length=0)
    with pytest.raises(ldlm.InvalidArgument, match="sampler 'euler-x'"):
        lm.generate(sampler="euler-x", **SHORT)
    with pytest.raises(ldlm.InvalidArgument, match="mask"):
        lm.infill("no marker here", **SHORT)
    with pytest.raises(ldlm.InvalidArgument, match="on_step must be callable"):
        lm.generate(on_step=3, **SHORT)
    with pytest.raises(TypeError):
        lm.generate(seed=-1)  # seeds are unsigned 64-bit


def test_open_and_its_errors(tmp_path):
    lm = ldlm.TextModel.open(str(DEMO_WEIGHTS), precision="bf16")
    assert lm.info()["d_model"] == 128
    with pytest.raises(ldlm.IoError, match="nowhere.safetensors"):
        ldlm.TextModel.open(str(tmp_path / "nowhere.safetensors"))
    with pytest.raises(ldlm.IoError, match="not a directory"):
        ldlm.TextModel.open(str(DEMO_WEIGHTS), tokenizer_dir=str(tmp_path / "none"))


def test_tokenizer():
    gpt2 = ldlm.Tokenizer()
    assert gpt2.encode("hello world") == [31373, 995] and gpt2.decode([31373, 995]) == "hello world"
    assert gpt2.vocab_size == 50259 and gpt2.mask_id == 50258 and gpt2.pad_id == 50257
    from_dir = ldlm.Tokenizer(str(REPO / "tools" / "assets" / "gpt2"))
    assert from_dir.encode("Ünïcödé text") == gpt2.encode("Ünïcödé text")
    assert gpt2.decode(np.array([31373], dtype=np.int64)) == "hello"
    emoji = gpt2.encode("🙂")  # one character, several byte-level tokens
    assert len(emoji) > 1 and gpt2.decode(emoji) == "🙂" and gpt2.decode(emoji[:1]).endswith("\ufffd")
    with pytest.raises(ldlm.InvalidArgument, match="id 50259"):
        gpt2.decode([50259])
    with pytest.raises(ldlm.IoError, match="not a directory"):
        ldlm.Tokenizer("/nonexistent-ldlm-tokenizer")


def test_config_round_trip_and_errors(tmp_path):
    base = ldlm.Config()
    assert base.d_model == 768 and base.to_dict()["vocab_size"] == 50259
    small = ldlm.Config.from_dict({"d_model": 64, "n_heads": 4, "head_dim": 16})
    assert ldlm.Config.from_dict(small.to_dict()) == small and small != base
    path = tmp_path / "c.json"
    path.write_text(small.to_json())
    assert ldlm.Config.load(str(path)) == small
    assert json.loads(small.to_json())["d_model"] == 64
    demo = ldlm.Config.from_weights(str(DEMO_WEIGHTS))
    assert demo == ldlm.load_model(str(DEMO_WEIGHTS), modules=[]).config
    with pytest.raises(ldlm.ConfigError, match="'colour'"):
        ldlm.Config.from_dict({"colour": 1})
    with pytest.raises(ldlm.ConfigError, match="'d_model' must be an integer"):
        ldlm.Config.from_dict({"d_model": 1.5})
    import pickle
    assert pickle.loads(pickle.dumps(small)) == small
    with pytest.raises(ldlm.IoError, match="missing.json"):
        ldlm.Config.load(str(tmp_path / "missing.json"))
    not_weights = tmp_path / "c.safetensors"
    not_weights.write_text("{}")
    with pytest.raises(ldlm.FormatError, match="c.safetensors"):
        ldlm.Config.from_weights(str(not_weights))
    with pytest.raises(ldlm.ConfigError, match="head"):
        ldlm.params({"d_model": 64})  # n_heads * head_dim must equal d_model


def test_params_is_the_parameter_table():
    table = ldlm.params(ldlm.Config())
    modules = ["feature_model", "encoder", "latent_decoder", "token_decoder", "denoiser"]
    assert [k for k in table if k in modules] == modules
    assert table["total"]["trained"] == sum(table[m]["trained"] for m in modules)
    assert table["total"]["frozen"] == sum(table[m]["frozen"] for m in modules)
    assert table["feature_model"]["trained"] == 0 and table["denoiser"]["frozen"] == 0
    assert ldlm.params({"d_model": 64, "n_heads": 4, "head_dim": 16}) == ldlm.params(
        ldlm.Config.from_dict({"d_model": 64, "n_heads": 4, "head_dim": 16}))
    pytest.importorskip("torch", reason="the analytic counts of the reference need PyTorch")
    from reference import ldlm_torch
    reference = ldlm_torch.count_parameters(ldlm_torch.Config())
    assert table["total"] == {"trained": reference["trained"], "frozen": reference["frozen"]}
    for m in ("encoder", "token_decoder", "denoiser"):
        assert table[m]["trained"] == reference[m], m
    assert table["feature_model"]["frozen"] == reference["feature_model"]
    assert table["denoiser_final_layernorm"] == reference["denoiser_final_layer_norm"]
