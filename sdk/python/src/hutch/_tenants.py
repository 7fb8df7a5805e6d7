"""Tenants, API keys, metered usage and the audit log (``docs/teams.md``,
``docs/usage.md``): the models, the calls, and the
methods they add to :class:`hutch.Client` and :class:`hutch.AsyncClient` (mixins that use the client's
``_call`` and ``_all``).

    with Client() as admin:                         # the admin key
        admin.create_tenant("ml", quotas={"max_sandboxes": 10, "max_cpus": 8})
        key = admin.create_key(tenant="ml", scope="exec", selector={"agent": "a1"})
        print(key.secret)                           # shown only now
        admin.revoke_key(key.id)                    # stops working at once

An admin key acts for one tenant with ``Client(tenant="ml")`` (or ``HUTCH_TENANT``), which
sends ``X-Hutch-Tenant``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import _ops as ops
from ._protocol import Request, drop_none

#: Key scopes, widest first.
SCOPES = ("admin", "full", "exec", "read-only")


@dataclass
class Tenant:
    """A tenant: its quotas, the defaults of its sandboxes, its allowed templates."""

    name: str
    quotas: Dict[str, Any]
    """``max_sandboxes``, ``max_creates_per_hour``, ``max_cpus``, ``max_memory_mib``,
    ``max_ttl_seconds``, ``max_sandbox_cpus``, ``max_sandbox_memory_mib``,
    ``max_sandbox_disk_mib``, ``daily_budget``, ``monthly_budget``; ``None`` is no limit."""
    defaults: Dict[str, Any]
    """``network``, ``ttl_seconds``, ``isolation``, ``cpus``, ``memory_mib``, ``disk_mib``,
    applied when a create leaves them out."""
    allowed_templates: Optional[List[str]]
    """The only templates its sandboxes may use (``None``: any it sees)."""
    created_at: str
    usage: Optional[Dict[str, Any]] = None
    """What its sandboxes use now (:meth:`~hutch.Client.get_tenant` only): ``sandboxes``,
    ``cpus``, ``memory_mib``, ``creates_last_hour``."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Tenant:
        allowed = d.get("allowed_templates")
        return cls(
            name=str(d.get("name", "")),
            quotas=dict(d.get("quotas") or {}),
            defaults=dict(d.get("defaults") or {}),
            allowed_templates=[str(t) for t in allowed] if isinstance(allowed, list) else None,
            created_at=str(d.get("created_at", "")),
            usage=d.get("usage") if isinstance(d.get("usage"), dict) else None,
            raw=d,
        )


@dataclass
class ApiKey:
    """An API key as the server shows it; :attr:`secret` only in the answer that made it."""

    id: str
    """``key_…``: what it is listed and revoked by."""
    tenant: str
    scope: str
    """``admin``, ``full``, ``exec`` or ``read-only``."""
    name: Optional[str]
    selector: Dict[str, str]
    """Metadata every sandbox it reaches holds (empty: every sandbox of its tenant)."""
    prefix: str
    created_at: str
    expires_at: Optional[str]
    last_used_at: Optional[str]
    daily_budget: Optional[int] = None
    """What the sandboxes it creates may spend per UTC day (cost micros through the rate
    card, CPU-seconds without one); ``None``: no cap of its own."""
    monthly_budget: Optional[int] = None
    secret: Optional[str] = field(default=None, repr=False)
    """The key itself (``hk_…`` or ``e2b_…``), only from :meth:`~hutch.Client.create_key`."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ApiKey:
        opt = lambda k: str(d[k]) if d.get(k) is not None else None  # noqa: E731
        return cls(
            id=str(d.get("id", "")),
            tenant=str(d.get("tenant", "")),
            scope=str(d.get("scope", "")),
            name=opt("name"),
            selector={str(k): str(v) for k, v in (d.get("selector") or {}).items()},
            prefix=str(d.get("prefix", "")),
            created_at=str(d.get("created_at", "")),
            expires_at=opt("expires_at"),
            last_used_at=opt("last_used_at"),
            daily_budget=d.get("daily_budget"),
            monthly_budget=d.get("monthly_budget"),
            secret=opt("secret"),
            raw={k: v for k, v in d.items() if k != "secret"},
        )


@dataclass
class AuditEntry:
    """One audited call (:meth:`~hutch.Client.audit`): who, with which key, for which tenant,
    the route, the sandbox, an exec's argv, the status; never output or file contents."""

    id: int
    at: str
    key_id: Optional[str]
    tenant: Optional[str]
    method: str
    route: str
    path: str
    sandbox_id: Optional[str]
    argv: Optional[List[str]]
    status: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> AuditEntry:
        argv = d.get("argv")
        return cls(
            id=int(d.get("id") or 0),
            at=str(d.get("at", "")),
            key_id=d.get("key_id"),
            tenant=d.get("tenant"),
            method=str(d.get("method", "")),
            route=str(d.get("route", "")),
            path=str(d.get("path", "")),
            sandbox_id=d.get("sandbox_id"),
            argv=[str(a) for a in argv] if isinstance(argv, list) else None,
            status=int(d.get("status") or 0),
            raw=d,
        )


@dataclass
class UsageTotals:
    """Metered usage summed (:meth:`~hutch.Client.usage`): the whole answer's, or one group's
    (then :attr:`key` is the sandbox id, tenant, key id or day it groups by)."""

    cpu_seconds: float
    memory_gib_seconds: float
    """Working-set memory (cgroup memory minus reclaimable file cache) over time."""
    disk_gib_hours: float
    egress_bytes: int
    cost_micros: Optional[int]
    """Through the server's rate card; ``None`` on a server without one."""
    intervals: int
    key: Optional[str] = None
    kind: Optional[str] = None
    """``group_by="sandbox"``: ``sandbox``, ``snapshot`` or ``volume``."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any], key_field: Optional[str] = None) -> UsageTotals:
        cost = d.get("cost_micros")
        return cls(
            cpu_seconds=float(d.get("cpu_seconds") or 0.0),
            memory_gib_seconds=float(d.get("memory_gib_seconds") or 0.0),
            disk_gib_hours=float(d.get("disk_gib_hours") or 0.0),
            egress_bytes=int(d.get("egress_bytes") or 0),
            cost_micros=int(cost) if cost is not None else None,
            intervals=int(d.get("intervals") or 0),
            key=d.get(key_field) if key_field else None,
            kind=d.get("kind"),
            raw=d,
        )


#: The field of a usage group that names it, by ``group_by``.
_GROUP_FIELDS = {"sandbox": "sandbox_id", "tenant": "tenant", "key": "key_id", "day": "day"}


@dataclass
class UsageReport:
    """The answer of :meth:`~hutch.Client.usage`."""

    total: UsageTotals
    groups: List[UsageTotals]
    group_by: Optional[str]
    rate_card: Optional[Dict[str, Any]]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> UsageReport:
        group_by = d.get("group_by")
        key_field = _GROUP_FIELDS.get(str(group_by)) if group_by else None
        return cls(
            total=UsageTotals.from_json(d.get("total") or {}),
            groups=[UsageTotals.from_json(g, key_field) for g in d.get("groups") or []],
            group_by=group_by,
            rate_card=d.get("rate_card"),
            raw=d,
        )


def usage(
    since: Optional[str],
    until: Optional[str],
    group_by: Optional[str],
    tenant: Optional[str],
    key_id: Optional[str],
    sandbox_id: Optional[str],
) -> ops.Call[UsageReport]:
    if group_by is not None and group_by not in _GROUP_FIELDS:
        raise ValueError(f"group_by must be one of sandbox, tenant, key or day, got {group_by!r}")
    params = [
        (k, str(v))
        for k, v in (
            ("from", since),
            ("to", until),
            ("group_by", group_by),
            ("tenant", tenant),
            ("key_id", key_id),
            ("sandbox_id", sandbox_id),
        )
        if v is not None
    ]
    return ops.Call(
        Request("GET", "/v1/usage", params=params or None), ops._one(UsageReport.from_json)
    )


def set_key_budget(
    key_id: str, daily_budget: Optional[int], monthly_budget: Optional[int]
) -> ops.Call[ApiKey]:
    body = {"daily_budget": daily_budget, "monthly_budget": monthly_budget}
    return ops.Call(Request("PATCH", _key_path(key_id), json=body), ops._one(ApiKey.from_json))


def _settings(
    quotas: Optional[Mapping[str, Any]],
    defaults: Optional[Mapping[str, Any]],
    allowed_templates: Optional[Sequence[str]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if quotas is not None:
        body["quotas"] = dict(quotas)
    if defaults is not None:
        body["defaults"] = dict(defaults)
    if allowed_templates is not None:
        body["allowed_templates"] = list(allowed_templates)
    return body


def _tenant_path(name: str) -> str:
    if not name or "/" in name:
        raise ValueError(f"invalid tenant name {name!r}")
    return f"/v1/tenants/{name}"


def _key_path(key_id: str) -> str:
    if not key_id.startswith("key_") or "/" in key_id:
        raise ValueError(f"invalid key id {key_id!r}: key ids are key_…")
    return f"/v1/keys/{key_id}"


def create_tenant(name: str, body: Dict[str, Any]) -> ops.Call[Tenant]:
    return ops.Call(
        Request("POST", "/v1/tenants", json={"name": name, **body}),
        ops._one(Tenant.from_json),
    )


def tenants() -> ops.Listing[Tenant]:
    return ops.Listing("/v1/tenants", "tenants", Tenant.from_json)


def get_tenant(name: str) -> ops.Call[Tenant]:
    return ops.Call(Request("GET", _tenant_path(name)), ops._one(Tenant.from_json))


def update_tenant(name: str, body: Dict[str, Any]) -> ops.Call[Tenant]:
    return ops.Call(Request("PATCH", _tenant_path(name), json=body), ops._one(Tenant.from_json))


def delete_tenant(name: str) -> ops.Call[None]:
    return ops.Call(Request("DELETE", _tenant_path(name)), ops._nothing)


def create_key(
    tenant: Optional[str],
    scope: str,
    name: Optional[str],
    selector: Optional[Mapping[str, str]],
    expires_in_seconds: Optional[int],
    format: str,
    daily_budget: Optional[int] = None,
    monthly_budget: Optional[int] = None,
) -> ops.Call[ApiKey]:
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if format not in ("hutch", "e2b"):
        raise ValueError(f"format must be 'hutch' or 'e2b', got {format!r}")
    body = drop_none(
        {
            "tenant": tenant,
            "scope": scope,
            "name": name,
            "selector": dict(selector) if selector else None,
            "expires_in_seconds": expires_in_seconds,
            "format": format,
            "daily_budget": daily_budget,
            "monthly_budget": monthly_budget,
        }
    )
    return ops.Call(Request("POST", "/v1/keys", json=body), ops._one(ApiKey.from_json))


def keys() -> ops.Listing[ApiKey]:
    return ops.Listing("/v1/keys", "keys", ApiKey.from_json)


def get_key(key_id: str) -> ops.Call[ApiKey]:
    return ops.Call(Request("GET", _key_path(key_id)), ops._one(ApiKey.from_json))


def revoke_key(key_id: str) -> ops.Call[None]:
    return ops.Call(Request("DELETE", _key_path(key_id)), ops._nothing)


def audit(
    tenant: Optional[str],
    key_id: Optional[str],
    sandbox_id: Optional[str],
    since: Optional[str],
    until: Optional[str],
) -> ops.Listing[AuditEntry]:
    params = tuple(
        (k, v)
        for k, v in (
            ("tenant", tenant),
            ("key_id", key_id),
            ("sandbox_id", sandbox_id),
            ("since", since),
            ("until", until),
        )
        if v is not None
    )
    return ops.Listing("/v1/audit", "entries", AuditEntry.from_json, params)


class TenantMethods:
    """Tenants and keys on :class:`hutch.Client`."""

    _call: Any
    _all: Any

    def create_tenant(
        self,
        name: str,
        *,
        quotas: Optional[Mapping[str, Any]] = None,
        defaults: Optional[Mapping[str, Any]] = None,
        allowed_templates: Optional[Sequence[str]] = None,
    ) -> Tenant:
        """Make a tenant (admin key).

        Raises:
            ConflictError: It exists.
            InvalidRequest: A bad name, quota or default.
        """
        return self._call(create_tenant(name, _settings(quotas, defaults, allowed_templates)))  # type: ignore[no-any-return]

    def tenants(self) -> List[Tenant]:
        """Every tenant (admin key)."""
        return self._all(tenants())  # type: ignore[no-any-return]

    def get_tenant(self, name: str) -> Tenant:
        """One tenant, with :attr:`Tenant.usage` (admin key)."""
        return self._call(get_tenant(name))  # type: ignore[no-any-return]

    def update_tenant(
        self,
        name: str,
        *,
        quotas: Optional[Mapping[str, Any]] = None,
        defaults: Optional[Mapping[str, Any]] = None,
        allowed_templates: Optional[Sequence[str]] = None,
        allow_any_template: bool = False,
    ) -> Tenant:
        """Change a tenant (admin key): each part given replaces that part whole;
        ``allow_any_template`` drops its allow-list."""
        body = _settings(quotas, defaults, allowed_templates)
        if allow_any_template:
            body["allowed_templates"] = None
        return self._call(update_tenant(name, body))  # type: ignore[no-any-return]

    def delete_tenant(self, name: str) -> None:
        """Delete a tenant and its keys (admin key).

        Raises:
            ConflictError: It still owns sandboxes, snapshots, volumes or templates.
        """
        self._call(delete_tenant(name))

    def create_key(
        self,
        *,
        tenant: Optional[str] = None,
        scope: str = "full",
        name: Optional[str] = None,
        selector: Optional[Mapping[str, str]] = None,
        expires_in_seconds: Optional[int] = None,
        format: str = "hutch",
        daily_budget: Optional[int] = None,
        monthly_budget: Optional[int] = None,
    ) -> ApiKey:
        """Make a key no wider than this client's own; :attr:`ApiKey.secret` holds it
        (shown only now). ``format="e2b"`` makes an ``e2b_…`` secret for E2B SDKs.
        ``daily_budget``/``monthly_budget`` cap what the sandboxes it creates may spend.

        Raises:
            PermissionDenied: The key would be wider than this client's (403).
        """
        return self._call(  # type: ignore[no-any-return]
            create_key(
                tenant,
                scope,
                name,
                selector,
                expires_in_seconds,
                format,
                daily_budget,
                monthly_budget,
            )
        )

    def set_key_budget(
        self,
        key_id: str,
        *,
        daily_budget: Optional[int] = None,
        monthly_budget: Optional[int] = None,
    ) -> ApiKey:
        """Replace a key's spending caps (``None``: no cap). No key changes its own.

        Raises:
            PermissionDenied: This client's key may not (its own, or a larger cap than its own).
        """
        return self._call(set_key_budget(key_id, daily_budget, monthly_budget))  # type: ignore[no-any-return]

    def usage(
        self,
        *,
        since: Optional[str] = None,
        until: Optional[str] = None,
        group_by: Optional[str] = None,
        tenant: Optional[str] = None,
        key_id: Optional[str] = None,
        sandbox_id: Optional[str] = None,
    ) -> UsageReport:
        """Metered usage (CPU-seconds, working-set GiB-seconds, disk GiB-hours, egress bytes)
        and its cost, of the intervals ending after ``since`` and at or before ``until``
        (RFC 3339 or milliseconds), grouped by ``sandbox``, ``tenant``, ``key`` or ``day``."""
        return self._call(usage(since, until, group_by, tenant, key_id, sandbox_id))  # type: ignore[no-any-return]

    def keys(self) -> List[ApiKey]:
        """The keys this client's key may see (never their secrets)."""
        return self._all(keys())  # type: ignore[no-any-return]

    def get_key(self, key_id: str) -> ApiKey:
        """One key by id (``key_…``)."""
        return self._call(get_key(key_id))  # type: ignore[no-any-return]

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key: it stops working at once, and what it holds open is closed."""
        self._call(revoke_key(key_id))

    def audit(
        self,
        *,
        tenant: Optional[str] = None,
        key_id: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        since: Optional[str] = None,
        until: Optional[str] = None,
    ) -> List[AuditEntry]:
        """The audit log (full or admin key), oldest first; ``since``/``until`` are RFC 3339
        or milliseconds. Entries are written in batches: a call shows within about 5 s."""
        return self._all(audit(tenant, key_id, sandbox_id, since, until))  # type: ignore[no-any-return]


class AsyncTenantMethods:
    """Tenants and keys on :class:`hutch.AsyncClient` (see :class:`TenantMethods`)."""

    _call: Any
    _all: Any

    async def create_tenant(
        self,
        name: str,
        *,
        quotas: Optional[Mapping[str, Any]] = None,
        defaults: Optional[Mapping[str, Any]] = None,
        allowed_templates: Optional[Sequence[str]] = None,
    ) -> Tenant:
        """Make a tenant (admin key)."""
        return await self._call(  # type: ignore[no-any-return]
            create_tenant(name, _settings(quotas, defaults, allowed_templates))
        )

    async def tenants(self) -> List[Tenant]:
        """Every tenant (admin key)."""
        return await self._all(tenants())  # type: ignore[no-any-return]

    async def get_tenant(self, name: str) -> Tenant:
        """One tenant, with :attr:`Tenant.usage` (admin key)."""
        return await self._call(get_tenant(name))  # type: ignore[no-any-return]

    async def update_tenant(
        self,
        name: str,
        *,
        quotas: Optional[Mapping[str, Any]] = None,
        defaults: Optional[Mapping[str, Any]] = None,
        allowed_templates: Optional[Sequence[str]] = None,
        allow_any_template: bool = False,
    ) -> Tenant:
        """Change a tenant (admin key)."""
        body = _settings(quotas, defaults, allowed_templates)
        if allow_any_template:
            body["allowed_templates"] = None
        return await self._call(update_tenant(name, body))  # type: ignore[no-any-return]

    async def delete_tenant(self, name: str) -> None:
        """Delete a tenant and its keys (admin key)."""
        await self._call(delete_tenant(name))

    async def create_key(
        self,
        *,
        tenant: Optional[str] = None,
        scope: str = "full",
        name: Optional[str] = None,
        selector: Optional[Mapping[str, str]] = None,
        expires_in_seconds: Optional[int] = None,
        format: str = "hutch",
        daily_budget: Optional[int] = None,
        monthly_budget: Optional[int] = None,
    ) -> ApiKey:
        """Make a key no wider than this client's own (secret shown only now)."""
        return await self._call(  # type: ignore[no-any-return]
            create_key(
                tenant,
                scope,
                name,
                selector,
                expires_in_seconds,
                format,
                daily_budget,
                monthly_budget,
            )
        )

    async def set_key_budget(
        self,
        key_id: str,
        *,
        daily_budget: Optional[int] = None,
        monthly_budget: Optional[int] = None,
    ) -> ApiKey:
        """Replace a key's spending caps (see :meth:`hutch.Client.set_key_budget`)."""
        return await self._call(set_key_budget(key_id, daily_budget, monthly_budget))  # type: ignore[no-any-return]

    async def usage(
        self,
        *,
        since: Optional[str] = None,
        until: Optional[str] = None,
        group_by: Optional[str] = None,
        tenant: Optional[str] = None,
        key_id: Optional[str] = None,
        sandbox_id: Optional[str] = None,
    ) -> UsageReport:
        """Metered usage and its cost (see :meth:`hutch.Client.usage`)."""
        return await self._call(usage(since, until, group_by, tenant, key_id, sandbox_id))  # type: ignore[no-any-return]

    async def keys(self) -> List[ApiKey]:
        """The keys this client's key may see."""
        return await self._all(keys())  # type: ignore[no-any-return]

    async def get_key(self, key_id: str) -> ApiKey:
        """One key by id."""
        return await self._call(get_key(key_id))  # type: ignore[no-any-return]

    async def revoke_key(self, key_id: str) -> None:
        """Revoke a key at once."""
        await self._call(revoke_key(key_id))

    async def audit(
        self,
        *,
        tenant: Optional[str] = None,
        key_id: Optional[str] = None,
        sandbox_id: Optional[str] = None,
        since: Optional[str] = None,
        until: Optional[str] = None,
    ) -> List[AuditEntry]:
        """The audit log, oldest first (see :meth:`TenantMethods.audit`)."""
        return await self._all(audit(tenant, key_id, sandbox_id, since, until))  # type: ignore[no-any-return]
