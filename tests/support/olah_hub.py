"""olah's own CLI (`olah-cli`), run by .venv-olah's Python for the test Hub (tests/support/hub_server.py), with one
correction to what it answers for a local mirror repository: a file or folder that is not in the requested commit
is a 404 EntryNotFound, as on huggingface.co, where olah 0.5.4 falls through to its upstream path and, offline,
answers 401 RepositoryNotFound. Clients probe optional files (transformers asks every model for tokenizer.model,
additional_chat_templates/, processor configs) and take a 404 as "absent" but a 401 as "no such repository".
Everything else is olah as shipped. Usage: python olah_hub.py OLAH-CLI-ARGUMENTS...
"""

from __future__ import annotations

import os

import git
from fastapi.responses import JSONResponse
from olah import server, server_api_routes, server_file_routes
from olah.server_access import build_repo_ref


def _absent(app, repo_type: str, org: str, repo: str, commit: str, path: str) -> bool:
    """True when a local mirror of the repository has `commit` and `path` is not in it."""
    ref = build_repo_ref(repo_type, org, repo)
    for root in app.state.app_settings.config.mirrors_path:
        folder = os.path.join(root, ref.repo_type, ref.org or "", ref.repo)
        if not os.path.isdir(folder):
            continue
        try:
            tree = git.Repo(folder).commit(commit).tree
        except (ValueError, git.BadName, git.exc.GitError):
            return False  # an unknown revision: olah's own answer
        path = path.strip("/")
        if not path:
            return False
        try:
            tree[path]
        except KeyError:
            return True
        return False
    return False


def _entry_not_found() -> JSONResponse:
    return JSONResponse({"error": "Entry not found"}, status_code=404,
                        headers={"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})


def _files(common):
    async def route(app, repo_type, org, repo, commit, file_path, request, *args, **kwargs):
        if _absent(app, repo_type, org, repo, commit, file_path):
            return _entry_not_found()
        return await common(app, repo_type, org, repo, commit, file_path, request, *args, **kwargs)
    return route


def _tree(common):
    async def route(app, repo_type, org, repo, commit, path, *args, **kwargs):
        if _absent(app, repo_type, org, repo, commit, path):
            return _entry_not_found()
        return await common(app, repo_type, org, repo, commit, path, *args, **kwargs)
    return route


if __name__ == "__main__":
    # the routes look these up by module global at each request
    server_file_routes.file_head_common = _files(server_file_routes.file_head_common)
    server_file_routes.file_get_common = _files(server_file_routes.file_get_common)
    server_api_routes.tree_proxy_common = _tree(server_api_routes.tree_proxy_common)
    server.cli()
