"""Packing a build context (no server): ``.dockerignore`` as Docker reads it, what goes in
the tar stream and what never does, and the query of a build."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Dict

import pytest

import hutch
from hutch import _protocol as p
from hutch._context import OUTSIDE_DOCKERFILE, DockerIgnore, pack_context


def test_dockerignore_matches_as_docker_does() -> None:
    ig = DockerIgnore.parse(
        "# comment\n*.log\n/build/\nnode_modules\n!node_modules/keep\n**/*.env\ndocs/*/draft?.md\n"
    )
    assert ig.excludes("a.log") and not ig.excludes("sub/a.log")
    assert ig.excludes("build") and ig.excludes("build/out/x.o")
    assert ig.excludes("node_modules/x") and not ig.excludes("node_modules/keep")
    assert ig.excludes("deep/er/secret.env") and ig.excludes("top.env")
    assert ig.excludes("docs/a/draft1.md") and not ig.excludes("docs/a/b/draft1.md")
    assert not ig.excludes("src/main.py") and not ig.excludes(".")
    assert ig.may_include_below("node_modules") and not ig.may_include_below("build")
    with pytest.raises(hutch.InvalidRequest, match="line 1"):
        DockerIgnore.parse("!\n")


def _packed(ctx: Path, dockerfile=None) -> Dict[str, tarfile.TarInfo]:
    packed = pack_context(ctx, dockerfile)
    try:
        packed.file.seek(0)
        with tarfile.open(fileobj=packed.file, mode="r:") as tar:
            members = {m.name.rstrip("/"): m for m in tar.getmembers()}
            assert packed.size == packed.file.seek(0, os.SEEK_END)
            return {"__dockerfile__": packed.dockerfile, **members}  # type: ignore[dict-item]
    finally:
        packed.close()


def test_the_context_leaves_out_ignored_and_special_files(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "src").mkdir(parents=True)
    (ctx / "node_modules" / "keep").mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM minimal\n")
    (ctx / "src" / "a.py").write_text("print(1)\n")
    (ctx / "secret.env").write_text("TOKEN=x\n")
    (ctx / "node_modules" / "big.js").write_text("x")
    (ctx / "node_modules" / "keep" / "k.js").write_text("k")
    (ctx / ".dockerignore").write_text("*.env\nnode_modules\n!node_modules/keep\nDockerfile\n")
    os.symlink("/etc/passwd", ctx / "passwd-link")
    os.mkfifo(ctx / "fifo")
    got = _packed(ctx)
    assert got.pop("__dockerfile__") == "Dockerfile"
    names = set(got)
    assert {"src", "src/a.py", "Dockerfile", ".dockerignore", "node_modules/keep/k.js"} <= names
    assert "secret.env" not in names and "node_modules/big.js" not in names
    assert "node_modules" not in names, "an excluded directory is walked, not sent"
    assert "fifo" not in names
    link = got["passwd-link"]
    assert link.issym() and link.linkname == "/etc/passwd", "symlinks are sent as links"


def test_a_dockerfile_outside_the_context_is_an_extra_entry(tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / OUTSIDE_DOCKERFILE).write_text("the context's own, never sent")
    outside = tmp_path / "web.Dockerfile"
    outside.write_text("FROM minimal\n")
    got = _packed(ctx, outside)
    assert got.pop("__dockerfile__") == OUTSIDE_DOCKERFILE
    assert got[OUTSIDE_DOCKERFILE].size == len("FROM minimal\n")
    assert list(got) == [OUTSIDE_DOCKERFILE]
    inside = ctx / "docker" / "Dockerfile.dev"
    inside.parent.mkdir()
    inside.write_text("FROM minimal\n")
    assert _packed(ctx, "docker/Dockerfile.dev")["__dockerfile__"] == "docker/Dockerfile.dev"
    with pytest.raises(hutch.InvalidRequest, match="no Dockerfile"):
        pack_context(ctx)


def test_the_build_query() -> None:
    assert p.build_params("web", "Dockerfile", {"A": "1 2"}, "run", True) == [
        ("name", "web"),
        ("dockerfile", "Dockerfile"),
        ("target", "run"),
        ("no_cache", "true"),
        ("build_arg", "A=1 2"),
    ]
    with pytest.raises(hutch.InvalidRequest):
        p.build_params("web", "Dockerfile", {"A=B": "x"}, None, False)
    assert p.build_path("web", "bld_1", "/logs") == "/v1/templates/web/builds/bld_1/logs"
