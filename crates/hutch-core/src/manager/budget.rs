//! Spending caps: daily and monthly budgets of tenants (`quotas.daily_budget`,
//! `quotas.monthly_budget`) and of keys (`daily_budget`, `monthly_budget`), and the
//! `max_cost_micros` of one sandbox, counted in cost micros through the rate card or, on a
//! server without one, in CPU-seconds ([`BudgetUnit`]).
//!
//! - **Refusal**: a create, wake or resume whose tenant, creating key or sandbox has spent
//!   its budget is 429 `quota_exceeded` naming `daily_budget`, `monthly_budget` or
//!   `max_cost_micros` ([`Manager::check_budgets`]); nothing is made or changed.
//! - **Enforcement**: after each sampling round ([`Manager::enforce_budgets`]) the running
//!   sandboxes of whoever has spent a budget are hibernated (or paused,
//!   `Config::budget_action`): never killed, nothing lost. Raising the budget (or the next
//!   day or month) lets them wake.
//!
//! Budgets count what is metered and written: a sandbox may overrun by what it uses in one
//! sampling interval. What a spender spent is summed from the store once and then kept up to
//! date as intervals are written ([`SpendCache`]), so a check costs no scan of the rows.

use std::collections::HashMap;
use std::sync::Arc;

use super::Manager;
use crate::config::BudgetAction;
use crate::error::CoreResult;
use crate::ids::KeyId;
use crate::model::{SandboxRecord, SandboxState};
use crate::store::{PageRequest, SandboxQuery};
use crate::tenant::quota::{Amount, QuotaExceeded, QuotaName};
use crate::tenant::{Tenant, TenantScope, ADMIN_TENANT};
use crate::time::now_ms;
use crate::usage::{day_and_month_start, BudgetUnit, UsageInterval, UsageQuery, UsageTotals};

/// What budgeted spenders spent in their current windows, summed from the store on first use
/// and updated under the same lock as each batch of intervals is written (so no batch is
/// counted twice or missed). Entries of past windows are dropped when the day changes.
#[derive(Default)]
pub(super) struct SpendCache {
    inner: tokio::sync::Mutex<Spent>,
}

#[derive(Default)]
pub(super) struct Spent {
    /// The day window the entries are for.
    day: i64,
    tenants: HashMap<(Tenant, i64), UsageTotals>,
    keys: HashMap<(KeyId, i64), UsageTotals>,
    /// Whole lives of sandboxes with their own cap.
    sandboxes: HashMap<String, UsageTotals>,
}

/// Most sandboxes' lifetime sums kept (past it the cache starts again from the store).
const MAX_CACHED_SANDBOXES: usize = 100_000;

impl Spent {
    /// Count `intervals`, just written, in every entry they belong to.
    pub(super) fn add(&mut self, intervals: &[UsageInterval]) {
        for i in intervals {
            for ((t, from), total) in self.tenants.iter_mut() {
                if i.tenant.as_ref() == Some(t) && i.end_ms > *from {
                    *total = total.plus(&i.usage);
                }
            }
            if let Some(k) = &i.key_id {
                for ((key, from), total) in self.keys.iter_mut() {
                    if key == k && i.end_ms > *from {
                        *total = total.plus(&i.usage);
                    }
                }
            }
            if let Some(total) = self.sandboxes.get_mut(&i.resource) {
                *total = total.plus(&i.usage);
            }
        }
    }
}

impl SpendCache {
    /// Held while a batch of intervals is written and counted ([`Spent::add`]).
    pub(super) async fn lock(&self) -> tokio::sync::MutexGuard<'_, Spent> {
        self.inner.lock().await
    }
}

/// Which sum a check asks for.
enum Sum<'a> {
    Tenant(&'a Tenant, i64),
    Key(&'a KeyId, i64),
    Sandbox(&'a str),
}

/// Whose spending an operation adds to.
#[derive(Debug, Clone, Default)]
pub(super) struct Spender {
    pub tenant: Option<Tenant>,
    pub key: Option<KeyId>,
    /// The sandbox's own cap, with its id.
    pub sandbox: Option<(String, u64)>,
}

impl Spender {
    pub(super) fn of(r: &SandboxRecord) -> Self {
        Self {
            tenant: r.tenant.clone(),
            key: r.created_by.clone(),
            sandbox: r.max_cost_micros.map(|m| (r.id.to_string(), m)),
        }
    }
}

impl Manager {
    fn budget_unit(&self) -> BudgetUnit {
        BudgetUnit::of(self.cfg.rate_card.as_ref())
    }

    /// What `sum` adds up to: from the cache, or summed from the store once.
    async fn spent_total(&self, sum: Sum<'_>) -> CoreResult<UsageTotals> {
        let mut spent = self.spend.lock().await;
        let (day, _) = day_and_month_start(now_ms());
        if spent.day != day {
            spent.day = day;
            spent.tenants.clear();
            spent.keys.clear();
        }
        let cached = match &sum {
            Sum::Tenant(t, from) => spent.tenants.get(&((*t).clone(), *from)),
            Sum::Key(k, from) => spent.keys.get(&((*k).clone(), *from)),
            Sum::Sandbox(id) => spent.sandboxes.get(*id),
        };
        if let Some(total) = cached {
            return Ok(*total);
        }
        let query = match &sum {
            Sum::Tenant(t, from) => UsageQuery::since(TenantScope::Only((*t).clone()), *from),
            Sum::Key(k, from) => UsageQuery {
                key_id: Some((*k).clone()),
                ..UsageQuery::since(TenantScope::All, *from)
            },
            Sum::Sandbox(id) => UsageQuery {
                resource: Some(id.to_string()),
                ..UsageQuery::since(TenantScope::All, i64::MIN)
            },
        };
        let total = self
            .store
            .usage_groups(&query)
            .await?
            .iter()
            .fold(UsageTotals::default(), |t, g| t.plus(&g.usage));
        match sum {
            Sum::Tenant(t, from) => {
                spent.tenants.insert((t.clone(), from), total);
            }
            Sum::Key(k, from) => {
                spent.keys.insert((k.clone(), from), total);
            }
            Sum::Sandbox(id) => {
                if spent.sandboxes.len() >= MAX_CACHED_SANDBOXES {
                    spent.sandboxes.clear();
                }
                spent.sandboxes.insert(id.to_string(), total);
            }
        }
        Ok(total)
    }

    async fn spent(&self, sum: Sum<'_>) -> CoreResult<u64> {
        Ok(self.budget_unit().spent(&self.spent_total(sum).await?))
    }

    /// The first cap `spender` has reached, if any.
    pub(super) async fn budget_reached(
        &self,
        spender: &Spender,
    ) -> CoreResult<Option<QuotaExceeded>> {
        let unit = self.budget_unit();
        let (day, month) = day_and_month_start(now_ms());
        let refuse = |owner: &Tenant,
                      quota: QuotaName,
                      limit: u64,
                      used: u64,
                      whose: String,
                      fix: String| {
            QuotaExceeded {
                tenant: owner.clone(),
                quota,
                limit: Amount::Count(limit),
                used: Some(Amount::Count(used)),
                message: format!(
                    "{} of {whose} reached: {used} of {limit} {} spent; {fix}",
                    quota.as_str(),
                    unit.name()
                ),
            }
        };
        if let Some(tenant) = &spender.tenant {
            if let Some(t) = self.store.get_tenant(tenant).await? {
                let q = &t.settings.quotas;
                for (quota, limit, from) in [
                    (QuotaName::DailyBudget, q.daily_budget, day),
                    (QuotaName::MonthlyBudget, q.monthly_budget, month),
                ] {
                    let Some(limit) = limit else { continue };
                    let used = self.spent(Sum::Tenant(tenant, from)).await?;
                    if used >= limit {
                        return Ok(Some(refuse(
                            tenant,
                            quota,
                            limit,
                            used,
                            format!("tenant {tenant}"),
                            format!("ask an admin to raise it (PATCH /v1/tenants/{tenant})"),
                        )));
                    }
                }
            }
        }
        if let Some(key_id) = &spender.key {
            if let Some(k) = self.store.get_key(key_id).await? {
                for (quota, limit, from) in [
                    (QuotaName::DailyBudget, k.budget.daily_budget, day),
                    (QuotaName::MonthlyBudget, k.budget.monthly_budget, month),
                ] {
                    let Some(limit) = limit else { continue };
                    let used = self.spent(Sum::Key(key_id, from)).await?;
                    if used >= limit {
                        return Ok(Some(refuse(
                            &k.tenant,
                            quota,
                            limit,
                            used,
                            format!("key {key_id}"),
                            format!("raise it (PATCH /v1/keys/{key_id})"),
                        )));
                    }
                }
            }
        }
        if let (Some((id, limit)), Some(card)) = (&spender.sandbox, self.cfg.rate_card.as_ref()) {
            let used = card.cost_micros(&self.spent_total(Sum::Sandbox(id)).await?);
            if used >= *limit {
                let owner = spender
                    .tenant
                    .clone()
                    .unwrap_or_else(|| Tenant::new(ADMIN_TENANT));
                return Ok(Some(QuotaExceeded {
                    tenant: owner,
                    quota: QuotaName::MaxCostMicros,
                    limit: Amount::Count(*limit),
                    used: Some(Amount::Count(used)),
                    message: format!(
                        "max_cost_micros of sandbox {id} reached: it cost {used} of {limit} micros; it stays hibernated with everything it kept (delete it, or snapshot it and start another)"
                    ),
                }));
            }
        }
        Ok(None)
    }

    /// `QuotaExceeded` (429) when `spender` has reached a cap: checked before a create,
    /// wake or resume.
    pub(super) async fn check_budgets(&self, spender: &Spender) -> CoreResult<()> {
        match self.budget_reached(spender).await? {
            Some(q) => Err(q.into()),
            None => Ok(()),
        }
    }

    /// Hibernate (or pause) every running sandbox whose tenant, key or own cap is reached.
    pub(super) async fn enforce_budgets(self: &Arc<Self>) {
        let query = SandboxQuery {
            scope: TenantScope::All,
            state: Some(SandboxState::Running),
            metadata: Default::default(),
        };
        let Ok(running) = self
            .store
            .list_sandboxes(&query, &PageRequest::default())
            .await
        else {
            return;
        };
        // One check per distinct spender (a tenant's hundred sandboxes cost one query).
        let mut verdicts: std::collections::HashMap<
            (Option<Tenant>, Option<KeyId>),
            Option<QuotaExceeded>,
        > = Default::default();
        for r in running.items {
            let shared = (r.tenant.clone(), r.created_by.clone());
            let reached = match verdicts.get(&shared) {
                Some(v) => v.clone(),
                None => {
                    let v = self
                        .budget_reached(&Spender {
                            sandbox: None,
                            ..Spender::of(&r)
                        })
                        .await
                        .unwrap_or(None);
                    verdicts.insert(shared, v.clone());
                    v
                }
            };
            let reached = match reached {
                Some(q) => Some(q),
                None if r.max_cost_micros.is_some() => {
                    self.budget_reached(&Spender::of(&r)).await.unwrap_or(None)
                }
                None => None,
            };
            if let Some(q) = reached {
                self.stop_for_budget(&r, q).await;
            }
        }
    }

    async fn stop_for_budget(self: &Arc<Self>, r: &SandboxRecord, q: QuotaExceeded) {
        let _op = self.op_lock(&r.id).await;
        let Ok(fresh) = self.load(&r.id).await else {
            return;
        };
        if fresh.state != SandboxState::Running {
            return;
        }
        let why = format!("{} reached", q.quota.as_str());
        tracing::info!(id = %r.id, reason = %q.message, "spending cap: stopping the sandbox");
        let result = match self.cfg.budget_action {
            BudgetAction::Hibernate => self.hibernate_locked(fresh, Some(why)).await.map(|_| ()),
            BudgetAction::Pause => self.pause_locked(fresh, Some(why)).await,
        };
        if let Err(e) = result {
            tracing::error!(id = %r.id, error = %e, "stopping a sandbox over its spending cap");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::ResourceKind;

    fn interval(
        tenant: &str,
        key: Option<&str>,
        resource: &str,
        end_ms: i64,
        cpu: f64,
    ) -> UsageInterval {
        UsageInterval {
            kind: ResourceKind::Sandbox,
            resource: resource.into(),
            tenant: Some(Tenant::new(tenant)),
            key_id: key.map(|k| k.parse().expect("key id")),
            start_ms: end_ms - 1,
            end_ms,
            usage: UsageTotals {
                cpu_seconds: cpu,
                ..UsageTotals::default()
            },
        }
    }

    #[test]
    fn written_intervals_count_in_the_windows_and_spenders_they_belong_to() {
        let key: KeyId = "key_00000000000000000001".parse().expect("key id");
        let acme = Tenant::new("acme");
        let mut spent = Spent::default();
        spent
            .tenants
            .insert((acme.clone(), 100), UsageTotals::default());
        spent
            .tenants
            .insert((acme.clone(), 0), UsageTotals::default());
        spent
            .keys
            .insert((key.clone(), 100), UsageTotals::default());
        spent
            .sandboxes
            .insert("sbx_a".into(), UsageTotals::default());
        spent.add(&[
            interval("acme", Some(key.as_str()), "sbx_a", 50, 1.0),
            interval("acme", Some(key.as_str()), "sbx_b", 150, 2.0),
            interval("other", None, "sbx_c", 150, 4.0),
        ]);
        let cpu = |t: &UsageTotals| t.cpu_seconds;
        assert_eq!(
            cpu(&spent.tenants[&(acme.clone(), 100)]),
            2.0,
            "the day: after 100"
        );
        assert_eq!(cpu(&spent.tenants[&(acme, 0)]), 3.0, "the month: both");
        assert_eq!(cpu(&spent.keys[&(key, 100)]), 2.0);
        assert_eq!(
            cpu(&spent.sandboxes["sbx_a"]),
            1.0,
            "a sandbox's whole life"
        );
    }
}
