"""A local Hugging Face Hub on 127.0.0.1, for tests that push to the Hub and load back by repo id (no network).

Reads are served by olah (PyPI ``olah``, a maintained Hub mirror server): in offline mode it serves the repos it
finds as git repositories under its ``mirrors_path`` (``<root>/mirror/models/<org>/<name>``), the way the Hub serves
them: ``/<repo>/resolve/<rev>/<file>`` with the ``X-Repo-Commit``/``ETag`` headers ``hf_hub_download`` needs,
``/api/models/<repo>/revision/<rev>`` and the tree/paths-info/commits listings. olah is read-only: no package serves
the Hub's upload API by itself, so this file adds, in front of olah's routes, the few write endpoints
huggingface_hub's ``create_repo`` and ``upload_folder`` call (``/api/repos/create``, ``/api/validate-yaml``,
``preupload``, the NDJSON ``commit``, ``/api/whoami-v2``), each commit a real git commit in olah's mirror, and the
two reads olah gets wrong offline (``offline_reads`` below): an absent file or folder, and a repo's latest metadata
(``model_info``), which olah answers with its upstream fallback's 401 "repository not found". Every file is
committed as a plain git blob (``uploadMode: regular``): no LFS or Xet storage to emulate.

Run as a subprocess (:class:`LocalHub`), so the test's own process keeps its offline huggingface_hub settings; the
server stops when the test stops it, when its parent process exits, or after ``max_seconds``, whichever is first.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request

_GITATTRIBUTES = "*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


def _git(repo: str, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "local-hub", "GIT_AUTHOR_EMAIL": "hub@127.0.0.1",
           "GIT_COMMITTER_NAME": "local-hub", "GIT_COMMITTER_EMAIL": "hub@127.0.0.1"}
    out = subprocess.run(["git", "-C", repo, *args], capture_output=True, check=True, env=env)
    return out.stdout.decode().strip()


def repo_dir(root: str, repo_id: str, repo_type: str = "model") -> str:
    """The git repository that holds ``repo_id`` (where olah's offline mirror mode looks for it)."""
    return os.path.join(root, "mirror", f"{repo_type}s", *repo_id.split("/"))


def commit_messages(root: str, repo_id: str) -> list[str]:
    """The commit summaries of ``repo_id``'s main branch, oldest first."""
    return _git(repo_dir(root, repo_id), "log", "--reverse", "--format=%s", "main").splitlines()


def build_app(root: str, port: int):
    """olah's FastAPI app, configured to serve ``<root>/mirror`` offline, with the write endpoints added first."""
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response
    from olah import server as olah_server
    from olah.configs import OlahConfig
    from olah.utils.logging import build_logger

    config = OlahConfig()
    config.host, config.port = "127.0.0.1", port
    config.mirror_netloc = config.mirror_lfs_netloc = f"127.0.0.1:{port}"
    config.offline = True  # never contact huggingface.co: unknown repos and files are answered from the mirror only
    config.mirrors_path = [os.path.join(root, "mirror")]
    config.repos_path = os.path.join(root, "cache")
    app = olah_server.app
    app.state.app_settings = olah_server.AppSettings(config=config)
    app.state.logger = olah_server.logger = build_logger("olah", "olah.log", logger_dir=os.path.join(root, "logs"))
    endpoint = f"http://127.0.0.1:{port}"
    lock = threading.Lock()  # one commit at a time per server (git's index is not shared safely)

    def _repo(repo_type: str, org: str, name: str) -> str:
        return repo_dir(root, f"{org}/{name}", repo_type.rstrip("s"))

    def _not_found(message: str, code: str = "RepoNotFound") -> Response:
        return JSONResponse({"error": message}, status_code=404, headers={"X-Error-Code": code})

    async def whoami(request: Request):
        return {"type": "user", "name": "local-user", "auth": {"accessToken": {"role": "write"}}}

    async def create_repo(request: Request):
        body = await request.json()
        repo_type = body.get("type") or "model"
        repo_id = f"{body['organization'] or 'local-user'}/{body['name']}"
        path = repo_dir(root, repo_id, repo_type)
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{endpoint}/{prefix}{repo_id}"
        if os.path.isdir(path):  # the Hub's answer; create_repo(exist_ok=True) accepts it
            return JSONResponse({"error": "You already created this repo", "url": url}, status_code=409)
        os.makedirs(path)
        with lock:
            _git(path, "init", "-q", "-b", "main")
            with open(os.path.join(path, ".gitattributes"), "w") as f:
                f.write(_GITATTRIBUTES)
            _git(path, "add", "-A")
            _git(path, "commit", "-q", "-m", "initial commit")  # the Hub's first commit of every repo
        return {"url": url, "name": repo_id}

    async def validate_yaml(request: Request):
        return {"errors": [], "warnings": []}

    async def preupload(repo_type: str, org: str, name: str, revision: str, request: Request):
        if not os.path.isdir(_repo(repo_type, org, name)):
            return _not_found(f"Repository {org}/{name} not found")
        files = (await request.json())["files"]
        # No "oid": the client then uploads every file, so each push is one commit whatever changed.
        return {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}

    async def commit(repo_type: str, org: str, name: str, revision: str, request: Request):
        path = _repo(repo_type, org, name)
        if not os.path.isdir(path):
            return _not_found(f"Repository {org}/{name} not found")
        if revision != "main":
            return JSONResponse({"error": "only the main branch is served"}, status_code=400)
        lines = [json.loads(line) for line in (await request.body()).splitlines() if line.strip()]
        header = next((item["value"] for item in lines if item["key"] == "header"), {})
        with lock:
            for item in lines:
                key, value = item["key"], item["value"]
                target = os.path.normpath(os.path.join(path, value.get("path", "")))
                if key != "header" and not target.startswith(path + os.sep):
                    return JSONResponse({"error": f"invalid path {value.get('path')!r}"}, status_code=400)
                if key == "file":
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with open(target, "wb") as f:
                        f.write(base64.b64decode(value["content"]))
                elif key == "deletedFile":
                    os.remove(target)
                elif key != "header":  # lfsFile, deletedFolder, ...: not needed by regular uploads
                    return JSONResponse({"error": f"unsupported commit operation {key}"}, status_code=400)
            _git(path, "add", "-A")
            message = ["-m", header.get("summary") or "Upload files"]
            if header.get("description"):
                message += ["-m", header["description"]]
            # --allow-empty: a push of unchanged files is still a commit here (preupload sends no oids), so the
            # commit count is the push count.
            _git(path, "commit", "-q", "--allow-empty", *message)
            oid = _git(path, "rev-parse", "HEAD")
        prefix = "" if repo_type == "models" else f"{repo_type}/"
        return {"commitUrl": f"{endpoint}/{prefix}{org}/{name}/commit/{oid}", "commitOid": oid,
                "success": True, "pullRequestUrl": None}

    # The reads olah gets wrong offline, for local repos; everything else goes on to olah's own routes.
    # - A path absent from a local repo (a file to resolve, a folder to list): olah falls back to its upstream and,
    #   offline, answers 401 "repository not found"; the Hub answers 404 EntryNotFound, which from_pretrained
    #   expects when it probes for optional files (model.safetensors.index.json, additional_chat_templates/).
    # - The repo's metadata at its latest commit (model_info): olah asks its upstream for the latest commit and,
    #   offline, answers 401; it is served as the main branch's metadata, which olah reads from the git repo.
    @app.middleware("http")
    async def offline_reads(request: Request, call_next):
        parts = request.url.path.strip("/").split("/")
        if request.method in ("GET", "HEAD"):
            if len(parts) >= 5 and parts[2] == "resolve":
                org, name, revision, file_path = parts[0], parts[1], parts[3], "/".join(parts[4:])
            elif len(parts) >= 7 and parts[:2] == ["api", "models"] and parts[4] == "tree":
                org, name, revision, file_path = parts[2], parts[3], parts[5], "/".join(parts[6:])
            elif len(parts) == 4 and parts[:2] == ["api", "models"]:
                org, name, revision, file_path = parts[2], parts[3], None, None
            else:
                org = None
            path = repo_dir(root, f"{org}/{name}") if org else None
            if path and os.path.isdir(path) and file_path is not None:
                try:
                    _git(path, "cat-file", "-e", f"{revision}:{file_path}")
                except subprocess.CalledProcessError:
                    return _not_found(f"{file_path} does not exist on {revision}", "EntryNotFound")
            elif path and os.path.isdir(path):
                request.scope["path"] = f"/api/models/{org}/{name}/revision/main"
        return await call_next(request)

    routes = [
        ("/api/whoami-v2", whoami, ["GET"]),
        ("/api/repos/create", create_repo, ["POST"]),
        ("/api/validate-yaml", validate_yaml, ["POST"]),
        ("/api/{repo_type}/{org}/{name}/preupload/{revision}", preupload, ["POST"]),
        ("/api/{repo_type}/{org}/{name}/commit/{revision}", commit, ["POST"]),
    ]
    olah_handlers = list(app.router.routes)
    app.router.routes.clear()
    for path, handler, methods in routes:
        app.add_api_route(path, handler, methods=methods)
    app.router.routes.extend(olah_handlers)
    return app


def serve(root: str, ready_file: str, max_seconds: float) -> None:
    """Serve on a free port of 127.0.0.1 (written to ``ready_file``) until stopped, orphaned or out of time."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections made before uvicorn runs wait in the backlog instead of being refused
    port = sock.getsockname()[1]
    app = build_app(root, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    parent, deadline = os.getppid(), time.monotonic() + max_seconds

    def watchdog():
        while os.getppid() == parent and time.monotonic() < deadline and not server.should_exit:
            time.sleep(0.5)
        server.should_exit = True

    threading.Thread(target=watchdog, daemon=True).start()
    with open(ready_file + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(ready_file + ".tmp", ready_file)
    server.run(sockets=[sock])


class LocalHub:
    """Start the local Hub in a subprocess serving ``root``; ``endpoint`` is its URL (for ``HF_ENDPOINT``)."""

    def __init__(self, root: str, max_seconds: float = 600, start_timeout: float = 60):
        self.root = root
        os.makedirs(os.path.join(root, "mirror", "models"), exist_ok=True)
        ready = os.path.join(root, "port")
        self._log = open(os.path.join(root, "server.log"), "wb")
        self._process = subprocess.Popen(
            [sys.executable, __file__, root, ready, str(max_seconds)], stdout=self._log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(ready):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the local Hub did not start: {self.log()}")
            time.sleep(0.1)
        with open(ready) as f:
            self.endpoint = f"http://127.0.0.1:{f.read().strip()}"
        with urllib.request.urlopen(f"{self.endpoint}/api/whoami-v2", timeout=10) as response:
            assert response.status == 200

    def commit_messages(self, repo_id: str) -> list[str]:
        return commit_messages(self.root, repo_id)

    def files(self, repo_id: str) -> list[str]:
        """The files of ``repo_id``'s main branch, read from its git repository."""
        return _git(repo_dir(self.root, repo_id), "ls-tree", "-r", "--name-only", "main").splitlines()

    def read(self, repo_id: str, path: str) -> str:
        return _git(repo_dir(self.root, repo_id), "show", f"main:{path}")

    def seed(self, repo_id: str, folder: str, message: str = "Upload model") -> None:
        """Put ``folder``'s files on the Hub as ``repo_id`` (a test's setup: written to git, not through the API)."""
        path = repo_dir(self.root, repo_id)
        shutil.copytree(folder, path)
        _git(path, "init", "-q", "-b", "main")
        with open(os.path.join(path, ".gitattributes"), "w") as f:
            f.write(_GITATTRIBUTES)
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", message)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        with open(self._log.name, errors="replace") as f:
            return f.read()[-4000:]

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], float(sys.argv[3]))
