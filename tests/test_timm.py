"""Tests of the timm front end: AftVisionTransformer (aft_hub.vision) and its registered names (aft_hub.timm_models).

They cover the ground of timm's own tests/test_models.py (run in full by scripts/timm_conformance.sh) on the tiny
test variants, and check the models against independent references: parameter counts against a closed formula and
the paper's table, AFT-conv at init against AFT-simple, the fast operators against the float64 references,
intermediates against forward hooks, grad checkpointing, TorchScript, torch.fx and torch.compile against eager.
"""

from __future__ import annotations

import json
import warnings

import pytest
import safetensors.torch
import timm
import torch
from timm.models import save_for_hf

import aft_hub.timm_models  # noqa: F401  (registers the models)
from aft_hub import ops
from aft_hub.layers import mixers as mixers_module
from aft_hub.timm_models import checkpoint_filter_fn
from aft_hub.vision import AftVisionTransformer

TEST_MODELS = ["test_aft_conv", "test_aft_simple", "test_aft_full", "test_aft_local"]
GRID_FREE = ["test_aft_conv", "test_aft_simple"]  # fully convolutional
FIXED = ["test_aft_full", "test_aft_local"]  # absolute position parameters

# the paper's table (arXiv:2105.14103, ImageNet), millions of parameters
PAPER_PARAMS = {
    "aft_full_tiny": 6.3,
    "aft_full_small": 22.6,
    "aft_conv_tiny_32_11": 5.4,
    "aft_conv_tiny_192_11": 5.9,
    "aft_conv_small_16_11": 20.3,
    "aft_conv_small_384_11": 22.5,
    "aft_conv_small_384_15": 23.0,
    "aft_conv_tiny": 5.9,
    "aft_conv_small": 23.0,
    "aft_conv_base_32_25": 79.7,
}
ALL_NAMES = sorted(PAPER_PARAMS) + ["aft_simple_tiny", "aft_simple_small", "aft_local_tiny", "aft_local_small"]


def _create(name: str, **kwargs) -> AftVisionTransformer:
    return timm.create_model(name, **kwargs)


def _input(model, batch: int = 2, size: tuple[int, int] | None = None) -> torch.Tensor:
    _, h, w = model.pretrained_cfg["input_size"]
    h, w = size if size is not None else (h, w)
    return torch.randn(batch, model.in_chans, h, w)


def _n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _randomise_aft_params(model) -> None:
    """Move the zero-initialised AFT-conv gamma / beta away from 0, so that the kernels matter."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("kernel.gamma", "kernel.beta")):
                p.normal_(0.0, 1.0)


# ----------------------------------------------------------------------------------------------------------------
# registry, configurations, parameter counts
# ----------------------------------------------------------------------------------------------------------------


def test_registry_lists_every_issue_name():
    names = set(timm.list_models(["aft_*", "test_aft_*"]))
    assert names == set(ALL_NAMES) | set(TEST_MODELS)
    assert set(timm.list_models(module="timm_models")) == names


# the architectures as the issue describes them: (d, mixer, heads, kernel, grid side)
ARCH = {
    "aft_full_tiny": (192, "full", None, None, 14),
    "aft_full_small": (384, "full", None, None, 14),
    "aft_conv_tiny_32_11": (192, "conv", 32, 11, 14),
    "aft_conv_tiny_192_11": (192, "conv", 192, 11, 14),
    "aft_conv_small_16_11": (384, "conv", 16, 11, 14),
    "aft_conv_small_384_11": (384, "conv", 384, 11, 14),
    "aft_conv_small_384_15": (384, "conv", 384, 15, 14),
    "aft_conv_tiny": (192, "conv", 192, 11, 14),
    "aft_conv_small": (384, "conv", 384, 15, 14),
    "aft_conv_base_32_25": (768, "conv", 32, 25, 24),
    "aft_simple_tiny": (192, "simple", None, None, 14),
    "aft_simple_small": (384, "simple", None, None, 14),
    "aft_local_tiny": (192, "local", None, None, 14),
    "aft_local_small": (384, "local", None, None, 14),
}


def _expected_params(name: str, depth: int = 12, patch: int = 16, classes: int = 1000, rank: int = 128) -> int:
    """Closed-form parameter count from the architecture description (not from the code)."""
    d, mixer, heads, s, side = ARCH[name]
    cls = mixer == "full"  # class token: AFT-full only
    pos = mixer in ("full", "local")  # learned position embedding with the absolute bias
    T = side * side + (1 if cls else 0)
    key = heads if mixer == "conv" else d  # AFT-conv: K has one channel per head
    block = 2 * 2 * d  # norm1, norm2
    block += 3 * (d * d + d) + (d * key + key)  # q, v, output projections; k
    block += 2 * d * 4 * d + 4 * d + d  # MLP, ratio 4
    if mixer == "conv":
        block += heads * s * s + 2 * heads  # raw kernels, gamma, beta
    if mixer in ("full", "local"):
        block += 2 * T * rank  # u, v of the factorised bias
    total = depth * block + 3 * patch * patch * d + d  # blocks, patch embedding
    total += 2 * d + d * classes + classes  # final norm, head
    return total + (d if cls else 0) + (T * d if pos else 0)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_param_counts_match_formula_and_paper(name):
    model = _create(name, device="meta")  # no memory, no init cost
    n = _n_params(model)
    assert n == _expected_params(name)
    if name in PAPER_PARAMS:
        assert abs(n / 1e6 - PAPER_PARAMS[name]) / PAPER_PARAMS[name] < 0.02, (name, n)


def test_aliases_equal_their_configurations():
    assert (
        _create("aft_conv_tiny", device="meta").config_kwargs
        == _create("aft_conv_tiny_192_11", device="meta").config_kwargs
    )
    assert (
        _create("aft_conv_small", device="meta").config_kwargs
        == _create("aft_conv_small_384_15", device="meta").config_kwargs
    )


@pytest.mark.parametrize("name", ALL_NAMES + TEST_MODELS)
def test_pretrained_cfg_complete_and_without_weights(name):
    cfg = timm.models.get_pretrained_cfg(name).to_dict()
    for key in ("mean", "std", "crop_pct", "interpolation", "first_conv", "classifier", "license", "input_size"):
        assert cfg.get(key) is not None, key
    assert cfg["paper_ids"] == "arXiv:2105.14103"
    assert not any(cfg.get(k) for k in ("url", "file", "hf_hub_id", "state_dict"))  # no AFT weights exist
    model = _create(name, device="meta")
    keys = model.state_dict().keys()
    assert cfg["first_conv"] + ".weight" in keys and cfg["classifier"] + ".weight" in keys
    assert cfg["fixed_input_size"] == model.fixed_input_size
    c, h, w = cfg["input_size"]
    assert cfg["pool_size"] == (h // model.patch_size, w // model.patch_size)
    assert name not in timm.list_pretrained()


def test_pretrained_true_without_weights_fails_clearly():
    with pytest.raises(RuntimeError, match="No pretrained weights exist for test_aft_conv.*local-dir"):
        _create("test_aft_conv", pretrained=True)


def test_unknown_argument_and_bad_values_raise():
    with pytest.raises(TypeError):
        _create("test_aft_conv", not_a_model_arg=1)
    with pytest.raises(ValueError, match="mixer"):
        AftVisionTransformer(mixer="attention")
    with pytest.raises(ValueError, match="class token"):
        AftVisionTransformer(mixer="conv", class_token=True)
    with pytest.raises(ValueError, match="token"):
        AftVisionTransformer(mixer="simple", global_pool="token")
    with pytest.raises(ValueError, match="divisible"):
        AftVisionTransformer(embed_dim=64, heads=5)
    model = _create("test_aft_simple")
    with pytest.raises(ValueError, match="token"):
        model.reset_classifier(3, "token")
    with pytest.raises(ValueError, match="global_pool"):
        model.reset_classifier(3, "catavgmax")


def test_config_kwargs_rebuild_the_model_through_json():
    torch.manual_seed(0)
    model = _create("test_aft_full", num_classes=7, in_chans=1).eval()
    model.reset_classifier(5, "token")
    kwargs = json.loads(json.dumps(model.config_kwargs))
    assert kwargs["num_classes"] == 5 and kwargs["global_pool"] == "token" and kwargs["in_chans"] == 1
    rebuilt = AftVisionTransformer(**kwargs).eval()
    rebuilt.load_state_dict(model.state_dict())
    x = _input(model)
    torch.testing.assert_close(rebuilt(x), model(x), rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------------------
# forward / backward, input sizes, heads
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_name_forward_backward(name):
    torch.manual_seed(0)
    kwargs = dict(num_classes=3)
    if name.startswith(("aft_full", "aft_local")):
        kwargs["img_size"] = 48  # fixed token grid: build it for the small input
    model = _create(name, **kwargs).train()
    out = model(torch.randn(2, 3, 48, 48))
    assert out.shape == (2, 3) and torch.isfinite(out).all()
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing


@pytest.mark.parametrize("name", TEST_MODELS)
def test_forward_backward_all_parameters_get_gradients(name):
    torch.manual_seed(0)
    model = _create(name, num_classes=42, drop_path_rate=0.1, drop_rate=0.1).train()
    out = model(_input(model))
    assert out.shape == (2, 42)
    out.mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", GRID_FREE)
@pytest.mark.parametrize("size", [(64, 64), (32, 96), (104, 40), (8, 8)])
def test_fully_convolutional_any_size(name, size):
    model = _create(name).eval()
    with torch.no_grad():
        feats = model.forward_features(_input(model, size=size))
    assert feats.shape == (2, model.num_features, size[0] // 8, size[1] // 8)
    with pytest.raises(ValueError, match="divisible by the patch size"):
        model(torch.randn(1, 3, 60, 64))


@pytest.mark.parametrize("name", FIXED)
def test_fixed_grid_models_reject_other_sizes(name):
    model = _create(name).eval()
    with pytest.raises(ValueError, match="fixed 8x8 token grid"):
        model(torch.randn(1, 3, 72, 64))
    # built for another size, the same name works there
    other = _create(name, img_size=(48, 80)).eval()
    assert other(torch.randn(1, 3, 48, 80)).shape == (1, 1000)


def test_paper_models_fixed_and_free_sizes():
    full = _create("aft_full_tiny", device="meta")
    assert full.pos_embed.shape == (1, 197, 192) and full.blocks[0].mixer.pos_bias.u.shape == (197, 128)
    conv = _create("aft_conv_small_16_11", device="meta")
    assert conv.pos_embed is None and conv.cls_token is None and conv.global_pool == "avg"
    assert conv.blocks[0].mixer.k.weight.shape == (16, 384)  # K has one channel per head
    x = torch.randn(1, 3, 224, 320, device="meta")
    assert conv.forward_features(x).shape == (1, 384, 14, 20)
    with pytest.raises(ValueError, match="fixed 14x14"):
        full(x)


@pytest.mark.parametrize("name", TEST_MODELS)
def test_heads_num_classes_and_pooling(name):
    torch.manual_seed(0)
    model = _create(name).eval()
    x = _input(model)
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, model.num_features, 8, 8)
        pre = model.forward_head(feats, pre_logits=True)
        torch.testing.assert_close(pre, feats.mean((2, 3)))
        torch.testing.assert_close(model(x), model.head(pre))
        assert pre.shape == (2, model.head_hidden_size)
        model.reset_classifier(0)
        torch.testing.assert_close(model(x), pre)
        model.reset_classifier(0, "")
        assert model(x).shape == feats.shape
        model.reset_classifier(4, "max")
        torch.testing.assert_close(model.forward_head(feats, pre_logits=True), feats.amax((2, 3)))
        model.reset_classifier(4, "avgmax")
        torch.testing.assert_close(
            model.forward_head(feats, pre_logits=True), 0.5 * (feats.amax((2, 3)) + feats.mean((2, 3)))
        )
        assert model(x).shape == (2, 4) and model.get_classifier().out_features == 4
        headless = _create(name, num_classes=0, global_pool="").eval()
        assert headless(x).shape == feats.shape


def test_class_token_pooling():
    torch.manual_seed(0)
    model = _create("test_aft_full", global_pool="token").eval()
    x = _input(model)
    with torch.no_grad():
        tokens = model.forward_features(x)
        assert tokens.shape == (2, 1 + 64, 32) and model.output_fmt == "NLC"
        torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), tokens[:, 0])
        model.reset_classifier(0, "avg")
        feats = model.forward_features(x)
        torch.testing.assert_close(feats, tokens[:, 1:].transpose(1, 2).reshape(2, 32, 8, 8))


def test_in_chans_and_dtype_and_meta():
    model = _create("test_aft_conv", in_chans=1, num_classes=5)
    assert model.in_chans == 1 and model.patch_embed.proj.weight.shape[1] == 1
    assert model(torch.randn(2, 1, 64, 64)).shape == (2, 5)
    model = model.to(torch.bfloat16)
    assert model(torch.randn(2, 1, 64, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16
    meta = _create("test_aft_full", device="meta", dtype=torch.float64)
    assert all(p.device.type == "meta" and p.dtype == torch.float64 for p in meta.parameters())
    meta.reset_classifier(3)
    assert meta.head.weight.device.type == "meta" and meta.head.weight.dtype == torch.float64


# ----------------------------------------------------------------------------------------------------------------
# independent references
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conv_name,simple_name", [("test_aft_conv", "test_aft_simple"), ("aft_conv_tiny_192_11", "aft_simple_tiny")]
)
def test_aft_conv_at_init_equals_aft_simple(conv_name, simple_name):
    torch.manual_seed(0)
    conv = _create(conv_name).eval()
    simple = _create(simple_name).eval()
    sd = {k: v for k, v in conv.state_dict().items() if ".mixer.kernel." not in k}
    for i, blk in enumerate(conv.blocks):
        # AFT-simple with each head's single key broadcast to the head's channels
        D = conv.embed_dim // blk.mixer.heads
        for kind in ("weight", "bias"):
            key = f"blocks.{i}.mixer.k.{kind}"
            sd[key] = sd[key].repeat_interleave(D, dim=0)
    simple.load_state_dict(sd)
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), simple(x), rtol=1e-4, atol=1e-5)
        _randomise_aft_params(conv)  # trained kernels make a difference
        diff = (conv.forward_features(x) - simple.forward_features(x)).abs().max()
        assert diff > 1e-2


def _reference_ops(monkeypatch):
    """Route the mixers to the float64 loop references of aft_hub.ops.reference."""

    def cast(fn):
        return lambda q, *args, **kwargs: fn(q, *args, **kwargs).to(q.dtype)

    monkeypatch.setattr(mixers_module, "aft_conv2d", cast(ops.aft_conv2d_reference))
    monkeypatch.setattr(mixers_module, "aft_full", cast(ops.aft_full_reference))
    monkeypatch.setattr(mixers_module, "aft_simple", cast(ops.aft_simple_reference))
    monkeypatch.setattr(mixers_module, "aft_local", cast(ops.aft_local_reference))


@pytest.mark.parametrize("name", TEST_MODELS)
def test_model_matches_float64_reference_operators(name, monkeypatch):
    torch.manual_seed(0)
    model = _create(name, img_size=32, num_classes=5).double().eval()
    _randomise_aft_params(model)
    with torch.no_grad():
        for p in model.parameters():  # larger keys / biases than at init
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        fast = model(x)
        _reference_ops(monkeypatch)
        ref = model(x)
    torch.testing.assert_close(fast, ref, rtol=1e-9, atol=1e-10)


def test_aft_local_window_covering_the_grid_equals_aft_full():
    torch.manual_seed(0)
    local = _create("test_aft_local", window=8).eval()  # |di|, |dj| <= 7 < 8: the bias applies everywhere
    with torch.no_grad():
        for name, p in local.named_parameters():
            if ".pos_bias." in name:
                p.normal_(0.0, 0.5)  # biases of order 1
    full = _create("test_aft_full", class_token=False).eval()
    full.load_state_dict(local.state_dict())
    x = _input(local)
    with torch.no_grad():
        torch.testing.assert_close(local(x), full(x), rtol=1e-5, atol=1e-6)
        narrow = _create("test_aft_local").eval()  # window 3: the bias is 0 outside a 5 x 5 neighbourhood
        narrow.load_state_dict(local.state_dict())
        assert (narrow.forward_features(x) - full.forward_features(x)).abs().max() > 1e-2


@pytest.mark.parametrize("name", TEST_MODELS)
def test_grad_checkpointing_identical_outputs_and_grads(name):
    torch.manual_seed(0)
    model = _create(name, drop_path_rate=0.2, proj_drop_rate=0.1).train()
    _randomise_aft_params(model)
    x = _input(model)
    results = []
    for ckpt in (False, True):
        model.set_grad_checkpointing(ckpt)
        model.zero_grad()
        torch.manual_seed(1)
        out = model(x)
        out.square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=0, atol=0)
    for g1, g0 in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(g1, g0, rtol=1e-6, atol=1e-7)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.forward_intermediates(x)[0], model.forward_features(x))


# ----------------------------------------------------------------------------------------------------------------
# features
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TEST_MODELS)
def test_forward_intermediates_match_block_hooks(name):
    torch.manual_seed(0)
    model = _create(name).eval()
    assert [f["module"] for f in model.feature_info] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [f["reduction"] for f in model.feature_info] == [8, 8, 8]
    hooked = []
    handles = [b.register_forward_hook(lambda m, i, o: hooked.append(o)) for b in model.blocks]
    x = _input(model)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x)
    for h in handles:
        h.remove()
    P = model.num_prefix_tokens
    for tokens, fmap in zip(hooked, inter):
        torch.testing.assert_close(fmap, tokens[:, P:].transpose(1, 2).reshape(2, 32, 8, 8), rtol=0, atol=0)
    torch.testing.assert_close(final, model.forward_features(x))
    with torch.no_grad():
        nlc = model.forward_intermediates(x, indices=[-1], output_fmt="NLC", norm=True, intermediates_only=True)
        torch.testing.assert_close(nlc[0], model.norm(hooked[-1])[:, P:])
        early = model.forward_intermediates(x, indices=[1], stop_early=True, intermediates_only=True)
        torch.testing.assert_close(early[0], inter[1], rtol=0, atol=0)
        taken = model.prune_intermediate_layers([0, 1], prune_norm=True)
        assert taken == [0, 1] and len(model.blocks) == 2 and model.num_classes == 0
        torch.testing.assert_close(model.forward_features(x), inter[1], rtol=0, atol=0)


@pytest.mark.parametrize("name", TEST_MODELS)
@pytest.mark.parametrize("out_indices", [None, (0, 2), (-1,)])
def test_features_only_shapes(name, out_indices):
    kwargs = {} if out_indices is None else dict(out_indices=out_indices)
    model = _create(name, features_only=True, **kwargs).eval()
    expected = [0, 1, 2] if out_indices is None else [i % 3 for i in out_indices]
    assert model.feature_info.channels() == [32] * len(expected)
    assert model.feature_info.reduction() == [8] * len(expected)
    size = (64, 64) if name in FIXED else (48, 80)
    with torch.no_grad():
        feats = model(torch.randn(2, 3, *size))
    assert [tuple(f.shape) for f in feats] == [(2, 32, size[0] // 8, size[1] // 8)] * len(expected)
    full = _create(name).eval()
    full.load_state_dict(model.model.state_dict(), strict=False)
    with torch.no_grad():
        ref = full.forward_intermediates(torch.zeros(1, 3, *size), indices=expected, intermediates_only=True)
        out = model(torch.zeros(1, 3, *size))
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b)


def test_model_api_for_optimizers():
    from timm.models import group_parameters
    from timm.optim import create_optimizer_v2, param_groups_weight_decay

    model = _create("test_aft_full")
    groups = group_parameters(model, model.group_matcher(coarse=False), reverse=True)
    assert len(set(groups.values())) > 3
    nwd = model.no_weight_decay()
    assert {"cls_token", "pos_embed", "blocks.*.mixer.pos_bias.*", "*norm*.weight"} <= nwd
    pg = param_groups_weight_decay(model, 0.05, no_weight_decay_list=nwd)
    no_decay = {id(p) for g in pg if g["weight_decay"] == 0 for p in g["params"]}
    named = dict(model.named_parameters())
    for key in ("blocks.0.mixer.pos_bias.u", "blocks.2.mixer.pos_bias.v", "pos_embed", "cls_token", "norm.weight"):
        assert id(named[key]) in no_decay, key
    assert id(named["blocks.0.mixer.q.weight"]) not in no_decay
    conv = _create("test_aft_conv")
    assert "blocks.*.mixer.kernel.gamma" in conv.no_weight_decay() and "cls_token" not in conv.no_weight_decay()
    # layer-wise learning-rate decay goes through group_matcher
    opt = create_optimizer_v2(conv, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75)
    assert len({g["lr_scale"] for g in opt.param_groups}) == conv.blocks.__len__() + 2


# ----------------------------------------------------------------------------------------------------------------
# checkpoints: filter, local-dir round trip
# ----------------------------------------------------------------------------------------------------------------


def test_checkpoint_filter_fn_layouts():
    torch.manual_seed(0)
    model = _create("test_aft_conv").eval()
    sd = model.state_dict()
    # transformers wrapper (aft. prefix, other keys dropped), DDP prefix, nested training checkpoint
    hf = {f"aft.{k}": v for k, v in sd.items()}
    hf["some_other_head.weight"] = torch.zeros(1)
    assert checkpoint_filter_fn(hf, model).keys() == sd.keys()
    assert checkpoint_filter_fn({"model": {f"module.{k}": v for k, v in sd.items()}}, model).keys() == sd.keys()
    # older fused layout: qkv rows [q; k; v] (K with the mixer's key channels), timm's "attn" naming
    old = {}
    for k, v in sd.items():
        if ".mixer.q." in k:
            kind = k.rsplit(".", 1)[1]
            base = k.split(".mixer.")[0]
            old[f"{base}.attn.qkv.{kind}"] = torch.cat(
                [sd[f"{base}.mixer.{n}.{kind}"] for n in ("q", "k", "v")], dim=0
            )
        elif not (".mixer.k." in k or ".mixer.v." in k):
            old[k.replace(".mixer.", ".attn.")] = v
    out = checkpoint_filter_fn(old, model)
    assert out.keys() == sd.keys()
    assert all(torch.equal(out[k], sd[k]) for k in sd)
    bad = dict(old)
    bad["blocks.0.attn.qkv.weight"] = bad["blocks.0.attn.qkv.weight"][:-1]
    with pytest.raises(ValueError, match="rows"):
        checkpoint_filter_fn(bad, model)


@pytest.mark.parametrize("name", ["test_aft_conv", "test_aft_full"])
def test_local_dir_round_trip_identical_logits(name, tmp_path):
    torch.manual_seed(0)
    model = _create(name, num_classes=10, in_chans=1).eval()
    _randomise_aft_params(model)
    x = torch.randn(2, 1, 64, 64)
    with torch.no_grad():
        expected = model(x)
    save_for_hf(model, tmp_path / "timm", safe_serialization=True)
    config = json.loads((tmp_path / "timm" / "config.json").read_text())
    assert config["architecture"] == name and config["model_args"]["num_classes"] == 10
    assert config["pretrained_cfg"]["paper_ids"] == "arXiv:2105.14103"
    loaded = _create(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    assert loaded.num_classes == 10 and loaded.in_chans == 1
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
        # fine-tuning: a new head, the same features
        tuned = _create(f"local-dir:{tmp_path / 'timm'}", pretrained=True, num_classes=3).eval()
        assert tuned(x).shape == (2, 3)
        torch.testing.assert_close(tuned.forward_features(x), model.forward_features(x), rtol=0, atol=0)

    # weights as aft_hub's transformers classes write them: keys under "aft."
    sd = safetensors.torch.load_file(tmp_path / "timm" / "model.safetensors")
    safetensors.torch.save_file({f"aft.{k}": v for k, v in sd.items()}, tmp_path / "timm" / "model.safetensors")
    from_hf = _create(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(from_hf(x), expected, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------------------
# TorchScript, torch.fx, torch.compile
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TEST_MODELS)
def test_torchscript_matches_eager(name):
    torch.manual_seed(0)
    model = _create(name).eval()
    _randomise_aft_params(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(model)
    x = _input(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x))
    with pytest.raises(Exception, match="divisible"):
        scripted(torch.randn(1, 3, 60, 64))


def _fx_model(model, train: bool):
    from timm.models import get_notrace_functions, get_notrace_modules
    from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

    tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    return create_feature_extractor(
        model,
        train_return_nodes=[train_nodes[-1]],
        eval_return_nodes=[eval_nodes[-1]],
        tracer_kwargs=tracer_kwargs,
    ), eval_nodes


@pytest.mark.parametrize("name", TEST_MODELS)
def test_fx_trace_matches_eager_and_trains(name):
    torch.manual_seed(0)
    model = _create(name).eval()
    _randomise_aft_params(model)
    x = _input(model)
    fx, nodes = _fx_model(model, train=False)
    assert any(n.endswith("mixer") for n in nodes)  # the mixers are leaves
    with torch.no_grad():
        torch.testing.assert_close(next(iter(fx(x).values())), model(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(fx)
    with torch.no_grad():
        torch.testing.assert_close(next(iter(scripted(x).values())), model(x))
    fx.train()
    next(iter(fx(x).values())).mean().backward()
    assert all(p.grad is not None for p in fx.parameters())


def test_fx_feature_extraction_of_a_block():
    from timm.layers import create_feature_extractor

    torch.manual_seed(0)
    model = _create("test_aft_conv").eval()
    extractor = create_feature_extractor(model, return_nodes={"blocks.1": "b1", "norm": "out"})
    x = _input(model)
    with torch.no_grad():
        out = extractor(x)
        inter = model.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
    torch.testing.assert_close(out["b1"].transpose(1, 2).reshape(inter.shape), inter)


@pytest.mark.parametrize("name", TEST_MODELS)
def test_compile_without_graph_breaks(name):
    # fullgraph=True fails on any graph break (mixers and operators included); the eager backend keeps it fast
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _create(name, depth=1).eval()
    x = _input(model)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.slow
@pytest.mark.parametrize("name", TEST_MODELS)
def test_compile_inductor_matches_eager(name):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _create(name).eval()
    x = _input(model)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["test_aft_conv", "test_aft_full"])
def test_torch_export_matches_eager(name):
    # the exportable path (a TorchScript model calls the operators in Python and cannot be saved)
    torch.manual_seed(0)
    model = _create(name, depth=1).eval()
    x = _input(model)
    program = torch.export.export(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x))
