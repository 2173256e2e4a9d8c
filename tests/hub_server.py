"""Loopback Hugging Face Hub server for tests.

A small, in-process implementation of the parts of the Hugging Face Hub HTTP API that the *unmodified*
``huggingface_hub`` client (and libraries built on it: timm's ``hf-hub:`` loader, transformers'
``from_pretrained``/``push_to_hub``) use to create repos, upload files (regular and plain Git-LFS uploads) and
download them again. It listens on ``127.0.0.1`` with a random free port and serves real HTTP from a background
thread (:class:`http.server.ThreadingHTTPServer`); only the standard library (plus ``yaml``, which is a hard
dependency of ``huggingface_hub`` itself, for README metadata validation) is used.

Usage in a test::

    from hub_server import hub_server_fixture  # noqa: F401  (registers the ``hub_server`` fixture)

    def test_roundtrip(hub_server, tmp_path):
        from huggingface_hub import HfApi, hf_hub_download

        api = HfApi()  # no endpoint/token needed: the fixture points the client at the loopback server
        repo_id = api.create_repo("my-model", exist_ok=True).repo_id  # -> "test-user/my-model"
        api.upload_file(path_or_fileobj=b"hello", path_in_repo="hello.txt", repo_id=repo_id)
        assert open(hf_hub_download(repo_id, "hello.txt"), "rb").read() == b"hello"
        assert ("POST", f"/api/models/{repo_id}/commit/main") in hub_server.requests

(``tests/`` is on ``sys.path`` under pytest's default ``prepend`` import mode; the import can also live in
``tests/conftest.py`` to make the fixture available everywhere. The fixture function is named
``hub_server_fixture`` so that importing it does not clash with the ``hub_server`` test argument.)

What the ``hub_server`` fixture does (see :func:`patch_client`):

* starts a :class:`HubServer` (token :data:`DEFAULT_TOKEN` for user :data:`DEFAULT_USER`, org :data:`DEFAULT_ORG`);
* sets ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME``/``HF_HUB_CACHE``/... (a fresh temporary directory),
  ``HF_HUB_DISABLE_XET=1`` (the server speaks plain LFS, not Xet), ``HF_HUB_DISABLE_TELEMETRY=1`` and adds the
  loopback host to ``NO_PROXY``; unsets ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``/``HF_OIDC_RESOURCE``;
* because ``huggingface_hub`` reads those variables once, at import time, it also patches the derived module
  constants: ``huggingface_hub.constants.ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE``, ``HF_URL_HOSTS``, the cache
  and token paths, ``HF_HUB_DISABLE_XET``, ``HF_HUB_OFFLINE``, ``HF_HUB_DISABLE_TELEMETRY``; the endpoint of the
  module-level ``huggingface_hub.hf_api.api`` singleton (behind ``huggingface_hub.model_info``,
  ``create_repo``..., which timm imports directly); ``huggingface_hub.utils._http._HUB_ORIGINS``; the cache path
  copies in ``utils._cache_manager``/``utils._cache_assets``; and resets transformers' cached ``hf_api()``
  instance and its ``HF_MODULES_CACHE`` when transformers is already imported;
* closes the shared ``httpx`` client before and after the test so no pooled connection leaks between servers.

Everything is undone at teardown. Other configurations (open server without token, strict namespaces, module
scope...) are built the same way::

    @pytest.fixture(scope="module")
    def open_hub(tmp_path_factory):
        with HubServer(token=None) as server, patched_client(server, tmp_path_factory.mktemp("hf_home")):
            yield server

Useful in tests: :meth:`HubServer.files`/:meth:`~HubServer.read_file`/:meth:`~HubServer.head`/
:meth:`~HubServer.commit_history` inspect the server state without HTTP; :meth:`HubServer.stop` simulates the Hub
going down (cached files must still load) and :meth:`~HubServer.start` brings it back; :func:`offline_mode` emulates
``HF_HUB_OFFLINE=1`` in-process (setting the variable alone has no effect once ``huggingface_hub`` is imported).

Subprocesses: environment changes are inherited, but a child that needs a *clean* environment (or that is started
with an explicit ``env=``) should use :meth:`HubServer.env`, which returns ``os.environ`` plus every variable the
client needs (``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_DISABLE_XET``...) and without
the offline switches::

    subprocess.run([sys.executable, "train.py", "--push"], env=hub_server.env(), check=True)

Server behaviour (mirrors huggingface.co closely enough for the client):

* repos are ``namespace/name`` model, dataset or space repos, created with an initial commit holding the
  standard ``.gitattributes`` (like the real Hub); commits get 40-hex ids, branch ``main``, tags, ``refs/pr/N``
  pull-request refs (``create_pr=True``); revisions are addressable by branch, tag, PR ref or (short) commit id;
* a file is uploaded through LFS when it is at least :attr:`HubServer.lfs_threshold` bytes (10 MiB) or matches an
  LFS pattern of the repo's ``.gitattributes`` (``*.safetensors``, ``*.bin``, ``*.pt``...); LFS files have ETag
  = sha256 (plus ``X-Linked-Etag``/``X-Linked-Size``), regular files ETag = git blob sha1;
* set :attr:`HubServer.lfs_multipart_chunk_size` to exercise the multipart LFS protocol, and
  :attr:`HubServer.tree_page_size` to exercise ``list_repo_tree`` pagination;
* :meth:`HubServer.fail_next` injects failures per route (see :data:`ROUTES`), :attr:`HubServer.requests` logs
  ``(method, path)`` of every request, :attr:`HubServer.request_log` keeps route names, queries and statuses.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import fnmatch
import hashlib
import http.server
import json
import logging
import os
import re
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import pytest

logger = logging.getLogger(__name__)

DEFAULT_TOKEN = "hf_loopback_test_token"
"""Token accepted by the fixture's server (exported as ``HF_TOKEN``)."""
DEFAULT_USER = "test-user"
"""User name :data:`DEFAULT_TOKEN` belongs to."""
DEFAULT_ORG = "test-org"
"""Organisation :data:`DEFAULT_USER` is a member of."""

DEFAULT_BRANCH = "main"
LFS_THRESHOLD = 10 * 1024 * 1024
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"

ROUTES: tuple[str, ...] = (
    "whoami",
    "agent_harnesses",
    "create_repo",
    "delete_repo",
    "validate_yaml",
    "repo_info",
    "tree",
    "refs",
    "commits",
    "paths_info",
    "preupload",
    "commit",
    "branch",
    "tag",
    "lfs_batch",
    "lfs_verify",
    "lfs_upload",
    "lfs_part",
    "lfs_complete",
    "resolve",
    "unknown",
)
"""Route names understood by :meth:`HubServer.fail_next` and recorded in :attr:`HubServer.request_log`."""

_REPO_TYPE_PLURALS = {"models": "model", "datasets": "dataset", "spaces": "space"}
_URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_REPO_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HEX40_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_YAML_BLOCK_RE = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")
_LOOPBACK_NO_PROXY = ("127.0.0.1", "localhost", "::1")

# Standard LFS patterns, as in the `.gitattributes` the Hub puts in every new repo.
_LFS_PATTERNS = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*", "*.mlmodel",
    "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb", "*.pickle", "*.pkl", "*.pt",
    "*.pth", "*.rar", "*.safetensors", "saved_model/**/*", "*.tar.*", "*.tar", "*.tflite", "*.tgz", "*.wasm",
    "*.xz", "*.zip", "*.zst", "*tfevents*",
)  # fmt: skip
DEFAULT_GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in _LFS_PATTERNS)

# Environment variables removed from the client environment: they would disable or redirect the loopback traffic.
_UNSET_ENV_VARS = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_OIDC_RESOURCE",
    "HF_OIDC_ID_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HUGGINGFACE_CO_STAGING",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN",
    "HF_HUB_ENABLE_HF_TRANSFER",
    "HUGGINGFACE_HUB_CACHE",
    "HUGGINGFACE_ASSETS_CACHE",
)


# ----------------------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------------------


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _iso(moment: datetime.datetime) -> str:
    """Format a datetime like the Hub does (``2024-01-31T12:00:00.000Z``)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def git_blob_oid(data: bytes) -> str:
    """Git object id (sha1) of a blob with content ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """Content of the Git-LFS pointer file stored in git for an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def split_front_matter(content: str) -> str | None:
    """Return the YAML front matter of a README (without the ``---`` fences), or ``None`` when there is none."""
    match = _YAML_BLOCK_RE.search(content)
    return match.group(2) if match else None


def validate_card_metadata(content: str) -> tuple[list[str], list[str], dict[str, Any]]:
    """Validate the YAML front matter of a repo card like the Hub's ``/api/validate-yaml`` does (a subset).

    Returns ``(errors, warnings, metadata)``: the YAML must parse to a mapping, ``license``/``library_name``/
    ``pipeline_tag`` must be strings, ``tags``/``datasets``/``metrics`` lists of strings (or a single string),
    ``language``/``base_model`` a string or a list of strings, ``model-index`` a list.
    """
    import yaml  # hard dependency of huggingface_hub; imported lazily to keep this module importable without it

    front_matter = split_front_matter(content)
    if front_matter is None or not front_matter.strip():
        return [], ["Empty or missing yaml metadata in repo card"], {}
    try:
        metadata = yaml.safe_load(front_matter)
    except yaml.YAMLError as err:
        return [f"Invalid YAML in README.md metadata: {err}".replace("\n", " ")], [], {}
    if metadata is None:
        return [], ["Empty or missing yaml metadata in repo card"], {}
    if not isinstance(metadata, dict):
        return [f'"metadata" must be a YAML mapping, got {type(metadata).__name__}'], [], {}

    errors: list[str] = []

    def is_str_list(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)

    for key in ("license", "library_name", "pipeline_tag", "license_name", "license_link"):
        if key in metadata and not isinstance(metadata[key], str):
            errors.append(f'"{key}" must be a string')
    for key in ("tags", "datasets", "metrics", "language", "base_model"):
        if key in metadata and not (isinstance(metadata[key], str) or is_str_list(metadata[key])):
            errors.append(f'"{key}" must be a string or an array of strings')
    if "model-index" in metadata and not isinstance(metadata["model-index"], list):
        errors.append('"model-index" must be an array')
    return errors, [], metadata


def _gitattributes_lfs_patterns(content: str) -> list[str]:
    patterns = []
    for line in content.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            patterns.append(parts[0])
    return patterns


def _matches_pattern(path: str, pattern: str) -> bool:
    """Simplified gitattributes/gitignore matching: patterns without ``/`` match the basename anywhere."""
    pattern = pattern.lstrip("/")
    if pattern.endswith("/"):
        return path.startswith(pattern) or f"/{pattern}" in f"/{path}"
    if "/" not in pattern:
        return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern.replace("**/", ""))


def _is_ignored(path: str, gitignore: str | None) -> bool:
    if not gitignore:
        return False
    ignored = False
    for raw_line in gitignore.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            if _matches_pattern(path, line[1:]):
                ignored = False
        elif _matches_pattern(path, line):
            ignored = True
    return ignored


def _split_revision(segments: list[str]) -> tuple[str, list[str]]:
    """Split ``[<revision>, *path]`` where the revision is either one (``%2F``-quoted) segment or ``refs/x/y``."""
    if not segments:
        return DEFAULT_BRANCH, []
    if segments[0] == "refs" and len(segments) >= 3:
        return "/".join(segments[:3]), segments[3:]
    return segments[0], segments[1:]


# ----------------------------------------------------------------------------------------------------------------
# Data model
# ----------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """A file in a commit tree. Content lives in the blob store, addressed by its sha256."""

    sha256: str
    size: int
    lfs: bool
    git_oid: str
    """Git blob id: of the content for regular files, of the LFS pointer for LFS files."""

    @property
    def etag(self) -> str:
        """Value of the ``ETag`` header of ``/resolve`` (sha256 for LFS files, git blob id otherwise)."""
        return self.sha256 if self.lfs else self.git_oid

    @property
    def pointer_size(self) -> int:
        """Size of the LFS pointer file."""
        return len(lfs_pointer(self.sha256, self.size))


@dataclasses.dataclass(frozen=True)
class Commit:
    """An immutable commit: a full snapshot of the tree plus metadata."""

    oid: str
    parents: tuple[str, ...]
    title: str
    message: str
    author: str
    date: datetime.datetime
    files: Mapping[str, FileEntry]


@dataclasses.dataclass
class Repo:
    """State of one repository."""

    repo_type: str
    repo_id: str
    private: bool
    created_at: datetime.datetime
    commits: dict[str, Commit] = dataclasses.field(default_factory=dict)
    branches: dict[str, str] = dataclasses.field(default_factory=dict)
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    pull_requests: dict[int, str] = dataclasses.field(default_factory=dict)
    lfs_objects: set[str] = dataclasses.field(default_factory=set)
    next_discussion: int = 1

    @property
    def namespace(self) -> str:
        """Owner of the repo."""
        return self.repo_id.split("/", 1)[0]

    @property
    def url_path(self) -> str:
        """Path of the repo's web page, e.g. ``datasets/ns/name``."""
        return _URL_PREFIXES[self.repo_type] + self.repo_id


@dataclasses.dataclass
class RequestRecord:
    """One request received by the server."""

    method: str
    path: str
    query: dict[str, list[str]]
    route: str
    status: int = 0
    authenticated: bool = False


@dataclasses.dataclass
class _Fault:
    route: str
    status: int
    remaining: int
    message: str
    error_code: str | None
    drop_connection: bool
    method: str | None


@dataclasses.dataclass
class _UploadTicket:
    repo_key: tuple[str, str]
    oid: str
    size: int
    chunk_size: int | None = None
    parts: dict[int, tuple[Path, str]] = dataclasses.field(default_factory=dict)


class HubError(Exception):
    """An error answered as ``{"error": message}`` with the Hub's ``X-Error-Code``/``X-Error-Message`` headers."""

    def __init__(
        self,
        status: int,
        message: str,
        error_code: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_code = error_code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


@dataclasses.dataclass
class _Request:
    method: str
    path: str
    segments: list[str]
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: IO[bytes]
    body_size: int
    user: str | None = None

    def param(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default

    def flag(self, name: str) -> bool:
        return (self.param(name) or "").lower() in {"1", "true", "yes", "on"}

    def read(self) -> bytes:
        self.body.seek(0)
        return self.body.read()

    def json(self) -> Any:
        raw = self.read()
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from err


@dataclasses.dataclass
class _Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    file: Path | None = None
    file_range: tuple[int, int] | None = None  # inclusive start, exclusive end

    @classmethod
    def json(cls, payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> _Response:
        return cls(
            status=status,
            body=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json; charset=utf-8", **(headers or {})},
        )


# ----------------------------------------------------------------------------------------------------------------
# HTTP plumbing
# ----------------------------------------------------------------------------------------------------------------


class _ThreadingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], hub: HubServer) -> None:
        self.hub = hub
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ThreadingServer
    server_version = "LoopbackHub/1.0"

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        """Serve a GET request."""
        self._dispatch()

    def do_HEAD(self) -> None:
        """Serve a HEAD request."""
        self._dispatch()

    def do_POST(self) -> None:
        """Serve a POST request."""
        self._dispatch()

    def do_PUT(self) -> None:
        """Serve a PUT request."""
        self._dispatch()

    def do_DELETE(self) -> None:
        """Serve a DELETE request."""
        self._dispatch()

    def _read_body(self) -> tuple[IO[bytes], int]:
        spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=16 * 1024 * 1024)
        size = 0
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            while True:
                line = self.rfile.readline(65537)
                chunk_size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if chunk_size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                remaining = chunk_size
                while remaining:
                    data = self.rfile.read(min(remaining, 1024 * 1024))
                    if not data:
                        raise ConnectionError("Connection closed while reading a chunked body")
                    spool.write(data)
                    remaining -= len(data)
                size += chunk_size
                self.rfile.readline(65537)  # CRLF after each chunk
        else:
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining:
                data = self.rfile.read(min(remaining, 1024 * 1024))
                if not data:
                    raise ConnectionError("Connection closed while reading the body")
                spool.write(data)
                size += len(data)
                remaining -= len(data)
        spool.seek(0)
        return spool, size

    def _dispatch(self) -> None:
        hub = self.server.hub
        split = urlsplit(self.path)
        query = parse_qs(split.query, keep_blank_values=True)
        try:
            body, body_size = self._read_body()
        except (ValueError, ConnectionError, OSError) as err:
            logger.warning("Could not read request body of %s %s: %s", self.command, split.path, err)
            self.close_connection = True
            return
        with body:
            segments = [unquote(part) for part in split.path.split("/")[1:]]
            if segments and segments[-1] == "":
                segments.pop()
            request = _Request(
                method=self.command,
                path=split.path,
                segments=segments,
                query=query,
                headers={key.lower(): value for key, value in self.headers.items()},
                body=body,
                body_size=body_size,
            )
            route, handler = hub._match(request)
            record = RequestRecord(self.command, split.path, query, route)
            hub._record(record)
            fault = hub._take_fault(route, self.command)
            if fault is not None and fault.drop_connection:
                logger.info("Injected fault: dropping connection for %s %s", self.command, split.path)
                record.status = -1
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            try:
                if fault is not None:
                    logger.info("Injected fault: %s for %s %s", fault.status, self.command, split.path)
                    raise HubError(fault.status, fault.message, fault.error_code)
                request.user = hub._authenticate(request)
                record.authenticated = request.user is not None
                response = handler(request)
            except HubError as err:
                response = _error_response(err)
            except Exception as err:  # pragma: no cover - a bug in the server: answer 500 and log it
                logger.exception("Loopback hub failed on %s %s", self.command, split.path)
                response = _error_response(HubError(500, f"Internal server error: {err!r}"))
            record.status = response.status
            self._write(response)

    def _write(self, response: _Response) -> None:
        self.send_response(response.status)
        length = len(response.body)
        if response.file is not None:
            start, end = response.file_range or (0, response.file.stat().st_size)
            length = end - start
        headers = {"Content-Length": str(length), **response.headers}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command == "HEAD":
            return
        try:
            if response.file is not None:
                start, end = response.file_range or (0, length)
                with response.file.open("rb") as handle:
                    handle.seek(start)
                    remaining = end - start
                    while remaining > 0:
                        data = handle.read(min(remaining, 1024 * 1024))
                        if not data:
                            break
                        self.wfile.write(data)
                        remaining -= len(data)
            else:
                self.wfile.write(response.body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def _error_response(err: HubError) -> _Response:
    headers = dict(err.headers)
    safe_message = err.message.encode("ascii", "replace").decode().replace("\r", " ").replace("\n", " ")[:500]
    headers["X-Error-Message"] = safe_message
    if err.error_code:
        headers["X-Error-Code"] = err.error_code
    return _Response.json({"error": err.message, **err.extra}, status=err.status, headers=headers)


# ----------------------------------------------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------------------------------------------


class HubServer:
    """In-memory Hugging Face Hub served over HTTP on the loopback interface.

    Args:
        token: token accepted for :attr:`user`. ``None`` makes the server open: any (or no) token acts as
            :attr:`user`. With a token configured, requests carrying an unknown token get ``401`` and write
            operations without a token get ``401``.
        user: name of the token's user (the namespace of ``create_repo("name")``).
        orgs: organisations of :attr:`user` (reported by ``whoami``).
        strict_namespaces: if true, users can only write to their own namespace and their orgs (``403`` otherwise).
        lfs_threshold: files of at least this many bytes are uploaded through LFS.
        lfs_multipart_chunk_size: when set, LFS objects larger than this are uploaded with the multipart protocol.
        tree_page_size: page size of ``list_repo_tree``/``list_repo_commits``.
        initial_gitattributes: create new repos with an initial commit holding the standard ``.gitattributes``.
        host / port: address to listen on (port ``0`` picks a free one).
        storage_dir: where blobs are stored (default: a temporary directory removed by :meth:`stop`).
    """

    def __init__(
        self,
        *,
        token: str | None = DEFAULT_TOKEN,
        user: str = DEFAULT_USER,
        orgs: Sequence[str] = (DEFAULT_ORG,),
        strict_namespaces: bool = False,
        lfs_threshold: int = LFS_THRESHOLD,
        lfs_multipart_chunk_size: int | None = None,
        tree_page_size: int = 1000,
        initial_gitattributes: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        storage_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.token = token
        self.user = user
        self.orgs = list(orgs)
        self.tokens: dict[str, str] = {token: user} if token else {}
        self.strict_namespaces = strict_namespaces
        self.lfs_threshold = lfs_threshold
        self.lfs_multipart_chunk_size = lfs_multipart_chunk_size
        self.tree_page_size = tree_page_size
        self.initial_gitattributes = initial_gitattributes
        self.host = host
        self.port = port
        self.home: Path | None = None
        """Client home directory (``HF_HOME``) set by :func:`patch_client`, used by :meth:`env`."""
        self.requests: list[tuple[str, str]] = []
        """``(method, path)`` of every request received, path without query string (still percent-encoded)."""
        self.request_log: list[RequestRecord] = []
        """Detailed log: route name, query, response status of every request."""
        self._owns_storage = storage_dir is None
        self._storage = Path(storage_dir) if storage_dir is not None else None
        self._repos: dict[tuple[str, str], Repo] = {}
        self._tickets: dict[str, _UploadTicket] = {}
        self._faults: list[_Fault] = []
        self._lock = threading.RLock()
        self._httpd: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None
        self._commit_counter = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43123`` (usable as ``HF_ENDPOINT``)."""
        if not self.port:
            raise RuntimeError("HubServer has not been started")
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server is accepting connections."""
        return self._httpd is not None

    def start(self) -> HubServer:
        """Start serving in a daemon thread. Restarting after :meth:`stop` reuses the same port and state."""
        if self._httpd is not None:
            return self
        if self._storage is None:
            self._storage = Path(tempfile.mkdtemp(prefix="loopback_hub_"))
        (self._storage / "blobs").mkdir(parents=True, exist_ok=True)
        (self._storage / "tmp").mkdir(parents=True, exist_ok=True)
        self._httpd = _ThreadingServer((self.host, self.port), self)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="loopback-hub", daemon=True
        )
        self._thread.start()
        logger.info("Loopback hub listening on %s", self.endpoint)
        return self

    def stop(self, *, cleanup: bool = False) -> None:
        """Stop serving and close every open connection (pooled client connections then fail to reconnect).

        The repos are kept, so :meth:`start` serves them again on the same port.

        Args:
            cleanup: also delete the blob storage if the server created it (see :meth:`close`).
        """
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            with httpd.connections_lock:
                connections = list(httpd.connections)
            for connection in connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)
            httpd.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            logger.info("Loopback hub on port %s stopped", self.port)
        if cleanup and self._owns_storage and self._storage is not None:
            shutil.rmtree(self._storage, ignore_errors=True)
            self._storage = None

    def close(self) -> None:
        """Stop the server and delete its storage."""
        self.stop(cleanup=True)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- test helpers ----------------------------------------------------------------------------------------

    def add_token(self, token: str, user: str) -> None:
        """Accept another token, acting as ``user``."""
        self.tokens[token] = user

    def fail_next(
        self,
        route: str,
        status: int = 500,
        *,
        count: int = 1,
        message: str | None = None,
        error_code: str | None = None,
        method: str | None = None,
        drop_connection: bool = False,
    ) -> None:
        """Make the next ``count`` requests to ``route`` fail.

        Args:
            route: one of :data:`ROUTES` (e.g. ``"commit"``, ``"lfs_upload"``, ``"resolve"``, ``"preupload"``) or
                ``"*"`` for any route.
            status: HTTP status to answer (the body is ``{"error": message}``). The client retries some calls on
                429/5xx with backoff (1 s, 2 s, 4 s, 8 s, 8 s): preupload, LFS batch/PUT/verify, tree listing, and the
                HEAD of ``hf_hub_download`` when the file is not cached; commits, ``repo_info`` and GETs of file
                content are not retried. Use a 4xx status (or ``count`` > 5) for an immediate hard failure.
            count: number of requests to fail.
            message: error message (default: ``"Injected failure"``).
            error_code: value of the ``X-Error-Code`` header (e.g. ``"RepoNotFound"``).
            method: only fail requests with this HTTP method.
            drop_connection: close the connection without answering (simulates a network error) instead.
        """
        if route != "*" and route not in ROUTES:
            raise ValueError(f"Unknown route {route!r}; expected one of {ROUTES}")
        with self._lock:
            self._faults.append(
                _Fault(
                    route=route,
                    status=status,
                    remaining=count,
                    message=message or f"Injected failure ({route})",
                    error_code=error_code,
                    drop_connection=drop_connection,
                    method=method.upper() if method else None,
                )
            )

    def clear_faults(self) -> None:
        """Cancel pending injected failures."""
        with self._lock:
            self._faults.clear()

    def count(self, route: str, method: str | None = None) -> int:
        """Number of requests received for ``route`` (optionally only with ``method``)."""
        return sum(1 for r in self.request_log if r.route == route and (method is None or r.method == method))

    def client_env(self) -> dict[str, str]:
        """Environment variables pointing a ``huggingface_hub`` client at this server."""
        env = {
            "HF_ENDPOINT": self.endpoint,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        }
        if self.token:
            env["HF_TOKEN"] = self.token
        if self.home is not None:
            home = self.home
            env.update(
                HF_HOME=str(home),
                HF_HUB_CACHE=str(home / "hub"),
                HF_ASSETS_CACHE=str(home / "assets"),
                HF_XET_CACHE=str(home / "xet"),
                HF_TOKEN_PATH=str(home / "token"),
                HF_MODULES_CACHE=str(home / "modules"),
            )
        return env

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Full environment for a subprocess using this server: ``base`` (default ``os.environ``) + :meth:`client_env`.

        Offline switches and variables redirecting the client elsewhere are removed; the loopback host is added
        to ``NO_PROXY``/``no_proxy``.
        """
        env = dict(os.environ if base is None else base)
        for name in _UNSET_ENV_VARS:
            env.pop(name, None)
        env.update(self.client_env())
        for name in ("NO_PROXY", "no_proxy"):
            env[name] = _merge_no_proxy(env.get(name))
        return env

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        """Direct access to a repo's state (raises ``KeyError`` if it does not exist)."""
        return self._repos[(repo_type, repo_id)]

    def has_repo(self, repo_id: str, repo_type: str = "model") -> bool:
        """Whether the repo exists on the server."""
        return (repo_type, repo_id) in self._repos

    def head(self, repo_id: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model") -> str:
        """Commit id ``revision`` points to."""
        with self._lock:
            oid = self._resolve(self.repo(repo_id, repo_type), revision)
        if oid is None:
            raise KeyError(f"{repo_id}@{revision} has no commit")
        return oid

    def files(self, repo_id: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model") -> dict[str, FileEntry]:
        """Files of ``repo_id`` at ``revision``."""
        repo = self.repo(repo_id, repo_type)
        return dict(repo.commits[self.head(repo_id, revision, repo_type)].files)

    def read_file(self, repo_id: str, path: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model") -> bytes:
        """Content of ``path`` at ``revision`` (server side, no HTTP)."""
        return self._blob_path(self.files(repo_id, revision, repo_type)[path].sha256).read_bytes()

    def commit_history(self, repo_id: str, revision: str = DEFAULT_BRANCH, repo_type: str = "model") -> list[Commit]:
        """Commits reachable from ``revision`` following first parents, newest first."""
        repo = self.repo(repo_id, repo_type)
        history = []
        oid: str | None = self.head(repo_id, revision, repo_type)
        while oid is not None:
            commit = repo.commits[oid]
            history.append(commit)
            oid = commit.parents[0] if commit.parents else None
        return history

    # -- dispatch --------------------------------------------------------------------------------------------

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append((record.method, record.path))
            self.request_log.append(record)

    def _take_fault(self, route: str, method: str) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.route in (route, "*") and fault.method in (None, method) and fault.remaining > 0:
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def _match(self, request: _Request) -> tuple[str, Callable[[_Request], _Response]]:
        """Map a request to ``(route name, handler)``."""
        method, seg = request.method, request.segments
        if seg[:1] == ["api"]:
            if seg == ["api", "whoami-v2"] and method == "GET":
                return "whoami", self._handle_whoami
            if seg == ["api", "agent-harnesses"] and method == "GET":
                return "agent_harnesses", lambda _request: _Response.json({"standardEnvVars": [], "harnesses": {}})
            if seg == ["api", "repos", "create"] and method == "POST":
                return "create_repo", self._handle_create_repo
            if seg == ["api", "repos", "delete"] and method == "DELETE":
                return "delete_repo", self._handle_delete_repo
            if seg == ["api", "validate-yaml"] and method == "POST":
                return "validate_yaml", self._handle_validate_yaml
            if len(seg) >= 4 and seg[1] in _REPO_TYPE_PLURALS:
                rest = seg[4:]
                action = rest[0] if rest else None
                table: dict[tuple[str | None, str], tuple[str, Callable[[_Request], _Response]]] = {
                    (None, "GET"): ("repo_info", self._handle_repo_info),
                    ("revision", "GET"): ("repo_info", self._handle_repo_info),
                    ("tree", "GET"): ("tree", self._handle_tree),
                    ("refs", "GET"): ("refs", self._handle_refs),
                    ("commits", "GET"): ("commits", self._handle_commits),
                    ("paths-info", "POST"): ("paths_info", self._handle_paths_info),
                    ("preupload", "POST"): ("preupload", self._handle_preupload),
                    ("commit", "POST"): ("commit", self._handle_commit),
                    ("branch", "POST"): ("branch", self._handle_branch),
                    ("branch", "DELETE"): ("branch", self._handle_branch),
                    ("tag", "POST"): ("tag", self._handle_tag),
                }
                if (action, method) in table:
                    return table[(action, method)]
            return "unknown", self._handle_unknown
        if seg[:1] == ["_lfs"] and len(seg) >= 3:
            if seg[1] == "upload" and method == "PUT":
                return "lfs_upload", self._handle_lfs_upload
            if seg[1] == "part" and method == "PUT" and len(seg) == 4:
                return "lfs_part", self._handle_lfs_part
            if seg[1] == "complete" and method == "POST":
                return "lfs_complete", self._handle_lfs_complete
            return "unknown", self._handle_unknown
        repo_seg = seg[1:] if seg[:1] and seg[0] in ("datasets", "spaces") else seg
        if len(repo_seg) >= 3:
            rest = repo_seg[2:]
            if repo_seg[1].endswith(".git") and rest[:3] == ["info", "lfs", "objects"] and method == "POST":
                if rest[3:] == ["batch"]:
                    return "lfs_batch", self._handle_lfs_batch
                if rest[3:] == ["verify"]:
                    return "lfs_verify", self._handle_lfs_verify
            if rest[0] == "resolve" and method in ("GET", "HEAD"):
                return "resolve", self._handle_resolve
        return "unknown", self._handle_unknown

    # -- auth ------------------------------------------------------------------------------------------------

    def _authenticate(self, request: _Request) -> str | None:
        """Return the user behind the request's token (``None`` if anonymous); 401 for unknown tokens."""
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if not self.tokens:  # open server
            return self.user if token else None
        if token is None:
            return None
        if token not in self.tokens:
            raise HubError(401, INVALID_CREDENTIALS)
        return self.tokens[token]

    def _require_user(self, request: _Request) -> str:
        if request.user is None:
            if not self.tokens:
                return self.user
            raise HubError(401, "You must be authenticated to access this resource (missing token).")
        return request.user

    def _can_write_namespace(self, user: str, namespace: str) -> bool:
        return not self.strict_namespaces or namespace == user or namespace in self.orgs

    def _can_read(self, user: str | None, repo: Repo) -> bool:
        if not repo.private:
            return True
        if not self.tokens:
            return True
        return user is not None and (repo.namespace == user or repo.namespace in self.orgs)

    # -- repo helpers ----------------------------------------------------------------------------------------

    def _repo_from_request(self, request: _Request, *, write: bool = False) -> Repo:
        seg = request.segments
        if seg[0] == "api":
            repo_type = _REPO_TYPE_PLURALS[seg[1]]
            namespace, name = seg[2], seg[3]
        else:
            repo_type = "model"
            if seg[0] in ("datasets", "spaces"):
                repo_type = _REPO_TYPE_PLURALS[seg[0]]
                seg = seg[1:]
            namespace, name = seg[0], seg[1].removesuffix(".git")
        repo = self._repos.get((repo_type, f"{namespace}/{name}"))
        if repo is None or not self._can_read(request.user, repo):
            status = 401 if request.user is None and repo is not None else 404
            raise HubError(status, "Repository not found", "RepoNotFound")
        if write:
            user = self._require_user(request)
            if not self._can_write_namespace(user, repo.namespace):
                raise HubError(403, f"You don't have the rights to write to {repo.repo_id}")
        return repo

    def _resolve(self, repo: Repo, revision: str | None) -> str | None:
        """Commit id of ``revision``; ``None`` for the default branch of an empty repo; 404 otherwise."""
        rev = revision or DEFAULT_BRANCH
        name = rev.removeprefix("refs/heads/")
        if name in repo.branches:
            return repo.branches[name]
        tag = rev.removeprefix("refs/tags/")
        if tag in repo.tags:
            return repo.tags[tag]
        pr_match = re.fullmatch(r"refs/pr/(\d+)", rev)
        if pr_match and int(pr_match.group(1)) in repo.pull_requests:
            return repo.pull_requests[int(pr_match.group(1))]
        if re.fullmatch(r"[0-9a-f]{7,40}", rev):
            candidates = [oid for oid in repo.commits if oid.startswith(rev)]
            if len(candidates) == 1:
                return candidates[0]
        if name == DEFAULT_BRANCH and not repo.commits:
            return None
        raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")

    def _files_at(self, repo: Repo, oid: str | None) -> Mapping[str, FileEntry]:
        return repo.commits[oid].files if oid is not None else {}

    def _blob_path(self, sha256: str) -> Path:
        assert self._storage is not None
        return self._storage / "blobs" / sha256

    def _store_bytes(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        path = self._blob_path(sha)
        if not path.exists():
            tmp = self._tmp_path()
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return sha

    def _tmp_path(self) -> Path:
        assert self._storage is not None
        return self._storage / "tmp" / secrets.token_hex(8)

    def _new_commit(
        self,
        repo: Repo,
        parent: str | None,
        files: Mapping[str, FileEntry],
        title: str,
        message: str,
        author: str,
    ) -> Commit:
        self._commit_counter += 1
        seed = json.dumps(
            [repo.repo_id, parent, title, message, time.time_ns(), self._commit_counter, sorted(files)]
        ).encode()
        commit = Commit(
            oid=hashlib.sha1(seed).hexdigest(),
            parents=(parent,) if parent else (),
            title=title,
            message=message,
            author=author,
            date=_now(),
            files=dict(files),
        )
        repo.commits[commit.oid] = commit
        return commit

    def _regular_entry(self, data: bytes) -> FileEntry:
        return FileEntry(sha256=self._store_bytes(data), size=len(data), lfs=False, git_oid=git_blob_oid(data))

    def _lfs_entry(self, sha256: str, size: int) -> FileEntry:
        return FileEntry(sha256=sha256, size=size, lfs=True, git_oid=git_blob_oid(lfs_pointer(sha256, size)))

    def _card_metadata(self, repo: Repo, oid: str | None) -> dict[str, Any]:
        entry = self._files_at(repo, oid).get("README.md")
        if entry is None:
            return {}
        try:
            _, _, metadata = validate_card_metadata(self._blob_path(entry.sha256).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ImportError):
            return {}
        return metadata

    def _last_commit(self, repo: Repo, head: str, path: str) -> Commit:
        """Newest commit reachable from ``head`` (first parents) that changed ``path`` (a file or a folder)."""

        def snapshot(commit: Commit) -> tuple[tuple[str, str], ...]:
            prefix = path + "/"
            return tuple(sorted((p, e.git_oid) for p, e in commit.files.items() if p == path or p.startswith(prefix)))

        commit = repo.commits[head]
        while commit.parents:
            parent = repo.commits[commit.parents[0]]
            if snapshot(parent) != snapshot(commit):
                return commit
            commit = parent
        return commit

    def _tree_entry(self, repo: Repo, head: str, path: str, *, expand: bool) -> dict[str, Any]:
        files = repo.commits[head].files
        if path in files:
            entry = files[path]
            item: dict[str, Any] = {"type": "file", "oid": entry.git_oid, "size": entry.size, "path": path}
            if entry.lfs:
                item["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
        else:
            prefix = path + "/"
            content = sorted((p, e.git_oid) for p, e in files.items() if p.startswith(prefix))
            item = {"type": "directory", "oid": hashlib.sha1(json.dumps(content).encode()).hexdigest(), "path": path}
        if expand:
            last = self._last_commit(repo, head, path)
            item["lastCommit"] = {"id": last.oid, "title": last.title, "date": _iso(last.date)}
        return item

    def _paginate(self, request: _Request, items: list[Any], extra_params: Mapping[str, str]) -> _Response:
        try:
            start = int(request.param("cursor") or 0)
        except ValueError as err:
            raise HubError(400, "Invalid cursor") from err
        page_size = max(1, self.tree_page_size)
        page = items[start : start + page_size]
        headers = {}
        if start + page_size < len(items):
            params = {**extra_params, "cursor": str(start + page_size)}
            headers["Link"] = f'<{self.endpoint}{request.path}?{urlencode(params)}>; rel="next"'
        return _Response.json(page, headers=headers)

    # -- route handlers: account & repos ---------------------------------------------------------------------

    def _handle_unknown(self, request: _Request) -> _Response:
        raise HubError(404, f"Not found: {request.method} {request.path} (not implemented by the loopback hub)")

    def _handle_whoami(self, request: _Request) -> _Response:
        if request.user is None:
            raise HubError(401, INVALID_CREDENTIALS)
        return _Response.json(
            {
                "type": "user",
                "id": hashlib.sha1(request.user.encode()).hexdigest()[:24],
                "name": request.user,
                "fullname": request.user.replace("-", " ").title(),
                "email": f"{request.user}@example.com",
                "emailVerified": True,
                "canPay": False,
                "isPro": False,
                "periodEnd": None,
                "avatarUrl": "",
                "orgs": [{"type": "org", "name": org, "fullname": org, "roleInOrg": "admin"} for org in self.orgs],
                "auth": {"type": "access_token", "accessToken": {"displayName": "loopback", "role": "write"}},
            }
        )

    def _handle_create_repo(self, request: _Request) -> _Response:
        user = self._require_user(request)
        payload = request.json()
        name = payload.get("name")
        namespace = payload.get("organization") or user
        repo_type = payload.get("type") or "model"
        if repo_type not in _URL_PREFIXES:
            raise HubError(400, f"Invalid repo type: {repo_type}")
        if not isinstance(name, str) or not _REPO_NAME_RE.match(name) or "--" in name or ".." in name:
            raise HubError(400, f"Invalid repo name: {name!r}")
        if not self._can_write_namespace(user, namespace):
            raise HubError(403, f"You don't have the rights to create a repo under {namespace}")
        visibility = payload.get("visibility")
        private = visibility == "private" if visibility is not None else bool(payload.get("private", False))
        repo_id = f"{namespace}/{name}"
        with self._lock:
            existing = self._repos.get((repo_type, repo_id))
            if existing is not None:
                raise HubError(
                    409,
                    f"You already created this {repo_type} repo",
                    extra={"url": f"{self.endpoint}/{existing.url_path}"},
                )
            repo = Repo(repo_type=repo_type, repo_id=repo_id, private=private, created_at=_now())
            if self.initial_gitattributes:
                entry = self._regular_entry(DEFAULT_GITATTRIBUTES.encode())
                commit = self._new_commit(repo, None, {".gitattributes": entry}, "initial commit", "", user)
                repo.branches[DEFAULT_BRANCH] = commit.oid
            self._repos[(repo_type, repo_id)] = repo
        logger.info("Created %s repo %s (private=%s)", repo_type, repo_id, private)
        return _Response.json({"url": f"{self.endpoint}/{repo.url_path}", "name": repo_id, "id": repo_id})

    def _handle_delete_repo(self, request: _Request) -> _Response:
        user = self._require_user(request)
        payload = request.json()
        namespace = payload.get("organization") or user
        repo_type = payload.get("type") or "model"
        key = (repo_type, f"{namespace}/{payload.get('name')}")
        with self._lock:
            if key not in self._repos:
                raise HubError(404, "Repository not found", "RepoNotFound")
            if not self._can_write_namespace(user, namespace):
                raise HubError(403, f"You don't have the rights to delete {key[1]}")
            del self._repos[key]
        return _Response.json({})

    def _handle_validate_yaml(self, request: _Request) -> _Response:
        payload = request.json()
        content = payload.get("content")
        if not isinstance(content, str):
            raise HubError(400, '"content" must be a string')
        errors, warnings, _ = validate_card_metadata(content)
        if errors:
            if "text/plain" in request.headers.get("accept", ""):
                return _Response(status=400, body="\n".join(errors).encode(), headers={"Content-Type": "text/plain"})
            return _Response.json(
                {
                    "error": "Invalid metadata in README.md.",
                    "errors": [{"message": message} for message in errors],
                    "warnings": [{"message": message} for message in warnings],
                },
                status=400,
            )
        return _Response.json({"errors": [], "warnings": [{"message": message} for message in warnings]})

    # -- route handlers: read API ----------------------------------------------------------------------------

    def _handle_repo_info(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request)
            rest = request.segments[4:]
            revision = "/".join(rest[1:]) if rest else DEFAULT_BRANCH
            oid = self._resolve(repo, revision)
            files = self._files_at(repo, oid)
            blobs = request.flag("blobs")
            siblings = []
            for path in sorted(files):
                sibling: dict[str, Any] = {"rfilename": path}
                if blobs:
                    entry = files[path]
                    sibling.update(size=entry.size, blobId=entry.git_oid)
                    if entry.lfs:
                        sibling["lfs"] = {
                            "size": entry.size,
                            "sha256": entry.sha256,
                            "pointerSize": entry.pointer_size,
                        }
                siblings.append(sibling)
            card = self._card_metadata(repo, oid)
            tags = list(card.get("tags") or []) if isinstance(card.get("tags"), list) else []
            if isinstance(card.get("library_name"), str):
                tags.append(card["library_name"])
            if isinstance(card.get("license"), str):
                tags.append(f"license:{card['license']}")
            last_modified = repo.commits[oid].date if oid is not None else repo.created_at
            info: dict[str, Any] = {
                "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
                "id": repo.repo_id,
                "author": repo.namespace,
                "sha": oid,
                "lastModified": _iso(last_modified),
                "createdAt": _iso(repo.created_at),
                "private": repo.private,
                "gated": False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": tags,
                "cardData": card or None,
                "siblings": siblings,
                "usedStorage": sum(entry.size for entry in files.values()),
            }
            if repo.repo_type == "model":
                info.update(
                    modelId=repo.repo_id,
                    library_name=card.get("library_name"),
                    pipeline_tag=card.get("pipeline_tag"),
                )
            elif repo.repo_type == "space":
                info.update(sdk=card.get("sdk"))
        return _Response.json(info)

    def _handle_tree(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request)
            revision, path_segments = _split_revision(request.segments[5:])
            path = "/".join(path_segments).strip("/")
            oid = self._resolve(repo, revision)
            files = self._files_at(repo, oid)
            recursive = request.flag("recursive")
            expand = request.flag("expand")
            prefix = f"{path}/" if path else ""
            if path and not any(p.startswith(prefix) for p in files):
                headers = {"X-Repo-Commit": oid} if oid else {}
                raise HubError(404, f"Entry not found: {path}", "EntryNotFound", headers=headers)
            entries: set[str] = set()
            for file_path in files:
                if not file_path.startswith(prefix):
                    continue
                relative = file_path[len(prefix) :].split("/")
                if recursive:
                    entries.update(prefix + "/".join(relative[: i + 1]) for i in range(len(relative)))
                else:
                    entries.add(prefix + relative[0])
            items = [self._tree_entry(repo, oid, p, expand=expand) for p in sorted(entries)] if oid else []
        params = {"recursive": str(recursive), "expand": str(expand)}
        return self._paginate(request, items, params)

    def _handle_refs(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request)

            def ref(name: str, full: str, oid: str) -> dict[str, str]:
                return {"name": name, "ref": full, "targetCommit": oid}

            branches = sorted(repo.branches.items(), key=lambda kv: (kv[0] != DEFAULT_BRANCH, kv[0]))
            payload: dict[str, Any] = {
                "branches": [ref(name, f"refs/heads/{name}", oid) for name, oid in branches],
                "tags": [ref(name, f"refs/tags/{name}", oid) for name, oid in sorted(repo.tags.items())],
                "converts": [],
            }
            if request.flag("include_prs"):
                payload["pullRequests"] = [
                    ref(f"refs/pr/{num}", f"refs/pr/{num}", oid) for num, oid in sorted(repo.pull_requests.items())
                ]
        return _Response.json(payload)

    def _handle_commits(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request)
            revision, _ = _split_revision(request.segments[5:])
            oid = self._resolve(repo, revision)
            items = []
            while oid is not None:
                commit = repo.commits[oid]
                items.append(
                    {
                        "id": commit.oid,
                        "title": commit.title,
                        "message": commit.message,
                        "authors": [{"user": commit.author, "avatar": None}],
                        "date": _iso(commit.date),
                        "formatted": {"title": commit.title, "message": commit.message},
                    }
                )
                oid = commit.parents[0] if commit.parents else None
        return self._paginate(request, items, {})

    def _handle_paths_info(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request)
            revision, _ = _split_revision(request.segments[5:])
            oid = self._resolve(repo, revision)
            if "json" in request.headers.get("content-type", ""):
                payload = request.json()
                paths, expand = payload.get("paths") or [], bool(payload.get("expand"))
            else:
                form = parse_qs(request.read().decode(), keep_blank_values=True)
                paths = form.get("paths", [])
                expand = (form.get("expand") or ["false"])[-1].lower() in {"1", "true"}
            files = self._files_at(repo, oid)
            items = []
            for raw_path in paths if isinstance(paths, list) else [paths]:
                path = str(raw_path).strip("/")
                if oid is not None and (path in files or any(p.startswith(path + "/") for p in files)):
                    items.append(self._tree_entry(repo, oid, path, expand=expand))
        return _Response.json(items)

    def _handle_resolve(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request)
            seg = request.segments[1:] if request.segments[0] in ("datasets", "spaces") else request.segments
            revision, path_segments = _split_revision(seg[3:])
            path = "/".join(path_segments)
            oid = self._resolve(repo, revision)
            entry = self._files_at(repo, oid).get(path)
            if oid is None or entry is None:
                headers = {"X-Repo-Commit": oid} if oid else {}
                raise HubError(404, f"Entry not found: {path}", "EntryNotFound", headers=headers)
        size = entry.size
        headers = {
            "X-Repo-Commit": oid,
            "ETag": f'"{entry.etag}"',
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(path.rsplit('/', 1)[-1])}",
        }
        if entry.lfs:
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
            headers["X-Linked-Size"] = str(size)
        response = _Response(status=200, headers=headers, file=self._blob_path(entry.sha256))
        range_header = request.headers.get("range")
        if range_header and request.method == "GET":
            byte_range = _parse_range(range_header, size)
            if byte_range is None:
                raise HubError(416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
            start, end = byte_range
            response.status = 206
            response.file_range = (start, end)
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        return response

    # -- route handlers: upload ------------------------------------------------------------------------------

    def _upload_mode(self, path: str, size: int, lfs_patterns: Sequence[str]) -> str:
        if size >= self.lfs_threshold:
            return "lfs"
        if any(_matches_pattern(path, pattern) for pattern in lfs_patterns):
            return "lfs"
        return "regular"

    def _lfs_patterns(self, files: Mapping[str, FileEntry]) -> list[str]:
        entry = files.get(".gitattributes")
        if entry is None:
            return []
        return _gitattributes_lfs_patterns(self._blob_path(entry.sha256).read_text(encoding="utf-8", errors="replace"))

    def _handle_preupload(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request, write=True)
            revision, _ = _split_revision(request.segments[5:])
            oid = self._resolve(repo, revision)
            files = self._files_at(repo, oid)
            payload = request.json()
            requested = payload.get("files")
            if not isinstance(requested, list):
                raise HubError(400, '"files" must be an array')
            gitignore = payload.get("gitIgnore")
            if gitignore is None and ".gitignore" in files:
                gitignore = self._blob_path(files[".gitignore"].sha256).read_text(encoding="utf-8", errors="replace")
            lfs_patterns = self._lfs_patterns(files)
            result = []
            for item in requested:
                path, size = item.get("path"), item.get("size")
                if not isinstance(path, str) or not isinstance(size, int):
                    raise HubError(400, "Each file needs a string 'path' and an integer 'size'")
                mode = self._upload_mode(path, size, lfs_patterns)
                existing = files.get(path)
                remote_oid = None
                if existing is not None:
                    remote_oid = existing.sha256 if existing.lfs else existing.git_oid
                result.append(
                    {
                        "path": path,
                        "uploadMode": mode,
                        "shouldIgnore": _is_ignored(path, gitignore),
                        "oid": remote_oid,
                    }
                )
        return _Response.json({"files": result, "commitOid": oid})

    def _handle_lfs_batch(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request, write=True)
            payload = request.json()
            if payload.get("operation") != "upload":
                raise HubError(400, "Only the 'upload' operation is supported by the loopback hub")
            transfers = payload.get("transfers") or ["basic"]
            multipart = self.lfs_multipart_chunk_size is not None and "multipart" in transfers
            objects = []
            for obj in payload.get("objects") or []:
                oid, size = obj.get("oid"), obj.get("size")
                if not isinstance(oid, str) or not _SHA256_RE.match(oid) or not isinstance(size, int) or size < 0:
                    objects.append(
                        {
                            "oid": str(oid),
                            "size": size if isinstance(size, int) else 0,
                            "error": {"code": 422, "message": "Invalid oid or size"},
                        }
                    )
                    continue
                blob = self._blob_path(oid)
                if oid in repo.lfs_objects and blob.exists() and blob.stat().st_size == size:
                    objects.append({"oid": oid, "size": size})  # already uploaded: no actions
                    continue
                ticket_id = secrets.token_urlsafe(16)
                ticket = _UploadTicket(repo_key=(repo.repo_type, repo.repo_id), oid=oid, size=size)
                verify = {"href": f"{self.endpoint}/{repo.url_path}.git/info/lfs/objects/verify"}
                chunk = self.lfs_multipart_chunk_size
                if multipart and chunk is not None and size > chunk:
                    ticket.chunk_size = chunk
                    nb_parts = -(-size // chunk)
                    header = {"chunk_size": str(chunk)}
                    header.update(
                        {str(i): f"{self.endpoint}/_lfs/part/{ticket_id}/{i}" for i in range(1, nb_parts + 1)}
                    )
                    upload = {"href": f"{self.endpoint}/_lfs/complete/{ticket_id}", "header": header}
                else:
                    upload = {"href": f"{self.endpoint}/_lfs/upload/{ticket_id}"}
                self._tickets[ticket_id] = ticket
                objects.append(
                    {"oid": oid, "size": size, "authenticated": True, "actions": {"upload": upload, "verify": verify}}
                )
        transfer = "multipart" if multipart else "basic"
        return _Response.json(
            {"transfer": transfer, "objects": objects, "hash_algo": "sha256"},
            headers={"Content-Type": "application/vnd.git-lfs+json"},
        )

    def _ticket(self, request: _Request) -> _UploadTicket:
        ticket = self._tickets.get(request.segments[2])
        if ticket is None:
            raise HubError(403, "Invalid or expired upload URL")
        return ticket

    def _finish_lfs_object(self, ticket: _UploadTicket, source: IO[bytes]) -> None:
        """Hash ``source``, check it against the ticket and move it into the blob store."""
        digest = hashlib.sha256()
        size = 0
        tmp = self._tmp_path()
        with tmp.open("wb") as out:
            while data := source.read(1024 * 1024):
                digest.update(data)
                size += len(data)
                out.write(data)
        if size != ticket.size or digest.hexdigest() != ticket.oid:
            tmp.unlink(missing_ok=True)
            raise HubError(400, f"Uploaded content does not match LFS object {ticket.oid} ({ticket.size} bytes)")
        os.replace(tmp, self._blob_path(ticket.oid))
        with self._lock:
            repo = self._repos.get(ticket.repo_key)
            if repo is not None:
                repo.lfs_objects.add(ticket.oid)

    def _handle_lfs_upload(self, request: _Request) -> _Response:
        ticket = self._ticket(request)
        request.body.seek(0)
        self._finish_lfs_object(ticket, request.body)
        return _Response(status=200, headers={"ETag": f'"{ticket.oid}"'})

    def _handle_lfs_part(self, request: _Request) -> _Response:
        ticket = self._ticket(request)
        try:
            part_number = int(request.segments[3])
        except ValueError as err:
            raise HubError(400, "Invalid part number") from err
        data = request.read()
        path = self._tmp_path()
        path.write_bytes(data)
        etag = hashlib.md5(data).hexdigest()
        with self._lock:
            previous = ticket.parts.get(part_number)
            ticket.parts[part_number] = (path, etag)
        if previous is not None:
            previous[0].unlink(missing_ok=True)
        return _Response(status=200, headers={"ETag": f'"{etag}"'})

    def _handle_lfs_complete(self, request: _Request) -> _Response:
        ticket = self._ticket(request)
        payload = request.json()
        parts = payload.get("parts") or []
        if payload.get("oid") != ticket.oid:
            raise HubError(400, "Completion payload does not match the upload")
        expected = sorted(ticket.parts)
        if [part.get("partNumber") for part in parts] != expected or not expected:
            raise HubError(400, f"Expected parts {expected}, got {[part.get('partNumber') for part in parts]}")
        for part in parts:
            if part.get("etag", "").strip('"') != ticket.parts[part["partNumber"]][1]:
                raise HubError(400, f"ETag mismatch for part {part['partNumber']}")
        assembled = self._tmp_path()
        with assembled.open("wb") as out:
            for number in expected:
                with ticket.parts[number][0].open("rb") as part_file:
                    shutil.copyfileobj(part_file, out)
        try:
            with assembled.open("rb") as source:
                self._finish_lfs_object(ticket, source)
        finally:
            assembled.unlink(missing_ok=True)
            for path, _ in ticket.parts.values():
                path.unlink(missing_ok=True)
            ticket.parts.clear()
        return _Response.json({"oid": ticket.oid, "size": ticket.size})

    def _handle_lfs_verify(self, request: _Request) -> _Response:
        with self._lock:
            repo = self._repo_from_request(request, write=True)
            payload = request.json()
            oid, size = payload.get("oid"), payload.get("size")
            blob = self._blob_path(str(oid))
            if oid not in repo.lfs_objects or not blob.exists() or blob.stat().st_size != size:
                raise HubError(404, f"LFS object {oid} not found")
        return _Response.json({"oid": oid, "size": size})

    def _handle_commit(self, request: _Request) -> _Response:
        user = self._require_user(request)
        revision, _ = _split_revision(request.segments[5:])
        create_pr = request.flag("create_pr")
        lines = [line for line in request.read().splitlines() if line.strip()]
        try:
            items = [json.loads(line) for line in lines]
        except ValueError as err:
            raise HubError(400, f"Invalid NDJSON payload: {err}") from err
        if not items or items[0].get("key") != "header":
            raise HubError(400, "The first NDJSON line must be the commit header")
        header = items[0].get("value") or {}
        summary = header.get("summary")
        if not isinstance(summary, str) or not summary.strip():
            raise HubError(400, "Commit summary is required")
        with self._lock:
            repo = self._repo_from_request(request, write=True)
            base = self._resolve(repo, revision)
            pr_match = re.fullmatch(r"refs/pr/(\d+)", revision)
            branch = revision.removeprefix("refs/heads/")
            if not create_pr and not pr_match and branch not in repo.branches:
                if not (branch == DEFAULT_BRANCH and base is None):
                    raise HubError(400, f"Cannot commit to {revision}: it is not a branch")
            parent_commit = header.get("parentCommit")
            if parent_commit and (base is None or not base.startswith(parent_commit)):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(self._files_at(repo, base))
            readme: bytes | None = None
            for item in items[1:]:
                key, value = item.get("key"), item.get("value") or {}
                path = value.get("path")
                if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
                    raise HubError(400, f"Invalid path in commit: {path!r}")
                if key == "file":
                    content = value.get("content", "")
                    try:
                        if value.get("encoding") == "base64":
                            data = base64.b64decode(content, validate=True)
                        else:
                            data = content.encode()
                    except ValueError as err:
                        raise HubError(400, f"Invalid base64 content for {path}") from err
                    if len(data) >= self.lfs_threshold:
                        raise HubError(
                            400, f"Your push was rejected because {path} is larger than 10 MiB: please use LFS"
                        )
                    files[path] = self._regular_entry(data)
                    if path == "README.md":
                        readme = data
                elif key == "lfsFile":
                    oid = value.get("oid")
                    blob = self._blob_path(str(oid))
                    if value.get("algo", "sha256") != "sha256" or oid not in repo.lfs_objects or not blob.exists():
                        raise HubError(422, f"LFS object {oid} of {path} was not uploaded to {repo.repo_id}")
                    size = blob.stat().st_size
                    if value.get("size") is not None and value["size"] != size:
                        raise HubError(422, f"Size mismatch for LFS file {path}")
                    files[path] = self._lfs_entry(str(oid), size)
                elif key == "deletedFile":
                    if path not in files:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    del files[path]
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    removed = [p for p in files if p.startswith(prefix)]
                    if not removed:
                        raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                    for p in removed:
                        del files[p]
                else:
                    raise HubError(400, f"Unknown commit operation: {key!r}")
            if readme is not None:
                errors, _, _ = validate_card_metadata(readme.decode("utf-8", errors="replace"))
                if errors:
                    raise HubError(400, "Invalid metadata in README.md.\n" + "\n".join(f"- {e}" for e in errors))
            commit = self._new_commit(repo, base, files, summary, header.get("description") or "", user)
            pr_url = None
            if create_pr:
                number = repo.next_discussion
                repo.next_discussion += 1
                repo.pull_requests[number] = commit.oid
                pr_url = f"{self.endpoint}/{repo.url_path}/discussions/{number}"
            elif pr_match:
                repo.pull_requests[int(pr_match.group(1))] = commit.oid
            else:
                repo.branches[branch] = commit.oid
        logger.info("Commit %s on %s@%s (create_pr=%s)", commit.oid[:8], repo.repo_id, revision, create_pr)
        return _Response.json(
            {
                "success": True,
                "commitOid": commit.oid,
                "commitUrl": f"{self.endpoint}/{repo.url_path}/commit/{commit.oid}",
                "pullRequestUrl": pr_url,
                "hookOutput": "",
            }
        )

    def _handle_branch(self, request: _Request) -> _Response:
        branch = "/".join(request.segments[5:])
        with self._lock:
            repo = self._repo_from_request(request, write=True)
            if request.method == "DELETE":
                if branch == DEFAULT_BRANCH:
                    raise HubError(403, "Cannot delete the default branch")
                if branch not in repo.branches:
                    raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
                del repo.branches[branch]
                return _Response.json({})
            if branch in repo.branches:
                raise HubError(409, "Reference already exists")
            payload = request.json()
            start = self._resolve(repo, payload.get("startingPoint") or DEFAULT_BRANCH)
            if start is None:
                raise HubError(400, "Cannot create a branch from an empty repo")
            repo.branches[branch] = start
        return _Response.json({})

    def _handle_tag(self, request: _Request) -> _Response:
        revision, _ = _split_revision(request.segments[5:])
        with self._lock:
            repo = self._repo_from_request(request, write=True)
            payload = request.json()
            tag = payload.get("tag")
            if not isinstance(tag, str) or not tag:
                raise HubError(400, "Missing tag name")
            if tag in repo.tags:
                raise HubError(409, "Tag already exists")
            oid = self._resolve(repo, revision)
            if oid is None:
                raise HubError(400, "Cannot tag an empty repo")
            repo.tags[tag] = oid
        return _Response.json({})


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """Parse a single ``bytes=`` range into ``(start, end_exclusive)``; ``None`` if unsatisfiable."""
    match = re.fullmatch(r"\s*bytes=(\d*)-(\d*)\s*", header)
    if match is None or (not match.group(1) and not match.group(2)):
        return None
    if not match.group(1):  # suffix range: last N bytes
        length = int(match.group(2))
        return (max(0, size - length), size) if length > 0 and size > 0 else None
    start = int(match.group(1))
    end = int(match.group(2)) + 1 if match.group(2) else size
    if start >= size:
        return None
    return start, min(end, size)


def _merge_no_proxy(current: str | None) -> str:
    items = [item.strip() for item in (current or "").split(",") if item.strip()]
    return ",".join(items + [host for host in _LOOPBACK_NO_PROXY if host not in items])


# ----------------------------------------------------------------------------------------------------------------
# Client configuration
# ----------------------------------------------------------------------------------------------------------------


def _reset_client_state() -> None:
    """Drop state the client keeps across calls: pooled HTTP connections and transformers' cached ``HfApi``."""
    from huggingface_hub.utils import _http

    _http.close_session()
    transformers_hub = sys.modules.get("transformers.utils.hub")
    if transformers_hub is not None and hasattr(transformers_hub, "_hf_api"):
        transformers_hub._hf_api = None


def patch_client(server: HubServer, home: str | os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Point ``huggingface_hub`` (and timm/transformers through it) at ``server``; undone by ``monkeypatch.undo()``.

    ``home`` becomes ``HF_HOME`` (cache in ``home/hub``). See the module docstring for the full list of patches.
    """
    import huggingface_hub
    from huggingface_hub import constants, hf_api
    from huggingface_hub.utils import _http

    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(server, "home", home)
    endpoint = server.endpoint

    # 1. Environment (read by huggingface_hub at import time, by subprocesses, and at call time for HF_TOKEN).
    for name in _UNSET_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in server.client_env().items():
        monkeypatch.setenv(name, value)
    if not server.token:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, _merge_no_proxy(os.environ.get(name)))

    # 2. Constants computed from the environment when huggingface_hub was imported.
    hub_cache, assets_cache = str(home / "hub"), str(home / "assets")
    constant_values: dict[str, Any] = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "default_cache_path": hub_cache,
        "default_assets_cache_path": assets_cache,
        "HUGGINGFACE_HUB_CACHE": hub_cache,
        "HUGGINGFACE_ASSETS_CACHE": assets_cache,
        "HF_HUB_CACHE": hub_cache,
        "HF_ASSETS_CACHE": assets_cache,
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "CHECK_FOR_UPDATE_DONE_PATH": str(home / ".check_for_update_done"),
        "CHECK_FOR_SKILL_UPDATE_DONE_PATH": str(home / ".check_for_skill_update_done"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_XET": True,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": False,
        "HF_HUB_DISABLE_UPDATE_CHECK": True,
    }
    for name, value in constant_values.items():
        monkeypatch.setattr(constants, name, value, raising=name in {"ENDPOINT", "HUGGINGFACE_CO_URL_TEMPLATE"})
    host = urlsplit(endpoint).hostname or server.host
    monkeypatch.setattr(constants, "HF_URL_HOSTS", frozenset(getattr(constants, "HF_URL_HOSTS", frozenset()) | {host}))
    if hasattr(_http, "_HUB_ORIGINS"):
        monkeypatch.setattr(_http, "_HUB_ORIGINS", frozenset(_http._HUB_ORIGINS | {_http._url_origin(endpoint)}))

    # 3. Objects and `from constants import X` copies created at import time.
    # The module-level `HfApi` singleton behind `huggingface_hub.model_info`, `create_repo`... (imported by timm).
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)
    monkeypatch.setattr(hf_api.api, "_whoami_cache", {}, raising=False)
    for module_name, attribute, value in (
        ("huggingface_hub.utils._cache_manager", "HF_HUB_CACHE", hub_cache),
        ("huggingface_hub.utils._cache_assets", "HF_ASSETS_CACHE", assets_cache),
        ("huggingface_hub.utils._git_credential", "ENDPOINT", endpoint),
        ("transformers.utils.hub", "HF_MODULES_CACHE", str(home / "modules")),
        ("transformers.dynamic_module_utils", "HF_MODULES_CACHE", str(home / "modules")),
    ):
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attribute):
            monkeypatch.setattr(module, attribute, value)
    logger.debug("huggingface_hub %s pointed at %s (HF_HOME=%s)", huggingface_hub.__version__, endpoint, home)

    # 4. Pooled connections (created with the old environment) and cached API objects.
    _reset_client_state()


@contextlib.contextmanager
def patched_client(server: HubServer, home: str | os.PathLike[str]) -> Iterator[HubServer]:
    """Context-manager version of :func:`patch_client`, for use outside function-scoped fixtures."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        patch_client(server, home, monkeypatch)
        yield server
    finally:
        _reset_client_state()
        monkeypatch.undo()


@contextlib.contextmanager
def offline_mode() -> Iterator[None]:
    """Emulate ``HF_HUB_OFFLINE=1`` in this process (the variable is only read when huggingface_hub is imported)."""
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(name="hub_server")
def hub_server_fixture(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HubServer]:
    """A running :class:`HubServer` with the ``huggingface_hub`` client pointed at it (fresh cache, token set)."""
    server = HubServer().start()
    try:
        patch_client(server, tmp_path_factory.mktemp("hf_home"), monkeypatch)
        yield server
    finally:
        server.close()
        _reset_client_state()
