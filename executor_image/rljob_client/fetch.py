"""Download a model or dataset named by a URI into a directory: the init container of pods whose
`spec.model.uri` or `spec.rollout.dataset.uri` is `hf://ORG/NAME[@REVISION]`.

`python -m rljob_client.fetch --uri hf://Qwen/Qwen2.5-7B-Instruct --dest /models/...` runs
`huggingface_hub.snapshot_download` (resumable, parallel, the hub's own cache metadata in the
destination) with the token from `HF_TOKEN` (the job's `credentialsSecret`). A destination that
already holds a complete download of the same URI (a cache PVC after a restart) is not fetched
again. A failure that retrying cannot fix (no such repository, revision or file, a bad or missing
token, a gated repository) ends the process with exit code 1 and one line naming the URI and the
cause, also written to the termination log so `kubectl describe pod` shows it; the pod then fails
once (restartPolicy Never) instead of looping.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rljob_client.errors import RLJobError

DONE_MARKER = ".rljob-fetched.json"
TERMINATION_LOG = Path("/dev/termination-log")
HF_URI = re.compile(r"^hf://(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")


class FetchError(RLJobError):
    """A download that cannot succeed as asked; the message names the URI and the cause."""


@dataclass(frozen=True)
class HfSource:
    uri: str
    repo_id: str
    revision: str | None


def parse_uri(uri: str) -> HfSource:
    """`hf://ORG/NAME[@REVISION]`; anything else is refused naming the URI."""
    m = HF_URI.match(uri)
    if m is None:
        raise FetchError(f"{uri}: not a model URI; write hf://ORG/NAME or hf://ORG/NAME@REVISION")
    return HfSource(uri, m["repo"], m["rev"])


def _already_fetched(dest: Path, uri: str) -> bool:
    try:
        return json.loads((dest / DONE_MARKER).read_text()).get("uri") == uri
    except (OSError, ValueError):
        return False


def fetch_hf(
    src: HfSource, dest: Path, *, token: str | None = None, endpoint: str | None = None, repo_type: str = "model"
) -> Path:
    """Download the repository's snapshot (a model or dataset repository) into `dest` (skipped when `dest` already holds this URI)."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if _already_fetched(dest, src.uri):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    try:
        # Resolve the revision first: on an API error snapshot_download itself would fall back to
        # whatever a partial earlier download left in `dest` and call that a success.
        api = HfApi(endpoint=endpoint, token=token or None)
        info = api.repo_info(src.repo_id, revision=src.revision, repo_type=repo_type)
        # the hub's cache inside dest: a pod's home may be read-only, and the cache PVC keeps it
        snapshot_download(src.repo_id, revision=info.sha, repo_type=repo_type, local_dir=dest,
                          cache_dir=dest / ".cache" / "hub", token=token or None, endpoint=endpoint)
    except RevisionNotFoundError as e:
        raise FetchError(f"{src.uri}: revision {src.revision!r} not found in {src.repo_id}") from e
    except GatedRepoError as e:
        raise FetchError(f"{src.uri}: gated repository; the token (HF_TOKEN from credentialsSecret) has no access") from e
    except RepositoryNotFoundError as e:
        hint = "check the name" if token else "check the name, or set credentialsSecret to a Secret with HF_TOKEN"
        raise FetchError(f"{src.uri}: repository not found or not readable with this token; {hint}") from e
    except RemoteEntryNotFoundError as e:
        raise FetchError(f"{src.uri}: a file listed by the hub is missing: {e}") from e
    except LocalEntryNotFoundError as e:
        raise FetchError(f"{src.uri}: the hub could not be reached and nothing is cached: {e}") from e
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else None
        if status in (401, 403):
            raise FetchError(f"{src.uri}: the hub refused the token ({status}); check HF_TOKEN in credentialsSecret") from e
        raise FetchError(f"{src.uri}: {e}") from e
    (dest / DONE_MARKER).write_text(json.dumps({"uri": src.uri}) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rljob_client.fetch", description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="hf://ORG/NAME[@REVISION]")
    parser.add_argument("--dest", type=Path, required=True, help="directory to download into")
    parser.add_argument("--repo-type", choices=("model", "dataset"), default="model")
    parser.add_argument("--termination-log", type=Path, default=TERMINATION_LOG)
    args = parser.parse_args(argv)
    try:
        src = parse_uri(args.uri)
        print(f"fetching {src.uri} into {args.dest}", flush=True)
        fetch_hf(src, args.dest, token=os.environ.get("HF_TOKEN"), endpoint=os.environ.get("HF_ENDPOINT"),
                 repo_type=args.repo_type)
    except FetchError as e:
        print(f"fetch failed: {e}", file=sys.stderr, flush=True)
        try:
            args.termination_log.write_text(str(e))
        except OSError:
            pass  # no termination log outside a pod
        return 1
    print(f"fetched {src.uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
