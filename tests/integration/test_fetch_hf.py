"""`rljob_client.fetch` through huggingface_hub itself, against a hub stand-in on loopback.

No Hugging Face hub is reachable from here, so the test starts a small HTTP server on
127.0.0.1 that serves the tiny model's files on exactly the routes `snapshot_download` calls
(repo info by revision, the recursive tree listing, HEAD and GET of `resolve/<commit>/<file>`)
and answers errors as the hub does (`X-Error-Code` RepoNotFound / RevisionNotFound, 401 for a
bad token). `HF_ENDPOINT` is the server's address; everything else is huggingface_hub's code.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from rljob_client.fetch import DONE_MARKER, FetchError, fetch_hf, main, parse_uri

from tests.fixtures.vllm_server import tiny_model_path

REPO = "rljob/tiny"
DATASET = "rljob/prompts"
PROMPTS = {"data/train.jsonl": b'{"prompt": "1+1=", "label": "2"}\n'}
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TAGS = {"main": COMMIT, "v1": COMMIT, COMMIT: COMMIT}
TOKEN = "hf_good"


class Hub:
    """Private repositories at one commit: the model `rljob/tiny` (the tiny model's files) and the dataset `rljob/prompts`."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.repos = {("models", REPO): files, ("datasets", DATASET): PROMPTS}
        self.downloads: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _error(self, status: int, code: str | None) -> None:
                self._send(status, json.dumps({"error": code or "Invalid credentials"}).encode(),
                           {"X-Error-Code": code} if code else {})

            def _route(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    if self.headers.get("Authorization"):
                        return self._error(401, None)  # a token the hub does not know
                    return self._error(401, "RepoNotFound")  # a private repo, asked anonymously
                path = unquote(urlparse(self.path).path)
                kind = "datasets" if path.startswith(("/api/datasets/", "/datasets/")) else "models"
                path = path.replace("/api/datasets/", "/api/models/", 1).removeprefix("/datasets")
                repo = next((r for k, r in hub.repos if k == kind and f"/{r}/" in f"{path}/"), None)
                if repo is None:
                    return self._error(404, "RepoNotFound")
                files = hub.repos[(kind, repo)]
                for prefix in (f"/api/models/{repo}/revision/", f"/api/models/{repo}/tree/", f"/{repo}/resolve/"):
                    if path.startswith(prefix):
                        rev, _, rest = path.removeprefix(prefix).partition("/")
                        break
                else:
                    if path != f"/api/models/{repo}":
                        return self._error(404, "RepoNotFound")
                    prefix, rev, rest = f"/api/models/{repo}/revision/", "main", ""
                if rev not in TAGS:
                    return self._error(404, "RevisionNotFound")
                if prefix.endswith("/revision/"):
                    info = {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in files]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                if prefix.endswith("/tree/"):
                    tree = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                            for f, b in files.items()]
                    return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
                if rest not in files:
                    return self._error(404, "EntryNotFound")
                body = files[rest]
                if self.command == "GET":
                    hub.downloads.append(rest)
                etag = hashlib.sha1(body).hexdigest()
                self._send(200, body, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'})

            do_GET = do_HEAD = _route

        return Handler


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    model = tiny_model_path(0)
    files = {p.name: p.read_bytes() for p in sorted(model.iterdir()) if p.is_file()}
    server = Hub(files)
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_snapshot_lands_in_dest_and_is_not_fetched_again(hub: Hub, tmp_path: Path) -> None:
    dest = tmp_path / "model"
    fetch_hf(parse_uri(f"hf://{REPO}@v1"), dest, token=TOKEN, endpoint=hub.url)
    for name, body in hub.files.items():
        assert (dest / name).read_bytes() == body, name
    assert json.loads((dest / DONE_MARKER).read_text()) == {"uri": f"hf://{REPO}@v1"}
    fetched = len(hub.downloads)
    fetch_hf(parse_uri(f"hf://{REPO}@v1"), dest, token=TOKEN, endpoint=hub.url)
    assert len(hub.downloads) == fetched, "a cache that holds the URI is not downloaded again"


@pytest.mark.parametrize(
    ("uri", "token", "says"),
    [
        (f"hf://{REPO}@v9", TOKEN, f"hf://{REPO}@v9: revision 'v9' not found in {REPO}"),
        ("hf://rljob/missing", TOKEN, "hf://rljob/missing: repository not found or not readable with this token; check the name"),
        (f"hf://{REPO}", None, "or set credentialsSecret to a Secret with HF_TOKEN"),
        (f"hf://{REPO}", "hf_wrong", f"hf://{REPO}: the hub refused the token (401); check HF_TOKEN in credentialsSecret"),
    ],
)
def test_a_download_that_cannot_succeed_names_the_uri_and_cause(
    hub: Hub, tmp_path: Path, uri: str, token: str | None, says: str
) -> None:
    with pytest.raises(FetchError) as err:
        fetch_hf(parse_uri(uri), tmp_path / "m", token=token, endpoint=hub.url)
    assert says in str(err.value)
    assert not (tmp_path / "m" / DONE_MARKER).exists()


def test_main_writes_the_cause_to_the_termination_log_and_fails_once(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    log = tmp_path / "termination-log"
    assert main(["--uri", f"hf://{REPO}@nope", "--dest", str(tmp_path / "m"), "--termination-log", str(log)]) == 1
    assert log.read_text() == f"hf://{REPO}@nope: revision 'nope' not found in {REPO}"
    assert main(["--uri", f"hf://{REPO}", "--dest", str(tmp_path / "ok"), "--termination-log", str(log)]) == 0


def test_uri_that_is_not_hf_is_refused() -> None:
    with pytest.raises(FetchError, match="ftp://x/y: not a model URI"):
        parse_uri("ftp://x/y")
    assert parse_uri("hf://Qwen/Qwen2.5-7B-Instruct@refs/pr/1").revision == "refs/pr/1"


def test_local_mode_downloads_the_model_and_runs_from_the_path(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml
    from rljob_cli.manifest import ManifestError, fetch_model

    from controller_runtime.api import RLJobManifest

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml").read_text())
    manifest["spec"]["model"] = {"uri": f"hf://{REPO}@v1", "credentialsSecret": "hf"}
    manifest["spec"]["rollout"]["dataset"] = {"uri": f"hf://{DATASET}", "path": "data/train.jsonl"}
    job = RLJobManifest.model_validate(manifest)
    spec = fetch_model(job, tmp_path / "cache", TOKEN).spec
    local = spec.model
    assert local.uri is None and local.path == str(tmp_path / "cache" / "model" / "hf" / REPO / "v1")
    assert (Path(local.path) / "config.json").read_bytes() == hub.files["config.json"]
    assert spec.executor.dataset.uri is None
    assert Path(spec.executor.dataset.path).read_bytes() == PROMPTS["data/train.jsonl"]
    with pytest.raises(ManifestError, match=f"spec.model.uri: hf://{REPO}@v1: the hub refused the token"):
        fetch_model(job, tmp_path / "other", "hf_wrong")


def test_a_dataset_repository_lands_with_its_folders(hub: Hub, tmp_path: Path) -> None:
    fetch_hf(parse_uri(f"hf://{DATASET}"), tmp_path / "d", token=TOKEN, endpoint=hub.url, repo_type="dataset")
    assert (tmp_path / "d" / "data" / "train.jsonl").read_bytes() == PROMPTS["data/train.jsonl"]
    with pytest.raises(FetchError, match="repository not found"):  # a model of that name does not exist
        fetch_hf(parse_uri(f"hf://{DATASET}"), tmp_path / "m", token=TOKEN, endpoint=hub.url)
