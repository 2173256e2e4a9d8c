"""Tests of the loopback Hub server, driven by the unmodified ``huggingface_hub`` client over real HTTP."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hub_server import DEFAULT_TOKEN, DEFAULT_USER, HubServer, hub_server_fixture, offline_mode  # noqa: F401
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    create_repo,
    hf_hub_download,
    model_info,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

BIG_SIZE = 10 * 1024 * 1024 + 123_457  # just above the 10 MiB LFS threshold
README = "---\nlicense: apache-2.0\ntags:\n- aft\n- vision\nlibrary_name: timm\n---\n# AFT test model\n"


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's content."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def api(hub_server: HubServer) -> HfApi:
    """A default ``HfApi`` (endpoint and token come from the environment set by ``hub_server``)."""
    return HfApi()


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a README, a small text file, a > 10 MiB binary and a tiny ``.safetensors`` file."""
    folder = tmp_path_factory.mktemp("model")
    (folder / "sub").mkdir(parents=True)
    (folder / "README.md").write_text(README)
    (folder / "config.json").write_text(json.dumps({"architecture": "aft_full", "dim": 64}))
    (folder / "weights.dat").write_bytes(hashlib.sha256(b"seed").digest() * (BIG_SIZE // 32) + b"tail")
    (folder / "sub" / "tiny.safetensors").write_bytes(b"\x00\x01" * 50)
    return folder


@pytest.fixture
def uploaded(api: HfApi, hub_server: HubServer, model_folder: Path) -> tuple[str, str]:
    """``(repo_id, commit_oid)`` of a repo holding ``model_folder`` (uploaded in one commit)."""
    repo_id = api.create_repo("aft-tiny").repo_id
    info = api.upload_folder(repo_id=repo_id, folder_path=model_folder, commit_message="Upload model")
    return repo_id, info.oid


def test_fixture_points_client_at_loopback(hub_server: HubServer) -> None:
    assert hub_server.endpoint.startswith("http://127.0.0.1:")
    assert constants.ENDPOINT == hub_server.endpoint
    assert constants.HUGGINGFACE_CO_URL_TEMPLATE.startswith(hub_server.endpoint + "/")
    assert constants.HF_HUB_DISABLE_XET is True
    assert Path(constants.HF_HUB_CACHE).is_relative_to(hub_server.home)
    from huggingface_hub.hf_api import api as singleton

    assert singleton.endpoint == hub_server.endpoint
    env = hub_server.env()
    assert env["HF_ENDPOINT"] == hub_server.endpoint
    assert env["HF_TOKEN"] == DEFAULT_TOKEN
    assert env["HF_HUB_DISABLE_XET"] == "1"
    assert env["HF_HUB_CACHE"] == str(hub_server.home / "hub")
    assert "HF_HUB_OFFLINE" not in env


def test_whoami_and_authentication(api: HfApi, hub_server: HubServer) -> None:
    me = api.whoami()
    assert me["name"] == DEFAULT_USER
    assert [org["name"] for org in me["orgs"]] == ["test-org"]
    assert hub_server.requests[-1] == ("GET", "/api/whoami-v2")
    assert hub_server.request_log[-1].authenticated

    with pytest.raises(HfHubHTTPError) as excinfo:
        HfApi(token="hf_wrong").whoami()
    assert excinfo.value.response.status_code == 401

    # Writes need a token.
    with pytest.raises(HfHubHTTPError) as excinfo:
        HfApi(token=False).create_repo("anonymous-repo")
    assert excinfo.value.response.status_code == 401
    assert not hub_server.has_repo(f"{DEFAULT_USER}/anonymous-repo")


def test_create_repo_exist_ok(api: HfApi, hub_server: HubServer) -> None:
    url = api.create_repo("aft-base")
    assert url.repo_id == f"{DEFAULT_USER}/aft-base"
    assert url == f"{hub_server.endpoint}/{DEFAULT_USER}/aft-base"
    assert hub_server.has_repo(url.repo_id)

    again = api.create_repo("aft-base", exist_ok=True)
    assert again.repo_id == url.repo_id
    with pytest.raises(HfHubHTTPError) as excinfo:
        api.create_repo("aft-base")
    assert excinfo.value.response.status_code == 409

    org_repo = create_repo("test-org/aft-private", private=True)  # module-level function uses the patched singleton
    assert org_repo.repo_id == "test-org/aft-private"
    assert hub_server.repo("test-org/aft-private").private
    assert api.repo_exists(url.repo_id)
    assert not api.repo_exists(f"{DEFAULT_USER}/missing")
    assert not HfApi(token=False).repo_exists("test-org/aft-private")  # private repos are hidden from anonymous

    dataset = api.create_repo("aft-data", repo_type="dataset")
    assert dataset.repo_type == "dataset" and hub_server.has_repo(dataset.repo_id, "dataset")
    api.delete_repo(dataset.repo_id, repo_type="dataset")
    assert not hub_server.has_repo(dataset.repo_id, "dataset")


def test_upload_folder_regular_and_lfs_in_one_commit(
    api: HfApi, hub_server: HubServer, uploaded: tuple[str, str], model_folder: Path
) -> None:
    repo_id, oid = uploaded
    assert hub_server.head(repo_id) == oid
    history = hub_server.commit_history(repo_id)
    assert [commit.title for commit in history] == ["Upload model", "initial commit"]

    files = hub_server.files(repo_id)
    assert set(files) == {".gitattributes", "README.md", "config.json", "weights.dat", "sub/tiny.safetensors"}
    assert files["weights.dat"].lfs, "files >= 10 MiB must go through LFS"
    assert files["sub/tiny.safetensors"].lfs, "*.safetensors matches the default .gitattributes"
    assert not files["config.json"].lfs and not files["README.md"].lfs
    assert hub_server.read_file(repo_id, "weights.dat") == (model_folder / "weights.dat").read_bytes()

    # The client took both paths: preupload -> LFS batch -> 2 single-part PUTs + verify -> one NDJSON commit.
    assert hub_server.count("validate_yaml") >= 1  # upload_folder validates the README (twice, in fact)
    assert hub_server.count("preupload") == 1
    assert hub_server.count("lfs_batch") == 1
    assert hub_server.count("lfs_upload", "PUT") == 2
    assert hub_server.count("lfs_verify") == 2
    assert hub_server.count("commit") == 1
    assert ("POST", f"/{repo_id}.git/info/lfs/objects/batch") in hub_server.requests
    assert ("POST", f"/api/models/{repo_id}/commit/main") in hub_server.requests


def test_second_commit_and_downloads_match(
    api: HfApi, hub_server: HubServer, uploaded: tuple[str, str], model_folder: Path, tmp_path: Path
) -> None:
    repo_id, first_oid = uploaded
    new_config = b'{"architecture": "aft_conv", "dim": 128}'
    info = api.create_commit(
        repo_id=repo_id,
        operations=[
            CommitOperationAdd(path_in_repo="config.json", path_or_fileobj=new_config),
            CommitOperationDelete(path_in_repo="sub/"),
        ],
        commit_message="Second commit",
    )
    assert info.oid != first_oid and len(info.oid) == 40
    assert info.commit_url == f"{hub_server.endpoint}/{repo_id}/commit/{info.oid}"
    assert hub_server.commit_history(repo_id)[0].parents == (first_oid,)
    assert [c.commit_id for c in api.list_repo_commits(repo_id)][:2] == [info.oid, first_oid]
    assert "sub/tiny.safetensors" not in api.list_repo_files(repo_id)

    # hf_hub_download and snapshot_download (separate caches) return the uploaded bytes.
    big = hf_hub_download(repo_id, "weights.dat")
    assert sha256_file(big) == sha256_file(model_folder / "weights.dat")
    assert Path(big).parent.name == info.oid  # snapshots/<commit>/...
    snapshot = Path(snapshot_download(repo_id, cache_dir=tmp_path / "other_cache"))
    assert snapshot.name == info.oid
    assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()) == [
        ".gitattributes",
        "README.md",
        "config.json",
        "weights.dat",
    ]
    assert sha256_file(snapshot / "weights.dat") == sha256_file(big)
    assert (snapshot / "config.json").read_bytes() == new_config
    assert (snapshot / "README.md").read_text() == README

    # Old revisions stay addressable by commit id.
    old = hf_hub_download(repo_id, "config.json", revision=first_oid)
    assert Path(old).read_bytes() == (model_folder / "config.json").read_bytes()
    old_tiny = hf_hub_download(repo_id, "sub/tiny.safetensors", revision=first_oid[:12])
    assert Path(old_tiny).read_bytes() == (model_folder / "sub" / "tiny.safetensors").read_bytes()


def test_unchanged_upload_is_skipped(
    api: HfApi, hub_server: HubServer, uploaded: tuple[str, str], model_folder: Path
) -> None:
    repo_id, oid = uploaded
    uploads_before = hub_server.count("lfs_upload")
    info = api.upload_folder(repo_id=repo_id, folder_path=model_folder, commit_message="Same content")
    assert info.oid == oid  # preupload returned the remote oids: the client detected a no-op and did not commit
    assert hub_server.count("commit") == 1
    assert hub_server.count("lfs_upload") == uploads_before


def test_offline_loading_from_cache(hub_server: HubServer, uploaded: tuple[str, str], model_folder: Path) -> None:
    repo_id, oid = uploaded
    online = hf_hub_download(repo_id, "weights.dat")
    snapshot = snapshot_download(repo_id)
    assert Path(snapshot).name == oid
    nb_requests = len(hub_server.requests)

    assert hf_hub_download(repo_id, "weights.dat", local_files_only=True) == online
    assert snapshot_download(repo_id, local_files_only=True) == snapshot
    with offline_mode():
        assert hf_hub_download(repo_id, "weights.dat") == online
        assert snapshot_download(repo_id) == snapshot
    assert len(hub_server.requests) == nb_requests, "offline loads must not hit the server"

    hub_server.stop()  # the Hub is down: the cache still serves the files
    assert hf_hub_download(repo_id, "weights.dat") == online
    assert snapshot_download(repo_id) == snapshot
    assert sha256_file(Path(snapshot) / "weights.dat") == sha256_file(model_folder / "weights.dat")
    with pytest.raises(LocalEntryNotFoundError), offline_mode():  # (online, the client would retry for ~20 s)
        hf_hub_download(repo_id, "never-downloaded.txt")


def test_failed_commit_raises(api: HfApi, hub_server: HubServer, uploaded: tuple[str, str]) -> None:
    repo_id, oid = uploaded
    hub_server.fail_next("commit", status=500, message="database is on fire")
    with pytest.raises(HfHubHTTPError) as excinfo:
        api.upload_file(path_or_fileobj=b"new", path_in_repo="new.txt", repo_id=repo_id)
    assert excinfo.value.response.status_code == 500
    assert "database is on fire" in str(excinfo.value)
    assert hub_server.head(repo_id) == oid, "a failed commit must not move the branch"

    # The fault was consumed: the same upload now succeeds.
    info = api.upload_file(path_or_fileobj=b"new", path_in_repo="new.txt", repo_id=repo_id)
    assert hub_server.head(repo_id) == info.oid != oid


def test_failed_lfs_upload_raises(api: HfApi, hub_server: HubServer) -> None:
    repo_id = api.create_repo("aft-lfs-fail").repo_id
    weights = b"\x01\x02" * 4096
    hub_server.fail_next("lfs_upload", status=403, message="signature expired")
    with pytest.raises(RuntimeError, match="Error while uploading 'model.safetensors'") as excinfo:
        api.upload_file(path_or_fileobj=weights, path_in_repo="model.safetensors", repo_id=repo_id)
    assert isinstance(excinfo.value.__cause__, HfHubHTTPError)
    assert hub_server.count("commit") == 0
    assert "model.safetensors" not in hub_server.files(repo_id)

    # A transient 500 on the PUT is retried by the client (http_backoff) and the upload succeeds.
    hub_server.fail_next("lfs_upload", status=500, count=1)
    api.upload_file(path_or_fileobj=weights, path_in_repo="model.safetensors", repo_id=repo_id)
    assert [r.status for r in hub_server.request_log if r.route == "lfs_upload"] == [403, 500, 200]
    assert hub_server.read_file(repo_id, "model.safetensors") == weights


def test_create_pr(api: HfApi, hub_server: HubServer, uploaded: tuple[str, str]) -> None:
    repo_id, main_oid = uploaded
    info = api.upload_file(path_or_fileobj=b"proposed", path_in_repo="proposal.txt", repo_id=repo_id, create_pr=True)
    assert info.pr_revision == "refs/pr/1" and info.pr_num == 1
    assert info.pr_url == f"{hub_server.endpoint}/{repo_id}/discussions/1"
    assert hub_server.head(repo_id) == main_oid, "create_pr must not touch main"
    assert "proposal.txt" not in api.list_repo_files(repo_id)
    assert "proposal.txt" in api.list_repo_files(repo_id, revision="refs/pr/1")
    assert Path(hf_hub_download(repo_id, "proposal.txt", revision="refs/pr/1")).read_bytes() == b"proposed"
    refs = api.list_repo_refs(repo_id, include_pull_requests=True)
    assert [(ref.ref, ref.target_commit) for ref in refs.pull_requests] == [("refs/pr/1", info.oid)]
    assert [(ref.name, ref.target_commit) for ref in refs.branches] == [("main", main_oid)]
    assert hub_server.commit_history(repo_id, "refs/pr/1")[1].oid == main_oid

    # Pushing again to the PR revision updates the PR, and a second create_pr opens PR #2.
    update = api.upload_file(path_or_fileobj=b"v2", path_in_repo="proposal.txt", repo_id=repo_id, revision="refs/pr/1")
    assert hub_server.head(repo_id, "refs/pr/1") == update.oid
    second = api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo_id, create_pr=True)
    assert second.pr_revision == "refs/pr/2"


def test_model_info_and_listing(api: HfApi, hub_server: HubServer, uploaded: tuple[str, str]) -> None:
    repo_id, oid = uploaded
    info = model_info(repo_id, files_metadata=True)  # module-level function, as timm uses it
    assert info.id == repo_id and info.sha == oid and info.private is False
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == {".gitattributes", "README.md", "config.json", "weights.dat", "sub/tiny.safetensors"}
    assert siblings["weights.dat"].size == BIG_SIZE // 32 * 32 + 4
    assert siblings["weights.dat"].lfs is not None and siblings["config.json"].lfs is None
    assert info.card_data is not None and info.card_data.license == "apache-2.0"
    assert "aft" in info.tags

    assert sorted(api.list_repo_files(repo_id)) == sorted(siblings)
    hub_server.tree_page_size = 2  # force pagination through the Link header
    tree_calls = hub_server.count("tree")
    entries = list(api.list_repo_tree(repo_id, recursive=True))
    assert {e.path for e in entries} == set(siblings) | {"sub"}
    assert hub_server.count("tree") - tree_calls == 3
    top = {e.path for e in api.list_repo_tree(repo_id)}
    assert top == {".gitattributes", "README.md", "config.json", "weights.dat", "sub"}
    (tiny,) = api.list_repo_tree(repo_id, path_in_repo="sub", expand=True)
    assert tiny.path == "sub/tiny.safetensors" and tiny.lfs is not None and tiny.last_commit.oid == oid
    assert [p.path for p in api.get_paths_info(repo_id, ["config.json", "missing", "sub"])] == ["config.json", "sub"]

    assert api.file_exists(repo_id, "config.json")
    assert not api.file_exists(repo_id, "nope.json")
    assert api.revision_exists(repo_id, oid) and not api.revision_exists(repo_id, "no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo_id, "nope.json")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo_id, "config.json", revision="no-such-branch")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(f"{DEFAULT_USER}/no-such-repo", "config.json")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(f"{DEFAULT_USER}/no-such-repo")

    api.create_branch(repo_id, branch="dev")
    api.create_tag(repo_id, tag="v1.0")
    assert api.model_info(repo_id, revision="v1.0").sha == oid
    assert {b.name for b in api.list_repo_refs(repo_id).branches} == {"main", "dev"}


def test_readme_yaml_validation(api: HfApi, hub_server: HubServer) -> None:
    repo_id = api.create_repo("aft-card").repo_id
    bad = "---\nlicense: [1, 2]\ntags: not-a: list: at all\n---\n# bad\n"
    with pytest.raises(ValueError, match="Invalid metadata in README.md"):
        api.upload_file(path_or_fileobj=bad.encode(), path_in_repo="README.md", repo_id=repo_id)
    assert hub_server.count("validate_yaml") == 1
    assert hub_server.count("commit") == 0

    with pytest.raises(ValueError, match='"tags" must be a string or an array of strings'):
        api.upload_file(path_or_fileobj=b"---\ntags: {a: 1}\n---\n", path_in_repo="README.md", repo_id=repo_id)

    api.upload_file(path_or_fileobj=README.encode(), path_in_repo="README.md", repo_id=repo_id)
    assert hub_server.count("validate_yaml") == 3
    card = api.model_info(repo_id).card_data
    assert card is not None and card.library_name == "timm" and card.tags == ["aft", "vision"]


def test_multipart_lfs_upload(api: HfApi, hub_server: HubServer) -> None:
    hub_server.lfs_multipart_chunk_size = 1024 * 1024
    repo_id = api.create_repo("aft-multipart").repo_id
    data = bytes(range(256)) * (10 * 1024 + 7)  # ~2.5 MiB -> 3 parts
    api.upload_file(path_or_fileobj=data, path_in_repo="pytorch_model.bin", repo_id=repo_id)
    assert hub_server.count("lfs_part", "PUT") == 3
    assert hub_server.count("lfs_complete") == 1
    assert Path(hf_hub_download(repo_id, "pytorch_model.bin")).read_bytes() == data


def test_subprocess_uses_env(hub_server: HubServer, uploaded: tuple[str, str], model_folder: Path) -> None:
    repo_id, _ = uploaded
    script = textwrap.dedent(
        f"""
        import hashlib, pathlib
        from huggingface_hub import HfApi, hf_hub_download
        path = hf_hub_download({repo_id!r}, "weights.dat")
        print(HfApi().whoami()["name"], hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest(), path)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=hub_server.env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    user, digest, path = result.stdout.split()
    assert user == DEFAULT_USER
    assert digest == sha256_file(model_folder / "weights.dat")
    assert Path(path).is_relative_to(hub_server.home / "hub")


def test_transformers_push_to_hub_and_from_pretrained(hub_server: HubServer) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.utils.hub import hf_api

    assert hf_api().endpoint == hub_server.endpoint  # transformers' cached HfApi was reset by the fixture
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
    config.push_to_hub("aft-bert")  # create_repo + create_commit through transformers' `hf_api()`
    repo_id = f"{DEFAULT_USER}/aft-bert"
    assert "config.json" in hub_server.files(repo_id)

    loaded = transformers.AutoConfig.from_pretrained(repo_id)  # cached_file -> hf_hub_download
    assert (loaded.model_type, loaded.hidden_size, loaded.intermediate_size) == ("bert", 32, 37)
    assert hub_server.count("resolve") >= 1
    assert hub_server.count("unknown") == 0


def test_timm_push_and_hf_hub_create_model(hub_server: HubServer) -> None:
    timm = pytest.importorskip("timm")
    torch = pytest.importorskip("torch")
    model = timm.create_model("resnet10t", num_classes=7)
    timm.models.push_to_hf_hub(model, "aft-timm", commit_message="Add weights")
    repo_id = f"{DEFAULT_USER}/aft-timm"
    assert hub_server.commit_history(repo_id)[0].title == "Add weights"
    assert "model.safetensors" in hub_server.files(repo_id)

    loaded = timm.create_model(f"hf-hub:{repo_id}", pretrained=True)  # timm's hf-hub: loader
    assert loaded.pretrained_cfg["hf_hub_id"] == repo_id
    assert loaded.num_classes == 7
    assert list(loaded.state_dict()) == list(model.state_dict())
    for (name, expected), actual in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(expected, actual), name
