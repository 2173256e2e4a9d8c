"""Tests of the transformers vision front end: AftVisionConfig, AftVisionModel, AftForImageClassification.

One config.json for timm and transformers; save/load round trips; initialisation from an empty state dict; batch
equivalence; identical logits through timm and transformers (both conversions); fine-tuning to a new label count;
labels through save/load and the image-classification pipeline on real images (Fashion-MNIST when the Debian
package is installed, PIL-drawn shapes otherwise); gradient checkpointing; a few Trainer steps. The tiny timm
variants (test_aft_*) keep the file fast.
"""

from __future__ import annotations

import gzip
import inspect
import json
import logging
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    AutoModel,
    AutoModelForImageClassification,
    PreTrainedModel,
    Trainer,
    TrainingArguments,
    pipeline,
    set_seed,
)

import aft_hub.hf  # noqa: F401  (registers the Auto classes)
import aft_hub.timm_models  # noqa: F401  (registers the timm names)
from aft_hub.hf import (
    AftForImageClassification,
    AftVisionConfig,
    AftVisionModel,
    build_image_processor,
    timm_to_transformers,
    transformers_to_timm,
)
from aft_hub.hf.configuration_aft_vision import MODEL_ARG_NAMES
from aft_hub.vision import AftVisionTransformer

logger = logging.getLogger(__name__)

TINY = ["test_aft_conv", "test_aft_simple", "test_aft_full", "test_aft_local"]
CLASSES = [AftVisionModel, AftForImageClassification]
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
FASHION_LABELS = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip
SHAPE_LABELS = ["ellipse", "rectangle", "triangle"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These models are tiny: one intra-op thread is as fast, and avoids the 10-50x slow-down of spinning OpenMP
    threads on a loaded machine (e.g. under pytest-xdist)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------


def _config(name: str = "test_aft_conv", **kwargs) -> AftVisionConfig:
    return AftVisionConfig.from_timm_architecture(name, **kwargs)


@torch.no_grad()
def _perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Move every parameter off its initial value (AFT-conv kernels start at zero, layer norms at one)."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _pixels(batch: int = 2, size: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _model(cls, name: str = "test_aft_conv", seed: int = 0, **kwargs):
    set_seed(seed)
    return _perturb(cls(_config(name, **kwargs)), seed).eval()


def _outputs(model, pixel_values: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(pixel_values)
    if isinstance(model, AftForImageClassification):
        return [out.logits]
    return [out.last_hidden_state, out.pooler_output]


def _real_images(n: int, seed: int = 0) -> tuple[list[Image.Image], list[int], list[str]]:
    """n RGB images with labels: Fashion-MNIST test images when installed, otherwise PIL-drawn shapes."""
    if (FASHION_MNIST / "t10k-images-idx3-ubyte.gz").is_file():
        with gzip.open(FASHION_MNIST / "t10k-images-idx3-ubyte.gz") as f:
            images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
        with gzip.open(FASHION_MNIST / "t10k-labels-idx1-ubyte.gz") as f:
            labels = np.frombuffer(f.read(), np.uint8, offset=8)
        idx = np.random.default_rng(seed).permutation(len(labels))[:n]
        return [Image.fromarray(images[i]).convert("RGB") for i in idx], [int(labels[i]) for i in idx], FASHION_LABELS
    rng = np.random.default_rng(seed)
    out, targets = [], []
    for _ in range(n):
        label = int(rng.integers(len(SHAPE_LABELS)))
        img = Image.new("RGB", (28, 28), tuple(int(v) for v in rng.integers(0, 60, 3)))
        draw = ImageDraw.Draw(img)
        x0, y0 = (int(v) for v in rng.integers(1, 10, 2))
        x1, y1 = (int(v) for v in rng.integers(18, 27, 2))
        color = tuple(int(v) for v in rng.integers(150, 256, 3))
        if label == 0:
            draw.ellipse((x0, y0, x1, y1), fill=color)
        elif label == 1:
            draw.rectangle((x0, y0, x1, y1), fill=color)
        else:
            draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) // 2, y0)], fill=color)
        out.append(img)
        targets.append(label)
    return out, targets, SHAPE_LABELS


def _to_tensor(images: list[Image.Image], size: int) -> torch.Tensor:
    """Images to a normalised (B, 3, size, size) batch (ImageNet mean / std, the config default)."""
    x = torch.stack(
        [torch.from_numpy(np.asarray(img.resize((size, size)), dtype=np.float32) / 255.0) for img in images]
    )
    x = x.permute(0, 3, 1, 2)  # (B, 3, H, W)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return (x - mean) / std


# ----------------------------------------------------------------------------------------------------------------
# configuration
# ----------------------------------------------------------------------------------------------------------------


def test_config_fields_match_model_signature():
    params = set(inspect.signature(AftVisionTransformer.__init__).parameters) - {
        "self",
        "num_classes",
        "device",
        "dtype",
    }
    assert set(MODEL_ARG_NAMES) == params
    defaults = AftVisionConfig()
    for name in MODEL_ARG_NAMES:  # the config's defaults are the model's (the paper's aft_conv_tiny)
        assert getattr(defaults, name) == inspect.signature(AftVisionTransformer.__init__).parameters[name].default


@pytest.mark.parametrize("name", sorted(n for n in timm.list_models(["aft_*", "test_aft_*"])))
def test_config_expresses_every_timm_architecture(name):
    config = _config(name)
    with torch.device("meta"):
        timm_model = timm.create_model(name)
        rebuilt = AftVisionTransformer(**config.model_kwargs(timm_model.num_classes))
    assert config.architecture == name
    assert rebuilt.config_kwargs == timm_model.config_kwargs
    shapes = {k: v.shape for k, v in rebuilt.state_dict().items()}
    assert shapes == {k: v.shape for k, v in timm_model.state_dict().items()}
    assert config.pretrained_cfg["input_size"] == list(timm_model.pretrained_cfg["input_size"])
    assert config.pretrained_cfg["crop_pct"] == timm_model.pretrained_cfg["crop_pct"]
    assert config.pretrained_cfg["fixed_input_size"] == timm_model.pretrained_cfg["fixed_input_size"]


def test_config_num_classes_is_num_labels():
    config = AftVisionConfig(num_classes=7)
    assert config.num_labels == 7 and config.to_dict()["num_classes"] == 7
    config = AftVisionConfig(id2label={0: "cat", 1: "dog"})
    assert config.label2id == {"cat": 0, "dog": 1}
    assert config.to_dict()["label_names"] == ["cat", "dog"]
    assert AftVisionConfig(num_labels=0).to_dict()["num_classes"] == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(hiddn_size=3), "hiddn_size"),
        (dict(mixer="attention"), "mixer"),
        (dict(img_size=100), "img_size"),
        (dict(mixer="conv", class_token=True), "class_token"),
        (dict(mixer="conv", embed_dim=64, heads=5), "embed_dim"),
        (dict(kernel_size=4), "kernel_size"),
        (dict(bias_rank=0), "bias_rank"),
        (dict(global_pool="token"), "global_pool"),
        (dict(drop_path_rate=1.5), "drop_path_rate"),
        (dict(depth=0), "depth"),
        (dict(pretrained_cfg={"meen": [0.5] * 3}), "pretrained_cfg"),
        (dict(pretrained_cfg={"mean": [0.5]}), "pretrained_cfg['mean']"),
        (dict(pretrained_cfg={"input_size": [1, 224, 224]}), "pretrained_cfg['input_size']"),
        (dict(mixer="full", class_token=True, pretrained_cfg={"input_size": [3, 256, 256]}), "input_size"),
        (dict(id2label={0: "a", 1: "b"}, num_classes=3), "num_classes"),
        (dict(id2label={0: "a", 1: "b"}, label_names=["a", "c"]), "label_names"),
        (dict(embed_dim=64, heads=8, model_args={"embed_dim": 32}), "model_args['embed_dim']"),
        (dict(model_args={"num_classes": 3}), "num_classes"),
        (dict(num_features=5), "num_features"),
        (dict(id2label={0: "a", 2: "b"}), "id2label"),
        (dict(id2label={0: "a", 1: "b"}, label2id={"a": 1, "b": 0}), "label2id"),
        (dict(image_processor_type="ViTImageProcessor"), "image_processor_type"),
        (dict(model_type="aft"), "model_type"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        AftVisionConfig(**kwargs)


def test_config_json_is_read_by_both_libraries(tmp_path):
    config = _config("test_aft_local", id2label={0: "cat", 1: "dog", 2: "bird"})
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    # transformers
    assert saved["model_type"] == "aft_vision" and saved["id2label"] == {"0": "cat", "1": "dog", "2": "bird"}
    assert saved["mixer"] == "local" and saved["window"] == 3
    assert saved["image_processor_type"] == "TimmWrapperImageProcessor"
    # timm
    assert saved["architecture"] == "test_aft_local"
    assert saved["num_classes"] == 3 and saved["label_names"] == ["cat", "dog", "bird"]
    assert "num_classes" not in saved["model_args"]
    assert saved["model_args"] == {name: saved[name] for name in MODEL_ARG_NAMES}
    assert saved["pretrained_cfg"]["input_size"] == [3, 64, 64] and saved["pretrained_cfg"]["fixed_input_size"]
    # reload with no extra arguments
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, AftVisionConfig)
    assert {k: v for k, v in loaded.to_dict().items() if k != "_name_or_path"} == {
        k: v for k, v in config.to_dict().items() if k != "_name_or_path"
    }
    # a hand edit that would make the two libraries build different models is refused
    saved["model_args"]["window"] = 5
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="model_args"):
        AutoConfig.from_pretrained(tmp_path)


def test_auto_classes_are_registered():
    fields = {k: v for k, v in _config().to_dict().items() if k not in ("model_type", "transformers_version")}
    config = AutoConfig.for_model("aft_vision", **fields)
    assert isinstance(config, AftVisionConfig)
    assert (config.hidden_size, config.num_hidden_layers) == (config.embed_dim, config.depth)  # generic names
    assert type(AutoModel.from_config(config)) is AftVisionModel
    assert type(AutoModelForImageClassification.from_config(config)) is AftForImageClassification


# ----------------------------------------------------------------------------------------------------------------
# save / load and initialisation
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("name, extra", [("test_aft_conv", {}), ("test_aft_full", {"global_pool": "token"})])
def test_save_load_round_trip(tmp_path, cls, name, extra):
    model = _model(cls, name, id2label={0: "a", 1: "b", 2: "c"}, **extra)
    x = _pixels()
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    auto = AutoModel if cls is AftVisionModel else AutoModelForImageClassification
    loaded = auto.from_pretrained(tmp_path).eval()
    assert type(loaded) is cls
    for a, b in zip(_outputs(model, x), _outputs(loaded, x)):
        assert torch.equal(a, b)
    if extra.get("global_pool") == "token" and cls is AftVisionModel:  # the class-token sequence, (B, 1 + N, C)
        assert _outputs(model, x)[0].shape == (2, 1 + 64, 32)


def test_empty_state_dict_initialises_every_parameter():
    config = _config("test_aft_full", init_values=1e-5, num_labels=4)
    set_seed(0)
    first = AftForImageClassification.from_pretrained(None, config=config, state_dict={})
    set_seed(0)
    second = AftForImageClassification.from_pretrained(None, config=config, state_dict={})
    for key, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[key]), key
        assert torch.isfinite(value).all(), key
    # the same values as a fresh model when every module's initialisation starts from the same seed
    original = PreTrainedModel._initialize_weights

    def seeded(self, module, is_custom_code=False):
        set_seed(0)
        original(self, module, is_custom_code)

    with patch.object(PreTrainedModel, "_initialize_weights", seeded):
        fresh = AftForImageClassification(config)
        empty = AftForImageClassification.from_pretrained(None, config=config, state_dict={})
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, empty.state_dict()[key]), key
    # timm's initialisation: zero biases, unit norms, layer-scale init_values, zero AFT-conv gamma
    assert torch.equal(empty.aft.head.bias, torch.zeros(4))
    assert torch.equal(empty.aft.norm.weight, torch.ones(32))
    assert torch.allclose(empty.aft.blocks[0].ls1.gamma, torch.full((32,), 1e-5))
    assert 0.005 < empty.aft.blocks[0].mixer.pos_bias.u.std() < 0.02


@pytest.mark.parametrize("name", TINY)
def test_batch_equals_rows_one_by_one(name):
    model = _model(AftForImageClassification, name, num_labels=5)
    x = _pixels(batch=3)
    with torch.no_grad():
        batch = model(x).logits
        rows = torch.cat([model(x[i : i + 1]).logits for i in range(3)])
    torch.testing.assert_close(batch, rows, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# timm <-> transformers
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TINY)
def test_timm_and_transformers_give_the_same_logits(name):
    set_seed(0)
    timm_model = _perturb(timm.create_model(name, num_classes=4)).eval()
    x = _pixels()
    hf_model = timm_to_transformers(timm_model, id2label={0: "w", 1: "x", 2: "y", 3: "z"})
    assert type(hf_model) is AftForImageClassification and not hf_model.training
    assert hf_model.config.architecture == name and hf_model.config.num_labels == 4
    with torch.no_grad():
        expected = timm_model(x)
        assert torch.equal(hf_model(x).logits, expected)
    back = transformers_to_timm(hf_model).eval()
    assert type(back) is AftVisionTransformer and back.config_kwargs == timm_model.config_kwargs
    assert back.pretrained_cfg["label_names"] == ["w", "x", "y", "z"]
    with torch.no_grad():
        assert torch.equal(back(x), expected)
    # copies, not shared storage
    with torch.no_grad():
        hf_model.aft.head.bias.add_(1.0)
    assert not torch.equal(hf_model.aft.head.bias, timm_model.head.bias)
    assert not torch.equal(hf_model.aft.head.bias, back.head.bias)


def test_headless_timm_model_converts_to_vision_model():
    timm_model = _perturb(timm.create_model("test_aft_simple", num_classes=0)).eval()
    hf_model = timm_to_transformers(timm_model)
    assert type(hf_model) is AftVisionModel
    x = _pixels()
    with torch.no_grad():
        assert torch.equal(hf_model(x).pooler_output, timm_model(x))
        assert torch.equal(transformers_to_timm(hf_model).eval()(x), timm_model(x))


@pytest.mark.parametrize("cls", CLASSES)
def test_timm_loads_the_saved_folder(tmp_path, cls):
    model = _model(cls, "test_aft_full", id2label={0: "cat", 1: "dog"})
    model.save_pretrained(tmp_path)
    timm_model = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    x = _pixels()
    with torch.no_grad():
        expected = model(x)
        if cls is AftVisionModel:  # config.json says num_classes 0: no head in the weights, none in timm
            assert timm_model.num_classes == 0
            assert torch.equal(timm_model(x), expected.pooler_output)
            head = AftForImageClassification.from_pretrained(tmp_path)  # the usual base -> head fine-tuning start
            assert head.aft.head.weight.shape == (2, 32)
            assert torch.equal(head.aft.blocks[0].mixer.q.weight, model.aft.blocks[0].mixer.q.weight)
        else:
            assert torch.equal(timm_model(x), expected.logits)
            assert list(timm_model.pretrained_cfg["label_names"]) == ["cat", "dog"]


# ----------------------------------------------------------------------------------------------------------------
# heads, losses, hidden states
# ----------------------------------------------------------------------------------------------------------------


def test_ignore_mismatched_sizes_to_a_new_label_count(tmp_path):
    model = _model(AftForImageClassification, "test_aft_conv", num_labels=3)
    model.save_pretrained(tmp_path)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AftForImageClassification.from_pretrained(tmp_path, num_labels=5)
    new = AftForImageClassification.from_pretrained(
        tmp_path, id2label={i: f"class_{i}" for i in range(5)}, label2id={f"class_{i}": i for i in range(5)},
        ignore_mismatched_sizes=True,
    )  # fmt: skip
    assert new.aft.head.weight.shape == (5, 32) and new.config.num_labels == 5
    assert new.config.id2label[4] == "class_4"
    old, fresh = model.state_dict(), new.state_dict()
    for key, value in old.items():
        if not key.startswith("aft.head."):
            assert torch.equal(value, fresh[key]), key
    assert torch.equal(fresh["aft.head.bias"], torch.zeros(5))  # re-initialised, timm's way
    assert new(_pixels()).logits.shape == (2, 5)


def test_losses_follow_the_transformers_problem_types():
    model = _model(AftForImageClassification, "test_aft_simple", num_labels=3)
    x = _pixels(batch=4)
    labels = torch.tensor([0, 2, 1, 2])
    out = model(x, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    multi = _model(AftForImageClassification, "test_aft_simple", num_labels=3)
    targets = torch.tensor([[1.0, 0.0, 1.0]] * 4)
    out = multi(x, labels=targets)
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, targets))
    regression = _model(AftForImageClassification, "test_aft_simple", num_labels=1)
    values = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out = regression(x, labels=values)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(), values))


def test_hidden_states_are_the_blocks_outputs():
    model = _model(AftVisionModel, "test_aft_full")
    x = _pixels()
    with torch.no_grad():
        out = model(x, output_hidden_states=True)
        final, intermediates = model.aft.forward_intermediates(x)
        plain = model(x)
        picked = model(x, output_hidden_states=[0, 2])
    assert len(out.hidden_states) == model.config.depth == 3
    assert all(h.shape == (2, 32, 8, 8) for h in out.hidden_states)
    for a, b in zip(out.hidden_states, intermediates):
        assert torch.equal(a, b)
    assert torch.equal(out.last_hidden_state, final) and torch.equal(plain.last_hidden_state, final)
    assert plain.hidden_states is None
    assert len(picked.hidden_states) == 2 and torch.equal(picked.hidden_states[1], intermediates[2])


def test_classification_needs_labels():
    with pytest.raises(ValueError, match="num_labels"):
        AftForImageClassification(_config(num_labels=0))


def test_gradient_checkpointing_gives_identical_gradients():
    model = _model(AftForImageClassification, "test_aft_conv", num_labels=3).train()
    x, labels = _pixels(batch=4), torch.tensor([0, 1, 2, 1])

    def grads():
        model.zero_grad()
        model(x, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    model.activation_checkpointing_enable()
    assert model.aft.grad_checkpointing and model.is_activation_checkpointing
    checkpointed = grads()
    model.activation_checkpointing_disable()
    assert not model.aft.grad_checkpointing
    assert plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        assert grad.abs().sum() > 0, name  # every parameter gets a gradient
        torch.testing.assert_close(checkpointed[name], grad, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------------------
# preprocessing and pipeline
# ----------------------------------------------------------------------------------------------------------------


def test_image_processor_is_timms_transform(tmp_path):
    model = _model(AftForImageClassification, "test_aft_conv", num_labels=2)
    model.save_pretrained(tmp_path)
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    assert type(processor).__name__ == "TimmWrapperImageProcessor"
    assert processor.to_dict()["data_config"] == build_image_processor(model.config).to_dict()["data_config"]
    images, _, _ = _real_images(3)
    timm_model = timm.create_model(f"local-dir:{tmp_path}", pretrained=True)
    transform = timm.data.create_transform(**timm.data.resolve_data_config(model=timm_model), is_training=False)
    expected = torch.stack([transform(img) for img in images])
    pixel_values = processor(images, return_tensors="pt")["pixel_values"]
    assert pixel_values.shape == (3, 3, 64, 64)
    assert torch.equal(pixel_values, expected)


def test_pipeline_labels_on_real_images(tmp_path):
    images, _, names = _real_images(4)
    model = _model(AftForImageClassification, "test_aft_conv", id2label=dict(enumerate(names)))
    model.save_pretrained(tmp_path)
    loaded = AftVisionConfig.from_pretrained(tmp_path)
    assert loaded.id2label == dict(enumerate(names)) and loaded.label2id == {n: i for i, n in enumerate(names)}
    classifier = pipeline("image-classification", model=str(tmp_path), device="cpu")
    results = classifier(images, top_k=3)
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    with torch.no_grad():
        logits = model(processor(images, return_tensors="pt")["pixel_values"]).logits
    for result, row in zip(results, logits.softmax(-1)):
        assert [r["label"] for r in result] == [names[i] for i in row.topk(3).indices.tolist()]
        torch.testing.assert_close(torch.tensor([r["score"] for r in result]), row.topk(3).values)


# ----------------------------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------------------------


class _Images(torch.utils.data.Dataset):
    def __init__(self, pixel_values: torch.Tensor, labels: list[int]) -> None:
        self.pixel_values, self.labels = pixel_values, torch.tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.pixel_values[i], "labels": self.labels[i]}


def test_trainer_steps_reduce_the_loss(tmp_path):
    images, labels, names = _real_images(128, seed=1)
    data = _Images(_to_tensor(images, 32), labels)
    set_seed(0)
    model = AftForImageClassification(_config("test_aft_conv", img_size=32, id2label=dict(enumerate(names))))
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=16, per_device_eval_batch_size=128, max_steps=40,
        learning_rate=1e-2, warmup_steps=0, weight_decay=0.0, logging_steps=10, save_strategy="no", report_to=[],
        use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    logger.info("Trainer: loss %.3f -> %.3f", before, after)
    assert after < 0.8 * before
