//! `api_scale`: what a request costs with 1 sandbox record versus many (5,000 by default),
//! in the same run: the warm exec round trip and `GET /v1/sandboxes/{id}` (p50, p90), their
//! ratio, and `GET /v1/sandboxes?limit=100` at the larger count.
//!
//! The requests use a tenant's key (its tenant and key written into the server's store), so
//! each one goes through the tenant check of `authorize`, the path that used to list every
//! record.
//!
//! Two servers answer side by side, one holding 1 record and one holding many, and the
//! requests alternate between them, so the noise of a shared machine falls on both alike.
//!
//! The many records are made cheaply: one real `ns` sandbox is created and hibernated, and
//! its record is copied into the server's store (through [`SqliteStore`], while the server
//! runs: SQLite in WAL mode takes the second writer) under new ids, with uid slots outside
//! the server's range and an expiry an hour away. They are what a hibernated `ns` sandbox's
//! row looks like, without its files (nothing reads them unless one is woken, and none is).
//! Creating 5,000 real ones would take most of an hour on 2 cores. The copies are deleted
//! from the store afterwards.

use std::time::Instant;

use anyhow::{bail, Context};
use hutch_core::store::{SqliteStore, Store, TenancyStore};
use hutch_core::tenant::keys::{hash_secret, KeyFormat, KeyScope, NewKey};
use hutch_core::tenant::settings::TenantRecord;
use hutch_core::tenant::Tenant;
use serde::Serialize;
use serde_json::{json, Value};

use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// The tenant the measured requests run as.
const TENANT: &str = "bench-api-scale";
/// First uid slot of the copies: far above any slot the server hands out.
const FIRST_COPY_SLOT: u32 = 1 << 24;

/// What [`run`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct ApiScale {
    /// Sandbox records in the larger case.
    pub records: usize,
    /// Samples per series.
    pub samples: usize,
    /// Seconds to insert the copies.
    pub fill_s: f64,
    /// The series (`…_1` and `…_<records>`).
    pub series: Vec<Summary>,
    /// p50 at `records` over p50 at 1, per request (target ≤ 1.1).
    pub ratio_p50: serde_json::Map<String, Value>,
    /// p90 at `records` over p90 at 1.
    pub ratio_p90: serde_json::Map<String, Value>,
}

impl ApiScale {
    /// The report lines.
    pub fn lines(&self) -> Vec<String> {
        let mut out = super::stats::series_lines(&self.series);
        for (name, r) in &self.ratio_p50 {
            out.push(format!(
                "api_scale {name}: {} records / 1 record = {:.3} at p50, {:.3} at p90",
                self.records,
                r.as_f64().unwrap_or(f64::NAN),
                self.ratio_p90
                    .get(name)
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN)
            ));
        }
        out
    }
}

/// Requests with one key (a tenant's, or the admin key) to a bench server.
pub(super) struct TenantClient<'a> {
    pub(super) url: &'a str,
    pub(super) key: String,
    pub(super) http: &'a reqwest::Client,
}

impl TenantClient<'_> {
    pub(super) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await?;
        if !r.status().is_success() {
            bail!(
                "{method} {path}: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
        }
        if r.status().as_u16() == 204 {
            return Ok(Value::Null);
        }
        Ok(r.json().await?)
    }

    pub(super) async fn create(&self, template: &str) -> anyhow::Result<String> {
        let v = self
            .send(
                reqwest::Method::POST,
                "/v1/sandboxes",
                Some(json!({"template": template, "ttl_seconds": 3600})),
            )
            .await?;
        v["id"].as_str().map(String::from).context("no id")
    }

    pub(super) async fn exec_true(&self, id: &str) -> anyhow::Result<()> {
        let v = self
            .send(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"cmd": ["true"]})),
            )
            .await?;
        if v["exit_code"] != 0 {
            bail!("true failed: {v}");
        }
        Ok(())
    }

    pub(super) async fn kill(&self, id: &str) -> anyhow::Result<()> {
        self.send(
            reqwest::Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
        )
        .await
        .map(drop)
    }
}

/// A bench server's tenant client and its measured sandbox.
struct Side<'a> {
    client: TenantClient<'a>,
    store: SqliteStore,
    id: String,
}

impl<'a> Side<'a> {
    /// Register the tenant's key on `srv` and create the measured sandbox.
    async fn open(srv: &'a BenchServer) -> anyhow::Result<Self> {
        let store = SqliteStore::open(&srv.state_dir().join("state.db"))
            .context("the bench server's store")?;
        let tenant = Tenant::new(TENANT);
        store
            .insert_tenant(&TenantRecord {
                name: tenant.clone(),
                settings: Default::default(),
                created_at_ms: hutch_core::time::now_ms(),
            })
            .await?;
        let key = KeyFormat::Hutch.generate();
        let record = NewKey {
            tenant,
            scope: KeyScope::Full,
            name: Some("bench api_scale".into()),
            selector: Default::default(),
            expires_at_ms: None,
            format: KeyFormat::Hutch,
            budget: Default::default(),
        }
        .record(&key, hutch_core::time::now_ms());
        store.insert_key(&hash_secret(&key), &record).await?;
        let (url, _, http) = srv.endpoint();
        let client = TenantClient { url, key, http };
        let id = client.create(srv.template()).await?;
        client.exec_true(&id).await?;
        Ok(Self { client, store, id })
    }

    async fn exec(&self) -> anyhow::Result<()> {
        self.client.exec_true(&self.id).await
    }

    async fn get(&self) -> anyhow::Result<()> {
        let path = format!("/v1/sandboxes/{}", self.id);
        self.client
            .send(reqwest::Method::GET, &path, None)
            .await
            .map(drop)
    }
}

/// Milliseconds `f` took.
async fn timed(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    f.await?;
    Ok(t0.elapsed().as_secs_f64() * 1000.0)
}

/// Fill `side`'s store to `records` sandbox records: a hibernated model and its copies.
/// Returns the ids to delete afterwards and the seconds the copies took.
async fn fill(
    side: &Side<'_>,
    template: &str,
    records: usize,
) -> anyhow::Result<(Vec<hutch_core::ids::SandboxId>, f64)> {
    let model_id: hutch_core::ids::SandboxId = side.client.create(template).await?.parse()?;
    side.client
        .send(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{model_id}/hibernate"),
            None,
        )
        .await?;
    let model = side
        .store
        .get_sandbox(&model_id)
        .await?
        .context("the model sandbox's record")?;
    let t0 = Instant::now();
    let now = hutch_core::time::now_ms();
    let mut copies = Vec::with_capacity(records.saturating_sub(2));
    for i in 0..records.saturating_sub(2) {
        let mut r = model.clone();
        r.id = hutch_core::ids::new_sandbox_id();
        r.uid_slot = FIRST_COPY_SLOT.saturating_add(u32::try_from(i).unwrap_or(u32::MAX));
        r.created_at_ms = now;
        r.expires_at_ms = now + 3_600_000;
        side.store.insert_sandbox(&r).await?;
        copies.push(r.id);
    }
    let fill_s = t0.elapsed().as_secs_f64();
    copies.push(model_id);
    Ok((copies, fill_s))
}

/// Measure on two servers at once, one with 1 sandbox record and one filled to `records`,
/// alternating their requests so the machine's noise falls on both alike; then clean up.
pub async fn run(
    small: &BenchServer,
    big: &BenchServer,
    records: usize,
    samples: usize,
) -> anyhow::Result<ApiScale> {
    let records = records.max(2);
    let one = Side::open(small).await?;
    let many = Side::open(big).await?;
    let (extra, fill_s) = fill(&many, big.template(), records).await?;
    let measured = async {
        let (mut exec1, mut execn, mut get1, mut getn) = (vec![], vec![], vec![], vec![]);
        for _ in 0..samples {
            exec1.push(timed(one.exec()).await?);
            execn.push(timed(many.exec()).await?);
        }
        for _ in 0..samples {
            get1.push(timed(one.get()).await?);
            getn.push(timed(many.get()).await?);
        }
        let mut list = Vec::new();
        for _ in 0..samples.div_ceil(4).max(1) {
            list.push(
                timed(async {
                    let v = many
                        .client
                        .send(reqwest::Method::GET, "/v1/sandboxes?limit=100", None)
                        .await?;
                    match v["sandboxes"].as_array().map(Vec::len) {
                        Some(n) if n == records.min(100) => Ok(()),
                        other => bail!("a page of {other:?} sandboxes"),
                    }
                })
                .await?,
            );
        }
        Ok::<_, anyhow::Error>(vec![
            summarize("api_scale_exec_round_trip_1", "ms", &exec1),
            summarize(
                &format!("api_scale_exec_round_trip_{records}"),
                "ms",
                &execn,
            ),
            summarize("api_scale_get_sandbox_1", "ms", &get1),
            summarize(&format!("api_scale_get_sandbox_{records}"), "ms", &getn),
            summarize(&format!("api_scale_list_limit_100_{records}"), "ms", &list),
        ])
    }
    .await;
    // The copies have no files: forget them in the store; the real ones through the API.
    let model = extra.last().cloned();
    for c in &extra {
        if Some(c) != model.as_ref() {
            many.store.delete_sandbox(c).await?;
        }
    }
    for (side, id) in [
        (&many, model.map(String::from)),
        (&many, Some(many.id.clone())),
        (&one, Some(one.id.clone())),
    ] {
        if let Some(id) = id {
            side.client.kill(&id).await?;
        }
    }
    let series = measured?;
    let mut ratio_p50 = serde_json::Map::new();
    let mut ratio_p90 = serde_json::Map::new();
    for what in ["exec_round_trip", "get_sandbox"] {
        let one = series
            .iter()
            .find(|s| s.name == format!("api_scale_{what}_1"));
        let many = series
            .iter()
            .find(|s| s.name == format!("api_scale_{what}_{records}"));
        if let (Some(one), Some(many)) = (one, many) {
            ratio_p50.insert(what.into(), json!(many.p50 / one.p50));
            ratio_p90.insert(what.into(), json!(many.p90 / one.p90));
        }
    }
    Ok(ApiScale {
        records,
        samples,
        fill_s,
        series,
        ratio_p50,
        ratio_p90,
    })
}
