"""Templates and their builds: ``client.templates`` (:class:`Templates`,
:class:`AsyncTemplates`) and the handle of one build (:class:`Build`, :class:`AsyncBuild`).

    build = client.templates.build("web", "./app", build_args={"VERSION": "3"})
    for line in build.logs():          # followed until the build ends
        print(line.text)
    build.wait()                       # raises BuildFailed unless the template is ready
    Sandbox.create("web")

    client.templates.build_from_image("tools", "registry.example:5000/team/tools:1").wait()
    client.templates.upload_image("app", "./app-image.tar").wait()   # docker save, OCI
    client.templates.update("app", start={"cmd": "exec app", "ready": {"port": 8080}})

A Dockerfile build's context directory is packed here (:mod:`hutch._context`:
``.dockerignore`` applied, symlinks sent as links) and uploaded with ``POST /v1/templates``;
the server runs the build. An image build names the image (the server pulls it) or uploads
an image archive (:mod:`hutch._images`); its log has ``progress`` lines for each layer's
download and extraction (:attr:`BuildLogLine.progress`).
"""

from __future__ import annotations

import asyncio
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

from . import _images as images
from . import _ops as ops
from . import errors
from ._context import CHUNK, PackedContext, PathLike, pack_context
from ._events import AsyncSseSubscription, SseSubscription
from ._protocol import _UNSET
from .models import BuildInfo, BuildLogLine, Template

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .sandbox import Client


def _failure(info: BuildInfo) -> errors.BuildFailed:
    reason = info.error or "no reason given"
    return errors.BuildFailed(
        f"build {info.id} of template {info.template} {info.status}: {reason}", build=info
    )


class _BuildBase:
    """What both build handles keep: the build as last seen."""

    _info: BuildInfo

    @property
    def id(self) -> str:
        """``bld_…``."""
        return self._info.id

    @property
    def template(self) -> str:
        """The template it builds."""
        return self._info.template

    @property
    def status(self) -> str:
        """As last seen (:meth:`refresh`): ``queued``, ``running``, ``succeeded``,
        ``failed`` or ``cancelled``."""
        return self._info.status

    @property
    def info(self) -> BuildInfo:
        """The build as last seen: steps, timings, error."""
        return self._info

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id!r}, template={self.template!r}, "
            f"status={self.status!r})"
        )


class Build(_BuildBase):
    """A template build running on the server (from :meth:`Templates.build`)."""

    def __init__(self, info: BuildInfo, client: Client) -> None:
        self._info = info
        self._client = client

    def refresh(self) -> BuildInfo:
        """Ask the server how the build is."""
        self._info = self._client._call(ops.get_build(self.template, self.id))
        return self._info

    def cancel(self) -> BuildInfo:
        """Cancel it: its running step is killed and the template stays as it was. The build
        ends ``cancelled`` a moment later (:meth:`wait` raises :class:`~hutch.BuildFailed`)."""
        self._info = self._client._call(ops.cancel_build(self.template, self.id))
        return self._info

    def logs(self, *, timeout: Optional[float] = None) -> Iterator[BuildLogLine]:
        """The build's log from its first line, followed until the build ends.

        Args:
            timeout: Longest wait for the next line in seconds (``None``: forever).
        """
        request = ops.follow_build_logs(self.template, self.id, timeout)
        with SseSubscription(self._client, request, ops.build_log_event) as sub:
            for item in sub:
                if isinstance(item, BuildLogLine):
                    yield item
                else:
                    return

    def wait(
        self,
        *,
        timeout: Optional[float] = None,
        on_line: Optional[Callable[[BuildLogLine], Any]] = None,
    ) -> BuildInfo:
        """Follow the log until the build ends; the build once it succeeded.

        Args:
            timeout: Longest wait for the next log line in seconds (``None``: forever).
            on_line: Called with each log line as it comes.

        Raises:
            BuildFailed: The build failed (a step's error) or was cancelled.
        """
        for line in self.logs(timeout=timeout):
            if on_line is not None:
                on_line(line)
        info = self.refresh()
        if info.status != "succeeded":
            raise _failure(info)
        return info


class Templates:
    """``client.templates``: the server's templates, building them (from a Dockerfile, an
    image in a registry or an uploaded image) and changing them. Calling it
    (``client.templates()``) lists them."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __call__(self) -> List[Template]:
        """The templates sandboxes can be created from (same as :meth:`list`)."""
        return self.list()

    def list(self) -> List[Template]:
        """The templates sandboxes can be created from."""
        return self._client._call(ops.templates())

    def get(self, name: str) -> Template:
        """One template.

        Raises:
            NotFoundError: No such template.
        """
        return self._client._call(ops.get_template(name))

    def delete(self, name: str) -> None:
        """Delete a template (admin keys only).

        Raises:
            ConflictError: Sandboxes or snapshots use it (named in the message), or a build
                of it runs.
            NotFoundError: No such template.
            PermissionDenied: A tenant key.
        """
        self._client._call(ops.delete_template(name))

    def build(
        self,
        name: str,
        context_dir: PathLike = ".",
        dockerfile: PathLike = "Dockerfile",
        build_args: Optional[Mapping[str, Any]] = None,
        target: Optional[str] = None,
        no_cache: bool = False,
        registry_auth: Optional[str] = None,
        insecure_registries: Optional[Sequence[str]] = None,
        secrets: Optional[Mapping[str, Union[str, bytes]]] = None,
    ) -> Build:
        """Start building template ``name`` from a Dockerfile and a build context.

        The context directory is packed and uploaded; the server plans the Dockerfile before
        it answers, then runs the build in the background (:meth:`Build.wait`).

        Args:
            name: The template (replaced once the build succeeds).
            context_dir: The build context; its ``.dockerignore`` leaves files out.
            dockerfile: A path in the context, or an absolute path anywhere.
            build_args: Values of the Dockerfile's ``ARG`` s.
            target: The stage to build (default: the last).
            no_cache: Run every step, ignoring cached results.
            registry_auth: ``USER:PASSWORD`` for the registry of the ``FROM`` images.
            insecure_registries: Registries (``host:port``) the ``FROM`` images' pulls speak
                plain HTTP to.
            secrets: Values by id for ``RUN --mount=type=secret,id=…`` (text or bytes);
                never stored in the template, its cache or the build log.

        Raises:
            InvalidRequest: The Dockerfile does not parse or plan (the message names the
                line), no Dockerfile, a bad name.
            HutchError: 413 when the context is over the server's limit.
        """
        packed = pack_context(context_dir, dockerfile)
        try:
            call = ops.build_template(
                name,
                packed.chunks(),
                dockerfile=packed.dockerfile,
                build_args=build_args,
                target=target,
                no_cache=no_cache,
                registry_auth=registry_auth,
                insecure_registries=insecure_registries,
                secrets=secrets,
            )
            return Build(self._client._call(call), self._client)
        finally:
            packed.close()

    def build_from_image(
        self,
        name: str,
        from_image: str,
        *,
        registry_auth: Optional[str] = None,
        insecure_registries: Optional[Sequence[str]] = None,
        start: Optional[Mapping[str, Any]] = None,
        force: bool = False,
        cpus: Optional[float] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
    ) -> Build:
        """Start building template ``name`` from an OCI image in a registry, which the
        server pulls and unpacks in the background (:meth:`Build.wait`; the log's
        ``progress`` lines tell how far each layer is). Images in local files are uploaded
        with :meth:`upload_image` instead.

        Args:
            name: The template (replaced once the build succeeds).
            from_image: The image (``debian:12``, ``registry.example:5000/team/tools:1``).
            registry_auth: ``USER:PASSWORD`` for its registry.
            insecure_registries: Registries (``host:port``) to speak plain HTTP to.
            start: The template's start command, a ``ServiceSpec`` mapping:
                ``{"cmd": "exec httpd -f", "ready": {"port": 80}}`` (see
                :meth:`update`).
            force: Pull and unpack again even when the template was made from this image.
            cpus: CPUs its sandboxes get when a create names none.
            memory_mib: Their memory limit (MiB) when a create names none.
            disk_mib: Their writable disk (MiB) when a create names none.

        Raises:
            InvalidRequest: A bad name or value, or ``from_image`` naming local files
                (``oci:…``, ``docker-archive:…``: upload them).
            ConflictError: With a tenant key: the name is another tenant's, or shared.
        """
        call = images.build_from_image(
            name,
            from_image,
            registry_auth=registry_auth,
            insecure_registries=insecure_registries,
            start=start,
            force=force,
            cpus=cpus,
            memory_mib=memory_mib,
            disk_mib=disk_mib,
        )
        return Build(self._client._call(call), self._client)

    def upload_image(
        self,
        name: str,
        archive: PathLike,
        *,
        image_tag: Optional[str] = None,
        start: Optional[Mapping[str, Any]] = None,
        cpus: Optional[float] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
    ) -> Build:
        """Start building template ``name`` from an image in local files, uploaded: a
        ``docker save`` archive or a tarball of an OCI image layout (sent as it is), or an
        OCI image layout directory (packed here). The template records its image as
        ``upload`` (``upload:TAG`` with ``image_tag``).

        Args:
            name: The template (replaced once the build succeeds).
            archive: The tarball, or the layout directory.
            image_tag: Which of its images (a layout's ``org.opencontainers.image.ref.name``,
                an archive's ``RepoTags`` entry); without it, it must hold exactly one.
            start: The template's start command (see :meth:`build_from_image`).
            cpus: CPUs its sandboxes get when a create names none.
            memory_mib: Their memory limit (MiB) when a create names none.
            disk_mib: Their writable disk (MiB) when a create names none.

        Raises:
            InvalidRequest: No such file or directory, a bad name or value, a malformed tar
                stream.
            HutchError: 413 when the archive is over the server's limit.
        """
        params = images.upload_params(
            name,
            image_tag=image_tag,
            start=start,
            cpus=cpus,
            memory_mib=memory_mib,
            disk_mib=disk_mib,
        )
        packed = images.open_archive(archive)
        try:
            call = images.upload_image(params, packed.chunks())
            return Build(self._client._call(call), self._client)
        finally:
            packed.close()

    def update(
        self, name: str, *, start: Any = _UNSET, isolation: Optional[str] = None
    ) -> Template:
        """Change a ready template: sandboxes created from it afterwards get the change;
        running ones, snapshots and hibernated sandboxes keep what they started with.

        Args:
            name: The template.
            start: Its new start command and ready check, a ``ServiceSpec`` mapping:
                ``cmd`` (a shell string or an argv list), optionally ``env``, ``cwd``,
                ``user`` and ``ready`` (``{"port": 8080}`` or ``{"cmd": …}``, with
                ``interval_ms``, ``attempt_timeout_ms``, ``timeout_ms``). ``None`` removes
                it; left out, it stays.
            isolation: ``auto``, ``ns`` or ``vm``: what a create that names none gets.

        Returns:
            The template as it is now.

        Raises:
            NotFoundError: No such ready template (or another tenant's).
            PermissionDenied: A tenant key on a template shared by every tenant.
            ConflictError: A build of it runs.
        """
        return self._client._call(images.update_template(name, start=start, isolation=isolation))

    def builds(self, name: str) -> List[Build]:
        """The builds of ``name`` the server remembers, oldest first."""
        return [Build(i, self._client) for i in self._client._call(ops.list_builds(name))]

    def get_build(self, name: str, build_id: str) -> Build:
        """Build ``build_id`` of template ``name``."""
        return Build(self._client._call(ops.get_build(name, build_id)), self._client)


class AsyncBuild(_BuildBase):
    """A template build running on the server (from :meth:`AsyncTemplates.build`)."""

    def __init__(self, info: BuildInfo, client: AsyncClient) -> None:
        self._info = info
        self._client = client

    async def refresh(self) -> BuildInfo:
        """Ask the server how the build is."""
        self._info = await self._client._call(ops.get_build(self.template, self.id))
        return self._info

    async def cancel(self) -> BuildInfo:
        """Cancel it (see :meth:`Build.cancel`)."""
        self._info = await self._client._call(ops.cancel_build(self.template, self.id))
        return self._info

    async def logs(self, *, timeout: Optional[float] = None) -> AsyncIterator[BuildLogLine]:
        """The build's log, followed until the build ends (``async for``)."""
        request = ops.follow_build_logs(self.template, self.id, timeout)
        async with AsyncSseSubscription(self._client, request, ops.build_log_event) as sub:
            async for item in sub:
                if isinstance(item, BuildLogLine):
                    yield item
                else:
                    return

    async def wait(
        self,
        *,
        timeout: Optional[float] = None,
        on_line: Optional[Callable[[BuildLogLine], Any]] = None,
    ) -> BuildInfo:
        """Follow the log until the build ends (see :meth:`Build.wait`); ``on_line`` may be a
        coroutine function."""
        async for line in self.logs(timeout=timeout):
            if on_line is not None:
                out = on_line(line)
                if asyncio.iscoroutine(out):
                    await out
        info = await self.refresh()
        if info.status != "succeeded":
            raise _failure(info)
        return info


async def _async_chunks(packed: PackedContext) -> AsyncIterator[bytes]:
    """The packed context's (or image archive's) bytes, read off the event loop."""
    await asyncio.to_thread(packed.file.seek, 0)
    while True:
        piece = await asyncio.to_thread(packed.file.read, CHUNK)
        if not piece:
            return
        yield piece


class AsyncTemplates:
    """``client.templates`` of an :class:`~hutch.AsyncClient` (see :class:`Templates`);
    ``await client.templates()`` lists them."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def __call__(self) -> List[Template]:
        return await self.list()

    async def list(self) -> List[Template]:
        """The templates sandboxes can be created from."""
        return await self._client._call(ops.templates())

    async def get(self, name: str) -> Template:
        """One template (``NotFoundError`` if there is none)."""
        return await self._client._call(ops.get_template(name))

    async def delete(self, name: str) -> None:
        """Delete a template (see :meth:`Templates.delete`)."""
        await self._client._call(ops.delete_template(name))

    async def build(
        self,
        name: str,
        context_dir: PathLike = ".",
        dockerfile: PathLike = "Dockerfile",
        build_args: Optional[Mapping[str, Any]] = None,
        target: Optional[str] = None,
        no_cache: bool = False,
        registry_auth: Optional[str] = None,
        insecure_registries: Optional[Sequence[str]] = None,
        secrets: Optional[Mapping[str, Union[str, bytes]]] = None,
    ) -> AsyncBuild:
        """Start building template ``name`` (see :meth:`Templates.build`); the context is
        packed on a worker thread."""
        packed = await asyncio.to_thread(pack_context, context_dir, dockerfile)
        try:
            call = ops.build_template(
                name,
                _async_chunks(packed),
                dockerfile=packed.dockerfile,
                build_args=build_args,
                target=target,
                no_cache=no_cache,
                registry_auth=registry_auth,
                insecure_registries=insecure_registries,
                secrets=secrets,
            )
            return AsyncBuild(await self._client._call(call), self._client)
        finally:
            packed.close()

    async def build_from_image(
        self,
        name: str,
        from_image: str,
        *,
        registry_auth: Optional[str] = None,
        insecure_registries: Optional[Sequence[str]] = None,
        start: Optional[Mapping[str, Any]] = None,
        force: bool = False,
        cpus: Optional[float] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
    ) -> AsyncBuild:
        """Start building template ``name`` from an image in a registry (see
        :meth:`Templates.build_from_image`)."""
        call = images.build_from_image(
            name,
            from_image,
            registry_auth=registry_auth,
            insecure_registries=insecure_registries,
            start=start,
            force=force,
            cpus=cpus,
            memory_mib=memory_mib,
            disk_mib=disk_mib,
        )
        return AsyncBuild(await self._client._call(call), self._client)

    async def upload_image(
        self,
        name: str,
        archive: PathLike,
        *,
        image_tag: Optional[str] = None,
        start: Optional[Mapping[str, Any]] = None,
        cpus: Optional[float] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
    ) -> AsyncBuild:
        """Start building template ``name`` from an uploaded image archive or OCI layout
        directory (see :meth:`Templates.upload_image`); a directory is packed and the file
        read on a worker thread."""
        params = images.upload_params(
            name,
            image_tag=image_tag,
            start=start,
            cpus=cpus,
            memory_mib=memory_mib,
            disk_mib=disk_mib,
        )
        packed = await asyncio.to_thread(images.open_archive, archive)
        try:
            call = images.upload_image(params, _async_chunks(packed))
            return AsyncBuild(await self._client._call(call), self._client)
        finally:
            packed.close()

    async def update(
        self, name: str, *, start: Any = _UNSET, isolation: Optional[str] = None
    ) -> Template:
        """Change a ready template's start command (``None`` removes it; left out, it stays)
        or default isolation (see :meth:`Templates.update`)."""
        call = images.update_template(name, start=start, isolation=isolation)
        return await self._client._call(call)

    async def builds(self, name: str) -> List[AsyncBuild]:
        """The builds of ``name`` the server remembers, oldest first."""
        infos = await self._client._call(ops.list_builds(name))
        return [AsyncBuild(i, self._client) for i in infos]

    async def get_build(self, name: str, build_id: str) -> AsyncBuild:
        """Build ``build_id`` of template ``name``."""
        return AsyncBuild(await self._client._call(ops.get_build(name, build_id)), self._client)


__all__ = ["Build", "AsyncBuild", "Templates", "AsyncTemplates"]
