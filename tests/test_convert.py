"""Conversions: timm <-> transformers folders (lossless), DeiT/ViT -> AFT initialisation, safetensors-only I/O."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

import aft_hub.hf  # noqa: F401  (registers the transformers classes)
import aft_hub.timm_models  # noqa: F401  (registers the timm names)
from aft_hub.convert import (
    check_state_dict,
    infer_vit_config,
    load_state_dict,
    load_timm_model,
    save_state_dict,
    timm_to_transformers_folder,
    transformers_to_timm_folder,
    vit_to_aft,
    vit_to_aft_folder,
)
from aft_hub.convert.cli import main as convert_main
from aft_hub.hub.cli import main as publish_main

IMAGES = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))


def _small_deit(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    args = dict(img_size=64, depth=2, num_classes=7)
    args.update(kwargs)
    return timm.create_model("deit_tiny_patch16_224", pretrained=False, **args).eval()


# ----------------------------------------------------------------------------------------------------------------
# safetensors-only I/O
# ----------------------------------------------------------------------------------------------------------------


class _Evil:
    def __reduce__(self):
        return (print, ("pickle code ran",))


def test_pickle_inputs_refused_unless_allowed(tmp_path: Path) -> None:
    state = {"w": torch.arange(4.0)}
    torch.save({"state_dict": state}, tmp_path / "w.pth")
    with pytest.raises(ValueError, match="allow_pickle"):
        load_state_dict(tmp_path / "w.pth")
    loaded = load_state_dict(tmp_path / "w.pth", allow_pickle=True)  # nested under "state_dict": unwrapped
    torch.testing.assert_close(loaded["w"], state["w"])
    # even when allowed, weights_only=True refuses arbitrary objects
    (tmp_path / "evil.pth").write_bytes(pickle.dumps({"w": _Evil()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError):
        load_state_dict(tmp_path / "evil.pth", allow_pickle=True)
    (tmp_path / "w.npz").write_bytes(b"x")
    with pytest.raises(ValueError, match="Unknown weights file type"):
        load_state_dict(tmp_path / "w.npz")


def test_save_state_dict_writes_safetensors_only(tmp_path: Path) -> None:
    base = torch.arange(6.0)
    with pytest.raises(ValueError, match="safetensors only"):
        save_state_dict({"a": base}, tmp_path / "a.bin")
    path = save_state_dict({"a": base, "view": base[:3], "t": base.view(2, 3).t()}, tmp_path / "a.safetensors")
    back = load_file(str(path))
    torch.testing.assert_close(back["view"], base[:3])
    torch.testing.assert_close(back["t"], base.view(2, 3).t())
    assert not list(tmp_path.glob(".*.tmp"))


def test_check_state_dict_names_every_mismatch() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    state = model.state_dict()
    state["0.weight"] = torch.zeros(5, 3)
    state.pop("1.bias")
    state["extra"] = torch.zeros(1)
    with pytest.raises(ValueError) as err:
        check_state_dict(model, state)
    message = str(err.value)
    assert "0.weight: checkpoint (5, 3) vs model (4, 3)" in message
    assert "missing keys ['1.bias']" in message and "unexpected keys ['extra']" in message


def test_timm_checkpoint_shape_error_names_keys(tmp_path: Path) -> None:
    torch.manual_seed(0)
    save_file(timm.create_model("test_aft_full").state_dict(), str(tmp_path / "full.safetensors"))
    with pytest.raises(ValueError) as err:
        load_timm_model("test_aft_conv", checkpoint=tmp_path / "full.safetensors")
    message = str(err.value)
    assert "blocks.0.mixer.k.weight" in message and "blocks.0.mixer.pos_bias.u" in message
    assert "blocks.0.mixer.kernel.weight" in message


# ----------------------------------------------------------------------------------------------------------------
# timm <-> transformers, lossless
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["test_aft_conv", "test_aft_full", "test_aft_local", "test_aft_simple"])
def test_timm_transformers_round_trip_is_lossless(name: str, tmp_path: Path) -> None:
    from transformers import AutoModelForImageClassification

    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5).eval()
    for p in model.parameters():  # move AFT-conv's zero-initialised gamma/beta off zero, so kernels matter
        p.data.add_(0.05 * torch.randn_like(p))
    save_file(model.state_dict(), str(tmp_path / "w.safetensors"))
    with torch.no_grad():
        expected = model(IMAGES)

    hf_folder = timm_to_transformers_folder(name, tmp_path / "hf", checkpoint=tmp_path / "w.safetensors",
                                            num_classes=5)  # fmt: skip
    assert json.loads((hf_folder / "config.json").read_text())["model_type"] == "aft_vision"
    assert all(k.startswith("aft.") for k in load_file(str(hf_folder / "model.safetensors")))
    hf = AutoModelForImageClassification.from_pretrained(hf_folder).eval()
    via_timm = timm.create_model(f"local-dir:{hf_folder}", pretrained=True).eval()  # the same folder in timm
    timm_folder = transformers_to_timm_folder(hf_folder, tmp_path / "timm")
    back = timm.create_model(f"local-dir:{timm_folder}", pretrained=True).eval()
    with torch.no_grad():
        for logits in (hf(pixel_values=IMAGES).logits, via_timm(IMAGES), back(IMAGES)):
            torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    original = model.state_dict()
    restored = load_file(str(timm_folder / "model.safetensors"))
    assert original.keys() == restored.keys() and all(torch.equal(original[k], restored[k]) for k in original)


def test_convert_cli_refuses_pickle_and_existing_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    torch.save(timm.create_model("test_aft_conv").state_dict(), tmp_path / "w.pth")
    args = ["timm-to-hf", "test_aft_conv", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "w.pth")]
    status = convert_main(args)
    assert status == 1 and "--allow-pickle" in capsys.readouterr().err and not (tmp_path / "out").exists()
    args.append("--allow-pickle")
    assert convert_main(args) == 0 and (tmp_path / "out" / "model.safetensors").is_file()
    assert not list((tmp_path / "out").glob("*.pth")) and not list((tmp_path / "out").glob("*.bin"))
    assert convert_main(args) == 1 and "overwrite" in capsys.readouterr().err
    assert convert_main(args + ["--overwrite"]) == 0


# ----------------------------------------------------------------------------------------------------------------
# DeiT / ViT -> AFT
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", ["conv", "full"])
def test_vit_to_aft_copies_what_has_a_counterpart(mixer: str) -> None:
    deit = _small_deit()
    source = deit.state_dict()
    model, report = vit_to_aft(source, mixer=mixer, heads=8, kernel_size=5, bias_rank=8, source_name="deit")
    target = model.state_dict()
    assert infer_vit_config(source)["img_size"] == 64 and model.num_classes == 7
    # every copied tensor equals its source (V is the last third of the fused qkv)
    for src, dst in report.copied:
        if src.endswith("[v]"):
            expected = torch.chunk(source[src[: -len("[v]")]], 3, dim=0)[2]
        else:
            expected = source[src]
        assert torch.equal(target[dst], expected), (src, dst)
    copied_targets = {dst for _, dst in report.copied}
    for i in range(2):
        for name in ("norm1.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc2.bias", "mixer.v.weight",
                     "mixer.v.bias", "mixer.proj.weight"):  # fmt: skip
            assert f"blocks.{i}.{name}" in copied_targets
        assert {f"blocks.{i}.mixer.q.weight", f"blocks.{i}.mixer.k.weight"} <= set(report.initialised)
        assert {f"blocks.{i}.attn.qkv.weight[q]", f"blocks.{i}.attn.qkv.weight[k]"} <= set(report.dropped)
    assert {"patch_embed.proj.weight", "norm.weight", "head.weight"} <= copied_targets
    if mixer == "conv":
        assert {"cls_token", "pos_embed"} <= set(report.dropped)
        assert "blocks.0.mixer.kernel.weight" in report.initialised
    else:
        assert {"cls_token", "pos_embed"} <= copied_targets
        assert "blocks.0.mixer.pos_bias.u" in report.initialised
    assert set(report.initialised) | copied_targets == set(target)
    assert not set(report.initialised) & copied_targets
    with torch.no_grad():
        logits = model(IMAGES)
    assert logits.shape == (2, 7) and torch.isfinite(logits).all()


def test_vit_to_aft_new_head_and_distilled_tokens() -> None:
    torch.manual_seed(0)
    distilled = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=64, depth=1).eval()
    model, report = vit_to_aft(distilled.state_dict(), num_classes=3, heads=4)
    assert {"dist_token", "head_dist.weight", "head.weight", "head.bias"} <= set(report.dropped)
    assert {"head.weight", "head.bias"} <= set(report.initialised) and model.num_classes == 3
    with torch.no_grad():
        assert torch.isfinite(model(IMAGES)).all()


def test_vit_to_aft_rejects_other_models() -> None:
    with pytest.raises(ValueError, match="Not a timm ViT/DeiT state dict"):
        vit_to_aft(timm.create_model("test_aft_conv").state_dict())


def test_vit_to_aft_cli_then_publish_card(tmp_path: Path) -> None:
    from huggingface_hub import ModelCard

    save_file(_small_deit().state_dict(), str(tmp_path / "deit.safetensors"))
    out = tmp_path / "aft"
    status = convert_main(["vit-to-aft", str(tmp_path / "deit.safetensors"), str(out), "--heads", "8",
                           "--kernel-size", "5", "--base-model", "timm/deit_tiny_patch16_224.fb_in1k",
                           "--report", str(tmp_path / "report.json")])  # fmt: skip
    assert status == 0
    report = json.loads((out / "conversion.json").read_text())
    assert report["base_model"] == "timm/deit_tiny_patch16_224.fb_in1k" and report["copied"]
    assert json.loads((tmp_path / "report.json").read_text())["dropped"] == report["dropped"]
    with torch.no_grad():
        assert torch.isfinite(timm.create_model(f"local-dir:{out}", pretrained=True).eval()(IMAGES)).all()
    card_dir = tmp_path / "card"
    assert publish_main([str(out), "--repo-id", "me/aft-from-deit", "--folder", str(card_dir), "--dry-run"]) == 0
    card = ModelCard.load(card_dir / "README.md")
    assert card.data.base_model == "timm/deit_tiny_patch16_224.fb_in1k"
    assert "DeiT/ViT initialisation" in card.text and f"{len(report['copied'])} tensors copied" in card.text


def test_vit_to_aft_folder_from_timm_folder(tmp_path: Path) -> None:
    from timm.models import save_for_hf

    deit = _small_deit()
    deit.pretrained_cfg = dict(deit.pretrained_cfg, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    save_for_hf(deit, str(tmp_path / "deit"), safe_serialization=True)
    out, report = vit_to_aft_folder(tmp_path / "deit", tmp_path / "x", fmt="timm", heads=4)
    data = json.loads((out / "conversion.json").read_text())
    assert data["base_model"] is None and data["target"] == report.target == "aft_conv_tiny"
    config = json.loads((out / "config.json").read_text())
    assert "model_type" not in config and config["pretrained_cfg"]["mean"] == [0.5, 0.5, 0.5]  # timm's layout
    model = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    torch.testing.assert_close(model.patch_embed.proj.weight, deit.patch_embed.proj.weight, rtol=0, atol=0)
